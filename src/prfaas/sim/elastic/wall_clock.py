"""``in_modelled_seconds``: an elastic scenario whose seconds are a live emulated deployment's
wall seconds, restated in modelled seconds.

``prfaas up`` of a file with ``autoscale:`` runs the autoscaler's loop on the wall clock: its
``tick_s``, rate window, cooldowns, TTFT target and the groups' ``startup_s`` are wall seconds.
An emulated (``timed``) engine runs modelled time ``time_scale`` wall seconds per modelled second,
so the same run, simulated, has every one of those durations divided by ``time_scale`` and every
per-second rate (the prior prefill speed) multiplied by it; arrivals recorded on the wall clock
are divided the same way by the caller. At ``time_scale`` 1 (a real engine) nothing changes.
``prfaas sim FILE`` does not apply this: it reads the file's seconds as modelled seconds (a real
pool's 180 s start-up), which is what they are for any engine but an emulated one.
Pure: no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import replace

from prfaas.sim.elastic.config import ElasticScenario, GroupConfig, PreemptionConfig


def in_modelled_seconds(sc: ElasticScenario, wall_s_per_modelled_s: float) -> ElasticScenario:
    if not wall_s_per_modelled_s > 0:
        raise ValueError(f"wall_s_per_modelled_s must be > 0, got {wall_s_per_modelled_s}")
    k = wall_s_per_modelled_s

    def group(g: GroupConfig) -> GroupConfig:
        p = g.preemption
        preemption = PreemptionConfig(
            None if p.mttp_s is None else p.mttp_s / k, p.trace, p.interval_s / k
        )
        return replace(g, startup_s=g.startup_s / k, notice_s=g.notice_s / k, preemption=preemption)

    auto = sc.autoscale
    if auto is not None:
        auto = replace(
            auto,
            ttft_target_s=auto.ttft_target_s / k,
            startup_s=auto.startup_s / k,
            up_cooldown_s=auto.up_cooldown_s / k,
            down_cooldown_s=auto.down_cooldown_s / k,
            down_stabilisation_s=auto.down_stabilisation_s / k,
            in_flight_timeout_s=auto.in_flight_timeout_s / k,
            season_s=None if auto.season_s is None else auto.season_s / k,
            history_bucket_s=auto.history_bucket_s / k,
            forecast_lead_s=auto.forecast_lead_s / k,
            prior_tokens_per_s=auto.prior_tokens_per_s * k,
        )
    return replace(
        sc,
        groups=tuple(group(g) for g in sc.groups),
        autoscale=auto,
        ttft_slo_s=sc.ttft_slo_s / k,
        tick_s=sc.tick_s / k,
        rate_window_s=sc.rate_window_s / k,
    )
