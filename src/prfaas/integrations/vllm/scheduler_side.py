"""``SchedulerSide``: the connector's bookkeeping in vLLM's EngineCore (scheduler) process.

- Prefill requests (``do_remote_decode`` + ``prfaas``): which tokens each scheduled step
  completes and where they sit (per-group block ids, grown between steps), as ``SendStep``s in
  the step's ``PrfaasMetadata``; with linear layers the prompt is cut by its last token when the
  request arrives (the decode side recomputes it from the states before it).
- Decode requests (``do_remote_prefill`` + ``prfaas``): every prompt token past the local prefix
  hit is reported external and loaded asynchronously; once vLLM allocated the blocks the load
  goes to the worker as a ``LoadJob`` (also when preparing it failed: a parked request must be
  reported, never left waiting).
- ``request_finished``: never holds vLLM's blocks (the worker copied the KV out at save time);
  a prefill that ended before its prompt was complete aborts its session.
Every hook runs in vLLM's EngineCore loop, where an exception kills the server: each catches
everything, logs it, and leaves that request plain (or failed). Imports no torch, and vllm only
for types.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from prfaas.integrations.vllm.faults import inject
from prfaas.integrations.vllm.metadata import LoadJob, PrfaasMetadata, SendStep
from prfaas.integrations.vllm.settings import SendParams, SettingsError, load_params, send_params
from prfaas.integrations.vllm.trace import TRACE

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("prfaas.integrations.vllm")
P = TypeVar("P")


def _safe(parse: Callable[[Any], P], params: Any, req_id: str) -> P | None:
    """A malformed ``prfaas`` entry makes the request a plain one (and says so), never an
    exception inside vLLM's scheduler loop."""
    try:
        return parse(params)
    except SettingsError as exc:
        log.warning("request %s: ignoring kv_transfer_params: %s", req_id, exc)
    except Exception:  # a parser bug: still a plain request, not a dead EngineCore
        log.exception("request %s: ignoring kv_transfer_params (parser fault)", req_id)
    return None


@dataclass(slots=True)
class _SendState:
    params: SendParams
    prompt_len: int
    block_ids: list[list[int]] = field(default_factory=list)
    sent_upto: int = 0
    opened: bool = False
    done: bool = False


class SchedulerSide:
    """The scheduler-side hooks of ``PrfaasConnector`` (same names, same answers)."""

    def __init__(self, single_group: bool, backoff: int) -> None:
        self._single_group = single_group
        self._backoff = backoff
        """Prompt tokens a prefill request leaves out (``CacheGroups.backoff``)."""
        self._send_reqs: dict[str, _SendState] = {}
        self._loading: dict[str, str] = {}  # req id -> transfer id, until finished receiving
        self._new_loads: list[LoadJob] = []
        self._abort_sends: list[tuple[str, str]] = []
        self._cancel_loads: list[str] = []

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        try:
            params = _safe(load_params, request.kv_transfer_params, request.request_id)
            if params is None or request.request_id in self._loading:
                return 0, False
            inject("match", params.transfer_id)
            count = request.num_prompt_tokens - self._backoff - num_computed_tokens
            return (count, True) if count > 0 else (0, False)
        except Exception:
            log.exception("request %s: not loaded remotely (connector fault)", request.request_id)
            return 0, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        sp = _safe(send_params, request.kv_transfer_params, rid)
        if sp is not None:
            if rid not in self._send_reqs:
                try:
                    inject("alloc", sp.transfer_id)
                    skip = min(sp.skip_tokens, request.num_prompt_tokens - 1)
                    st = _SendState(sp, request.num_prompt_tokens, sent_upto=skip)
                    self._send_reqs[rid] = st
                except Exception as exc:
                    log.exception("request %s: not sent (connector fault)", rid)
                    self._abort_sends.append((sp.transfer_id, f"connector fault: {exc!r}"))
            return
        lp = _safe(load_params, request.kv_transfer_params, rid)
        if lp is None or num_external_tokens <= 0 or rid in self._loading:
            return
        # vLLM now parks the request until the worker reports it: whatever fails from here on
        # must still reach the worker as a (failed) load, else the request waits forever.
        covered = request.num_prompt_tokens - self._backoff
        block_ids: tuple[tuple[int, ...], ...] = ()
        error = ""
        try:
            inject("alloc", lp.transfer_id)
            block_ids = tuple(tuple(ids) for ids in blocks.get_block_ids())
        except Exception as exc:
            log.exception("request %s: KV load not prepared (connector fault)", rid)
            error = f"connector fault: {type(exc).__name__}: {exc}"
        self._new_loads.append(
            LoadJob(
                req_id=rid,
                params=lp,
                prompt_len=covered,
                start=covered - num_external_tokens,
                block_ids=block_ids,
                single_group=self._single_group,
                error=error,
            )
        )
        self._loading[rid] = lp.transfer_id
        # One load per request: after a failed load vLLM asks again (from 0 computed tokens);
        # the answer must then be "recompute", not another wait for the same session.
        with contextlib.suppress(TypeError):
            request.kv_transfer_params["do_remote_prefill"] = False  # type: ignore[index]

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> PrfaasMetadata:
        meta = PrfaasMetadata(
            loads=self._new_loads,
            abort_sends=self._abort_sends,
            cancel_loads=self._cancel_loads,
        )
        self._new_loads, self._abort_sends, self._cancel_loads = [], [], []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._send_reqs.get(new.req_id)
            if st is not None:
                try:
                    st.block_ids = [list(ids) for ids in new.block_ids]
                    self._step(meta, new.req_id, st, new.num_computed_tokens, scheduled[new.req_id])
                except Exception as exc:
                    self._drop_send(meta, new.req_id, st, exc)
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self._send_reqs.get(rid)
            if st is None:
                continue
            try:
                new_ids = cached.new_block_ids[i]
                if rid in cached.resumed_req_ids:  # after preemption: the whole block list anew
                    st.block_ids = [list(ids) for ids in new_ids] if new_ids else []
                elif new_ids:
                    if not st.block_ids:
                        st.block_ids = [[] for _ in new_ids]
                    for mine, more in zip(st.block_ids, new_ids, strict=True):
                        mine.extend(more)
                self._step(meta, rid, st, cached.num_computed_tokens[i], scheduled.get(rid, 0))
            except Exception as exc:
                self._drop_send(meta, rid, st, exc)
        return meta

    @staticmethod
    def _drop_send(meta: PrfaasMetadata, rid: str, st: _SendState, exc: Exception) -> None:
        """A fault while planning a send: its session fails, the request is computed as usual."""
        log.error("request %s: KV send dropped (connector fault): %r", rid, exc, exc_info=True)
        meta.sends[:] = [s for s in meta.sends if s.req_id != rid]
        meta.abort_sends.append((st.params.transfer_id, f"connector fault: {exc!r}"))
        st.done = True

    @staticmethod
    def _step(
        meta: PrfaasMetadata, rid: str, st: _SendState, num_computed: int, num_scheduled: int
    ) -> None:
        if st.done:
            return
        inject("meta", st.params.transfer_id)
        end = min(num_computed + num_scheduled, st.prompt_len)
        # Tokens the local prefix cache held are in the blocks already: send them with the first
        # step (start is where we left off, not where this step's computation starts).
        start = min(st.sent_upto, end)
        last = end >= st.prompt_len
        meta.sends.append(
            SendStep(
                rid,
                st.params,
                st.prompt_len,
                tuple(tuple(ids) for ids in st.block_ids),
                start,
                end,
                not st.opened,
                last,
            )
        )
        st.opened, st.sent_upto, st.done = True, max(st.sent_upto, end), last

    def on_new_request(self, request: Request) -> None:
        """A prefill request of a model with linear layers computes all but its last prompt
        token (as vLLM's NixlConnector does): the decode side recomputes that token, and needs
        the states as they were before it."""
        params = request.kv_transfer_params
        if not self._backoff or not isinstance(params, dict) or params.get("_prfaas_cut"):
            return
        if _safe(send_params, params, request.request_id) is None:
            return
        if request.num_prompt_tokens <= self._backoff or request.prompt_token_ids is None:
            return  # nothing would cross: the session is never opened and the sidecar fails it
        try:
            del request.prompt_token_ids[-self._backoff :]
            del request._all_token_ids[-self._backoff :]
            request.num_prompt_tokens -= self._backoff
            request.max_tokens = 1
            params["_prfaas_cut"] = True  # once, also after a preemption
        except Exception:  # vLLM's Request changed shape: say so, the request runs as it is
            log.exception("request %s: prompt not cut for the state hand-off", request.request_id)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        with contextlib.suppress(Exception):  # a bookkeeping slip must not kill EngineCore
            for rid in connector_output.finished_recving or ():
                self._loading.pop(rid, None)

    def request_finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        st = self._send_reqs.pop(rid, None)
        try:
            if rid in self._loading:  # aborted while its KV was awaited: the worker lets it go
                self._cancel_loads.append(rid)
            if st is None:
                return False, None
            inject("finished", st.params.transfer_id)
            if not st.done:
                if st.opened:
                    why = "the prefill request ended before its prompt was complete"
                    self._abort_sends.append((st.params.transfer_id, why))
                return False, None
            # The KV was copied out at save time: vLLM may free the blocks now.
            TRACE("request_finished", st.params.transfer_id)
            return False, {"prfaas": {"transfer_id": st.params.transfer_id}}
        except Exception:  # never hold vLLM's blocks, never raise into EngineCore
            log.exception("request %s: request_finished failed in the connector", rid)
            return False, None
