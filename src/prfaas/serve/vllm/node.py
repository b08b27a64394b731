"""``VllmNode``: one node of a vLLM sidecar, doing what the gateway asks through the process's
vLLM server (``POST /v1/completions``, token ids in and out, ``kv_transfer_params``) and the
connector's agent socket.

Prefill: a decode node of the same sidecar shares the server, so the prefill is answered at once
(the decode request prefills itself: co-located). Otherwise the server prefills with
``do_remote_decode`` (its connector streams the KV layer by layer to the decode node's receiver),
then the agent says whether the decode side verified the whole session: ``ok`` only then.
Decode: "ready" at once, then one streaming request (``do_remote_prefill`` unless the prefill node
shares this server), its token ids relayed as ``DecodeEvent`` lines. Aborts cancel the HTTP call
(vLLM aborts a request whose client goes) and drop the transfer at the agent. Any failure is the
request's alone and comes back as ``ok=False`` or an error event. Must not import vllm.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, Literal

import httpx

from prfaas.core import NodeRole
from prfaas.serve.http_lines import aiter_lines
from prfaas.serve.node.messages import (
    DecodeCommand,
    DecodeEvent,
    PrefillCommand,
    PrefillOutcome,
    SamplingMsg,
    unpack_tokens,
)
from prfaas.serve.node.prefill_meter import PrefillMeter
from prfaas.serve.vllm.agent import AgentClient, AgentError

log = logging.getLogger("prfaas.vllm")
READ_MARGIN_S = 30.0
"""On top of a decode's KV deadline: when no KV comes the connector gives up at the deadline and
vLLM recomputes the prompt; the first token comes after that, and must still be waited for."""


class VllmEndpoint:
    """How the nodes reach their server (shared by all nodes of a sidecar)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        client: httpx.AsyncClient,
        fault: Callable[[], str],
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.client = client
        self.fault = fault
        """Why the server cannot serve now ("" when it can)."""
        self.cached_tokens: Callable[[Sequence[int], int], int] = lambda hashes, n: 0
        """The prefix of a prompt (its block hashes, its length) the server's cache holds, per
        its KV cache events (``serve/vllm/kv_events.py``; 0 without them)."""
        self.seeded_sampling = True
        """Whether a sampled request may carry its seed to the server: not to vLLM's CPU build,
        whose engine dies on a seeded sampled prompt prefilled in several chunks (its CPU
        generator has no offset to rewind: docs/vllm.md "Seeds"), taking every request it holds
        with it. There the seed is dropped, as OpenAI's ``seed`` allows (best effort)."""


def sampling_body(s: SamplingMsg, seeded_sampling: bool = True) -> dict[str, Any]:
    """The client's sampling parameters in vLLM's completion fields; a sampled request's seed
    left out where ``seeded_sampling`` is off (``VllmEndpoint.seeded_sampling``). Greedy ones
    keep it: nothing is drawn from their generator."""
    drop_seed = not seeded_sampling and s.temperature > 0
    return {
        "max_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "seed": None if drop_seed else s.seed,
        "stop_token_ids": s.stop_token_ids,
        "ignore_eos": s.ignore_eos,
        "min_tokens": s.min_tokens,
        "repetition_penalty": s.repetition_penalty,
    }


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class VllmNode:
    def __init__(
        self,
        name: str,
        site: str,
        role: NodeRole | str,
        server: VllmEndpoint,
        agent: AgentClient,
        shares_server: Callable[[str], bool],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        transfer_timeout_s: float,
        fixed_role: bool = False,
    ) -> None:
        self.name = name
        self.site = site
        self.role = NodeRole(role)
        self.draining = False
        self._fixed_role = fixed_role
        self.server = server
        self.agent = agent
        self.shares_server = shares_server
        """Whether a node of that name is one of this sidecar's (same server)."""
        self._spawn = spawn
        self.transfer_timeout_s = transfer_timeout_s
        self._prefilling: dict[str, int] = {}
        self.meter = PrefillMeter()
        """Uncached tokens prefilled and seconds with a prefill at its server (from the request
        to the answer: vLLM's own queue included, so overlapping ones count once)."""
        """Requests prefilling here -> their prompt tokens."""
        self._decoding: set[str] = set()

    @property
    def fixed_role(self) -> bool:
        return self._fixed_role

    @property
    def idle(self) -> bool:
        return not self._prefilling and not self._decoding

    @property
    def queued_tokens(self) -> int:
        return sum(self._prefilling.values())

    def expects(self, request_id: str) -> bool:
        return request_id in self._decoding

    @property
    def _url(self) -> str:
        return f"{self.server.base_url}/v1/completions"

    def _abort_transfer(self, transfer_id: str) -> None:
        """Drop the transfer at the agent, in the background (an abort must not wait)."""

        async def abort() -> None:
            try:
                await self.agent.abort(transfer_id)
            except AgentError as exc:
                log.debug("agent abort of %s: %s", transfer_id, exc)

        self._spawn(abort())

    # -- prefill ---------------------------------------------------------------------------------
    async def prefill(self, cmd: PrefillCommand) -> PrefillOutcome:
        rid = cmd.request_id
        if self.shares_server(cmd.decode_node):
            # The decode node's request prefills in this very server: nothing to do here. Its
            # hit is what the server's cache holds now (vLLM's answer comes to the decode side
            # only): without it the gateway booked every co-located prefill as a miss.
            held = self.server.cached_tokens(cmd.block_hashes, len(unpack_tokens(cmd.tokens)))
            return PrefillOutcome(request_id=rid, ok=True, num_cached_tokens=held)
        if fault := self.server.fault():
            return PrefillOutcome(request_id=rid, ok=False, error=f"node {self.name}: {fault}")
        token_ids = unpack_tokens(cmd.tokens)
        self._prefilling[rid] = len(token_ids)
        t0 = time.monotonic()
        self.meter.started(t0)
        outcome: PrefillOutcome | None = None
        try:
            outcome = await self._prefill(cmd, list(token_ids), t0)
            return outcome
        except asyncio.CancelledError:
            self._abort_transfer(rid)
            raise
        except (httpx.HTTPError, AgentError, ValueError, KeyError, IndexError, TypeError) as exc:
            self._abort_transfer(rid)
            return PrefillOutcome(request_id=rid, ok=False, error=f"vLLM prefill: {_reason(exc)}")
        finally:
            self._prefilling.pop(rid, None)
            ok = outcome is not None and outcome.ok
            uncached = len(token_ids) - outcome.num_cached_tokens if outcome and ok else 0
            self.meter.ended(time.monotonic(), max(0, uncached))

    async def _prefill(
        self, cmd: PrefillCommand, token_ids: list[int], t0: float
    ) -> PrefillOutcome:
        rid = cmd.request_id
        body = {
            "model": self.server.model,
            "prompt": token_ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": False,
            "return_token_ids": True,
            "kv_transfer_params": {
                "do_remote_decode": True,
                "prfaas": {
                    "transfer_id": rid,
                    "host": cmd.decode_host,
                    "port": cmd.decode_transfer_port,
                    "cross_site": cmd.cross_site,
                    "skip_tokens": min(cmd.receiver_cached_tokens, max(len(token_ids) - 1, 0)),
                },
            },
        }
        r = await self.server.client.post(self._url, json=body, timeout=self.transfer_timeout_s)
        if r.status_code != 200:
            return PrefillOutcome(
                request_id=rid, ok=False, error=f"vLLM answered {r.status_code}: {r.text[:300]}"
            )
        answer = r.json()
        choice = answer["choices"][0]
        generated = choice.get("token_ids") or []
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
        sent = await self.agent.wait_sent(rid, self.transfer_timeout_s)
        if sent.state != "verified":
            why = sent.error or "no verified session"
            return PrefillOutcome(
                request_id=rid, ok=False, error=f"KV transfer {sent.state}: {why}"
            )
        # (The cross-site bytes a node reports are its server's, from the agent: VllmHost.)
        return PrefillOutcome(
            request_id=rid,
            ok=True,
            first_token=int(generated[0]) if generated else -1,
            num_cached_tokens=cached,
            kv_bytes_sent=sent.kv_bytes,
            prefill_s=time.monotonic() - t0,
        )

    # -- decode ----------------------------------------------------------------------------------
    async def decode(self, cmd: DecodeCommand) -> AsyncIterator[DecodeEvent]:
        rid = cmd.request_id
        if rid in self._decoding:
            raise ValueError(f"request {rid} is already expected at {self.name}")
        if not cmd.prompt_tokens:
            yield DecodeEvent(kind="error", error="a vLLM decode node needs prompt_tokens")
            return
        if fault := self.server.fault():
            yield DecodeEvent(kind="error", error=f"node {self.name}: {fault}")
            return
        local = self.shares_server(cmd.prefill_node)
        body: dict[str, Any] = {
            "model": self.server.model,
            "prompt": list(unpack_tokens(cmd.prompt_tokens)),
            "stream": True,
            "return_token_ids": True,
            **sampling_body(cmd.sampling, self.server.seeded_sampling),
        }
        if not local:
            body["kv_transfer_params"] = {
                "do_remote_prefill": True,
                "prfaas": {"transfer_id": rid, "timeout_s": cmd.timeout_s},
            }
        self._decoding.add(rid)
        finished = False
        try:
            # What this server's prefix cache holds of the prompt (its KV cache events): the
            # prefill skips sending it. Should vLLM evict it before the request is scheduled,
            # the connector finds the session does not fit (it starts past the local hit) and
            # vLLM recomputes; a longer local hit only installs less.
            held = self.server.cached_tokens(cmd.block_hashes, cmd.num_prompt_tokens)
            yield DecodeEvent(kind="ready", prefix_tokens=held)
            async for event in self._stream(body, cmd.timeout_s):
                if event.finish_reason is not None and not local:
                    event = await self._with_load_result(rid, event)
                yield event
                if event.kind == "error" or event.finish_reason is not None:
                    finished = event.kind != "error"
                    return
            yield DecodeEvent(kind="error", error="vLLM ended the stream without finishing")
        finally:
            self._decoding.discard(rid)
            if not finished and not local:
                self._abort_transfer(rid)

    async def _with_load_result(self, rid: str, event: DecodeEvent) -> DecodeEvent:
        """The finishing event, marked ``kv_recomputed`` when the server's connector could not
        install the KV sent for ``rid`` and vLLM recomputed the prompt (the agent knows per
        request: its ``load_result``). An agent that cannot say leaves the event as it is."""
        try:
            state = await self.agent.load_result(rid)
        except (AgentError, OSError, TimeoutError) as exc:
            log.warning("request %s: the agent could not say how its KV load went: %s", rid, exc)
            return event
        if state != "recomputed":
            return event
        log.warning("request %s: decoded by recomputing the prompt (the KV load failed)", rid)
        return event.model_copy(update={"kv_recomputed": True})

    async def _stream(self, body: dict[str, Any], timeout_s: float) -> AsyncIterator[DecodeEvent]:
        """The streaming completion as decode events (the stop token itself is dropped: a client
        gets the text before it, as from the other engines)."""
        timeout = httpx.Timeout(timeout_s + READ_MARGIN_S, connect=5.0)
        try:
            async with self.server.client.stream(
                "POST", self._url, json=body, timeout=timeout
            ) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    yield DecodeEvent(
                        kind="error", error=f"vLLM answered {r.status_code}: {text[:300]}"
                    )
                    return
                async for line in aiter_lines(r):  # on \n only: U+2028 may be in a token
                    event = _event_of(line)
                    if event is not None:
                        yield event
        except httpx.HTTPError as exc:
            yield DecodeEvent(kind="error", error=f"vLLM decode: {_reason(exc)}")


def _event_of(line: str) -> DecodeEvent | None:
    """One SSE line of vLLM's stream; None for blank lines, ``[DONE]`` and chunks without a
    choice (a usage chunk)."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if data == "[DONE]" or not data:
        return None
    try:
        chunk = json.loads(data)
    except ValueError:
        return DecodeEvent(kind="error", error=f"vLLM sent a line that is not JSON: {data[:100]}")
    if "error" in chunk and not chunk.get("choices"):
        return DecodeEvent(kind="error", error=f"vLLM: {str(chunk['error'])[:300]}")
    choices = chunk.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    tokens = [int(t) for t in choice.get("token_ids") or []]
    finish = choice.get("finish_reason")
    reason: Literal["stop", "length"] | None = None
    if finish == "stop":
        reason = "stop"
        if tokens:
            tokens.pop()  # EOS or a stop token id (stop strings are the gateway's)
    elif finish == "length":
        reason = "length"
    elif finish is not None:  # "abort", "error": vLLM gave up on the request
        return DecodeEvent(kind="error", error=f"vLLM finished the request: {finish}")
    return DecodeEvent(kind="tokens", token_ids=tokens, finish_reason=reason)
