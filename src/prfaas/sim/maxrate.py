"""``find_max_rate``: the deployment's CAPACITY as the simulator measures it: the highest constant
open-loop arrival rate at which no stage's backlog grows and the decode SLO holds (the one
definition ``prfaas plan``, ``prfaas sim --find-max-rate`` and ``prfaas bench --find-max-rate``
share; docs/simulation.md "Capacity"). Not the drain rate of an all-at-once burst ("burst
throughput"), which is another figure.

Stopping rule (fixed; tests depend on it):
1. One trial at rate ``r`` replays ``num_requests`` requests arriving over ``D = num_requests / r``
   seconds with the scenario's arrival process (the paper's check uses uniform arrivals and
   stratified lengths: the same length sequence at every rate, see analytic/lengths.py). With a
   trace, the trace's own requests (at most ``num_requests``) with their arrival times rescaled
   so that their mean rate is ``r`` (``rate_scale = r / the trace's own rate``).
2. At ``D`` (the last arrival) the run stops and every stage is probed. The trial *passes* when
   - each prefill pool's backlog (work still queued or in service, in seconds of the pool:
     sum over nodes of ``max(0, free_at - D)`` over the pool's node count),
   - each decode pool's backlog (requests whose KV has arrived but that wait for a slot, times one
     decode of the mean output, over the pool's slots), and
   - each inter-site link's backlog (bytes not yet delivered over its capacity at ``D``),
   - each gateway's backlog (its CPU's routing and relay work booked and not yet done,
     ``sim.plumbing.GatewayCpu``; only where the profiles charge gateway terms)
   are all at most ``backlog_fraction x D`` (completions keep pace with arrivals: an overloaded
   stage accumulates ``(rho - 1) x D`` of backlog), the decode per-token SLO held for every finished
   request, and, when ``ttft_p99_s`` is given, the TTFT P99 of finished requests meets it.
   Requests in flight also count, pool by pool, at ``D / 2`` and at ``D`` (a prefill pool's queued
   and in service, a decode pool's batch and waiting): their growth, in seconds of arrivals
   (``growth / r``), must also stay within ``backlog_fraction x D``. On cores shared by a site's
   nodes (``engine.cpus``) the work probe above misses an overload: a prefill node's ``free_at``
   adds service at its own speed, and a slowed decode node keeps every request in a batch below
   ``BS_max`` while the batch grows; the counts see both.
3. Bracket: from ``start_rps`` (e.g. the planner's ``lambda_max``) double up / halve down until one
   rate passes and one fails; then bisect until ``hi / lo <= 1 + rel_tol``. The answer is ``lo``,
   the highest rate that passed. Every trial uses the same seed.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from prfaas.core.topology import NodeRole
from prfaas.sim.nodes import DecodeNode, PrefillNode
from prfaas.sim.scenario import SimScenario
from prfaas.sim.simulator import Simulator
from prfaas.workload.arrivals import ArrivalSpec


@dataclass(frozen=True, slots=True)
class MaxRateRule:
    num_requests: int = 20000
    backlog_fraction: float = 0.0025
    rel_tol: float = 0.0025
    ttft_p99_s: float | None = None
    max_trials: int = 40


@dataclass(frozen=True, slots=True)
class Trial:
    rate_rps: float
    passed: bool
    worst_stage: str
    worst_backlog_s: float
    horizon_s: float


@dataclass(frozen=True, slots=True)
class MaxRateResult:
    max_rate_rps: float
    trials: tuple[Trial, ...]
    rule: MaxRateRule


@dataclass(frozen=True, slots=True)
class TraceRate:
    """A trace's own pace: ``num_requests`` (after ``trace_limit``) over ``span_s``."""

    num_requests: int
    span_s: float

    @property
    def rate_rps(self) -> float:
        return (self.num_requests - 1) / self.span_s if self.span_s > 0 else float("inf")


def trace_rate(scenario: SimScenario, limit: int | None = None) -> TraceRate:
    """The trace's first ``limit`` requests (or ``trace_limit``) and their span."""
    from prfaas.workload import read_mooncake

    assert scenario.trace is not None
    cap = min(x for x in (limit, scenario.trace_limit, 1 << 62) if x is not None)
    n, first, last = 0, 0.0, 0.0
    for record in read_mooncake(scenario.trace, cap):
        first = record.arrival_s if n == 0 else first
        n, last = n + 1, record.arrival_s
    if n < 2 or last <= first:
        raise ValueError(f"trace {scenario.trace}: needs two requests at different times")
    return TraceRate(n, last - first)


def _in_flight(s: Simulator) -> dict[str, int]:
    """Requests in each pool: a prefill pool's queued and in service, a decode pool's in its
    batches and waiting for a slot."""
    w = s.world
    out: dict[str, int] = {}
    for site, role, nodes in w.pools:
        name = f"{role.value}:{w.site_ids[site]}"
        if role is NodeRole.DECODE:
            dec = [n for n in nodes if isinstance(n, DecodeNode)]
            out[name] = sum(len(n.members) + len(n.waiting) for n in dec)
        else:
            pre = [n for n in nodes if isinstance(n, PrefillNode)]
            out[name] = sum(len(n.queue) + n.busy for n in pre)
    return out


def trial(
    scenario: SimScenario, rate_rps: float, rule: MaxRateRule, trace: TraceRate | None = None
) -> Trial:
    if trace is not None:  # the trace's own requests, rescaled to arrive at ``rate_rps``
        scale = rate_rps / trace.rate_rps
        horizon = trace.span_s / scale + 1e-9
        sc = replace(scenario, rate_scale=scale, trace_limit=trace.num_requests,
                     duration_s=horizon, drain_s=0.0, timeseries=False)  # fmt: skip
    else:
        horizon = rule.num_requests / rate_rps
        sc = replace(
            scenario,
            arrival=replace(scenario.arrival, rate_rps=rate_rps),
            duration_s=horizon,
            drain_s=0.0,
            timeseries=False,
        )
    sim = Simulator(sc)
    probe: dict[str, float] = {}
    halfway: dict[str, int] = {}

    def measure_half(s: Simulator) -> None:
        halfway.update(_in_flight(s))

    def measure(s: Simulator) -> None:
        w = s.world
        now = w.now
        for site, role, nodes in w.pools:
            name = f"{role.value}:{w.site_ids[site]}"
            if role is NodeRole.PREFILL:
                pre = [n for n in nodes if isinstance(n, PrefillNode)]
                probe[name] = sum(max(0.0, n.free_at_s - now) for n in pre) / len(pre)
            else:
                dec = [n for n in nodes if isinstance(n, DecodeNode)]
                waiting = sum(len(n.waiting) for n in dec)
                slots = sum(n.max_batch for n in dec)
                one = dec[0].cm.decode_step_s(1, 1) * sc.output_tokens
                probe[name] = waiting * one / slots
        for site, gateway in s.gateways.items():
            probe[f"gateway:{w.site_ids[site]}"] = gateway.backlog_s(now)
        for link in w.links.values():
            if link.capacity > 0:
                probe[f"link:{link.link_id}"] = link.backlog_bytes(now) / link.capacity
        for name, count in _in_flight(s).items():
            growth_s = (count - halfway.get(name, 0)) / rate_rps
            probe[name] = max(probe.get(name, 0.0), growth_s)
        s.stop = True

    sim.schedule_probe(horizon / 2, measure_half)
    sim.schedule_probe(horizon, measure)
    m = sim.run(until_s=horizon)
    worst = max(probe.items(), key=lambda kv: kv[1]) if probe else ("none", 0.0)
    ok = worst[1] <= rule.backlog_fraction * horizon
    ok = ok and m.max_tpot_s <= sc.slo_tpot_s * (1 + 1e-9)
    if ok and rule.ttft_p99_s is not None and m.ttft_s:
        xs = sorted(m.ttft_s)
        ok = xs[min(len(xs) - 1, int(0.99 * len(xs)))] <= rule.ttft_p99_s
    return Trial(rate_rps, ok, worst[0], worst[1], horizon)


def find_max_rate(
    scenario: SimScenario, start_rps: float = 1.0, rule: MaxRateRule | None = None
) -> MaxRateResult:
    rule = rule or MaxRateRule()
    if not start_rps > 0:
        raise ValueError(f"start rate must be > 0, got {start_rps}")
    base = replace(scenario, arrival=replace(scenario.arrival, rate_rps=start_rps))
    pace = trace_rate(base, rule.num_requests) if base.trace is not None else None
    trials: list[Trial] = []

    def run(rate: float) -> bool:
        t = trial(base, rate, rule, pace)
        trials.append(t)
        return t.passed

    lo, hi = 0.0, 0.0
    rate = start_rps
    if run(rate):
        lo = rate
        while len(trials) < rule.max_trials:
            rate *= 1.05
            if not run(rate):
                hi = rate
                break
            lo = rate
    else:
        hi = rate
        while len(trials) < rule.max_trials:
            rate /= 1.05
            if run(rate):
                lo = rate
                break
            hi = rate
    while lo > 0 and hi > 0 and hi / lo > 1 + rule.rel_tol and len(trials) < rule.max_trials:
        mid = (lo * hi) ** 0.5
        if run(mid):
            lo = mid
        else:
            hi = mid
    return MaxRateResult(lo, tuple(trials), rule)


__all__ = [
    "ArrivalSpec", "MaxRateResult", "MaxRateRule", "TraceRate", "Trial", "find_max_rate",
    "trace_rate", "trial",
]  # fmt: skip
