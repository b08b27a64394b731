"""``find_max_rate``: the highest arrival rate a deployment sustains: the simulated ``Lambda_max``.

Stopping rule (fixed; tests depend on it):
1. One trial at rate ``r`` replays ``num_requests`` requests arriving over ``D = num_requests / r``
   seconds with the scenario's arrival process (the paper's check uses uniform arrivals and
   stratified lengths: the same length sequence at every rate, see workload/lengths.py).
2. At ``D`` (the last arrival) the run stops and every stage is probed. The trial *passes* when
   - each prefill pool's backlog (work still queued or in service, in seconds of the pool:
     sum over nodes of ``max(0, free_at - D)`` over the pool's node count),
   - each decode pool's backlog (requests whose KV has arrived but that wait for a slot, times one
     decode of the mean output, over the pool's slots), and
   - each inter-site link's backlog (bytes not yet delivered over its capacity at ``D``)
   are all at most ``backlog_fraction x D`` (completions keep pace with arrivals: an overloaded
   stage accumulates ``(rho - 1) x D`` of backlog), the decode per-token SLO held for every finished
   request, and, when ``ttft_p99_s`` is given, the TTFT P99 of finished requests meets it.
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


def trial(scenario: SimScenario, rate_rps: float, rule: MaxRateRule) -> Trial:
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
        for link in w.links.values():
            if link.capacity > 0:
                probe[f"link:{link.link_id}"] = link.backlog_bytes(now) / link.capacity
        s.stop = True

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
    if base.trace is not None:
        raise ValueError("--find-max-rate needs synthetic arrivals, not a trace")
    trials: list[Trial] = []

    def run(rate: float) -> bool:
        t = trial(base, rate, rule)
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


__all__ = ["ArrivalSpec", "MaxRateResult", "MaxRateRule", "Trial", "find_max_rate", "trial"]
