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
    assert any(not s.passed and "in flight grew" in s.why for s in steps)


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
