"""The bench's pure parts: workloads (deterministic, bounded, shared prefixes) and the summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prfaas.analytic import TruncatedLogNormal
from prfaas.serve.loadgen import BenchRequest, PromptSynth, RequestResult, summarize
from prfaas.serve.loadgen.workload import WORDS, synthetic_workload, trace_workload

pytestmark = pytest.mark.timeout(10)
LENGTHS = TruncatedLogNormal(5.0, 1.0, 16, 1000)


def make(**kw: object) -> list[BenchRequest]:
    args: dict[str, object] = {
        "rate_rps": 10.0, "arrival": "poisson", "lengths": LENGTHS, "num_output_tokens": 8,
        "num_requests": 50, "duration_s": None, "seed": 1,
    }  # fmt: skip
    args.update(kw)
    return synthetic_workload(**args)  # type: ignore[arg-type]


def test_synthetic_is_deterministic_and_bounded() -> None:
    a, b = make(), make()
    assert a == b and len(a) == 50
    assert a != make(seed=2)
    assert all(16 <= r.num_prompt_tokens <= 1000 for r in a)
    assert [r.arrival_s for r in a] == sorted(r.arrival_s for r in a)
    uniform = make(arrival="uniform", rate_rps=4.0, num_requests=None, duration_s=2.0)
    assert [r.arrival_s for r in uniform] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
    with pytest.raises(ValueError, match="duration"):
        make(num_requests=None)


def test_prompts_share_blocks_by_hash_and_are_exact_length() -> None:
    synth = PromptSynth(seed=3, vocab_size=100)
    r1 = BenchRequest(0, 0.0, 700, 4, (7, 8))
    r2 = BenchRequest(1, 0.0, 600, 4, (7, 9))
    p1, p2 = synth.token_ids(r1), synth.token_ids(r2)
    assert (len(p1), len(p2)) == (700, 600)
    assert p1[:512] == p2[:512] and p1[512:600] != p2[512:600]
    assert all(0 <= t < 100 for t in p1)
    assert synth.token_ids(r1) == p1  # deterministic
    unique = [synth.token_ids(BenchRequest(i, 0.0, 50, 1)) for i in range(2)]
    assert unique[0] != unique[1]
    text = PromptSynth(seed=3, prompt_format="text").prompt(r1)
    assert isinstance(text, str) and len(text.split()) == 700 and set(text.split()) <= set(WORDS)


def test_trace_reader_scales_and_names_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 1000 * i, "input_length": 10, "output_length": 2, "hash_ids": [i]}
        for i in range(5)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    reqs = trace_workload(
        path, rate_scale=2.0, num_requests=None, duration_s=1.6, num_output_tokens=None
    )
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 1.0, 1.5]
    assert reqs[1].block_hashes == (1,) and reqs[1].max_tokens == 2
    path.write_text(json.dumps(rows[0]) + '\n{"timestamp": 0}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:2"):
        trace_workload(
            path, rate_scale=1.0, num_requests=None, duration_s=None, num_output_tokens=None
        )


def test_summary_counts_and_percentiles() -> None:
    ok = [
        RequestResult(
            i, 100, True, None, 200, 0.0, 0.1 * (i + 1), 0.1 * (i + 1) + 0.4, 5, (0.1,) * 4
        )
        for i in range(10)
    ]
    bad = [
        RequestResult(10, 100, False, "http_429", 429, 0.0, None, None, 0, (), "overloaded"),
        RequestResult(11, 100, False, "timeout", None, 0.0, None, None, 0, ()),
    ]
    s = summarize(ok + bad, 2.0, {"url": "u", "model": "m"})
    assert (s["requests"], s["completed"], s["failed"], s["rejected_429"]) == (12, 10, 2, 1)
    assert s["failures"] == {"http_429": 1, "timeout": 1}
    assert s["throughput_rps"] == 5.0 and s["output_tokens_per_s"] == 25.0
    assert s["ttft_s"]["p50"] == pytest.approx(0.55) and s["ttft_s"]["max"] == pytest.approx(1.0)
    assert s["tpot_s"]["p90"] == pytest.approx(0.1) and s["itl_s"]["count"] == 40
    assert summarize([], 1.0, {})["ttft_s"]["p50"] is None


def _streamed(*chunks: dict[str, object]) -> list[RequestResult]:
    """``stream_completion`` against a server answering these SSE chunks, then [DONE]."""
    import asyncio

    import httpx

    from prfaas.serve.loadgen.client import stream_completion

    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def go() -> RequestResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            return await stream_completion(
                client, url="http://x/v1/completions", body={}, index=0, num_prompt_tokens=64,
                sent_s=0.0, timeout_s=5.0,
            )  # fmt: skip

    return [asyncio.run(go())]


def test_a_token_that_decodes_to_no_text_still_answers_the_request() -> None:
    """A sampled special token (ignore_eos on a tiny model: ids 0 and 1 decode to "") arrives
    in the finishing chunk with empty text: the request was answered, with its one token (the
    plumbing measurement failed a request "no_tokens" this way, 2026-12-06)."""
    (r,) = _streamed({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    assert r.ok and r.num_output_tokens == 1 and r.ttft_s is not None
    (r,) = _streamed(
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 64, "completion_tokens": 1}},
    )
    assert r.ok and r.num_output_tokens == 1
    # Text then an empty finishing chunk: the tokens are the text chunks, as before.
    (r,) = _streamed(
        {"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "b", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]},
    )
    assert r.ok and r.num_output_tokens == 2
    # A stream that finished nothing and carried no token is still a failure.
    (r,) = _streamed({"choices": [{"index": 0, "text": ""}]})
    assert not r.ok and r.reason == "no_tokens"
