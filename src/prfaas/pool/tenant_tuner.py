"""A live tenant gateway's coordinated tuner and router gate (issue 21, item 5; ``docs/pool.md``,
*The threshold coordination rule*): the pool simulator's tenant rule, run by a live gateway.

``TenantTuner`` (a tenant file's ``pool.tuner``: ``coordinated`` or ``uncoordinated``) re-chooses
the gateway's threshold ``t`` every ``policy.TUNE_PERIOD_S`` of modelled time, once the gateway's
window of lengths holds ``TUNE_MIN_SAMPLES``, with ``policy.choose_threshold`` over the inputs
``policy.tuner_inputs`` builds, the simulator's builder (``sim/pool_tuning.py``):

- lengths and rate: the gateway's own window (``ControlLoop.window``, ``TUNE_WINDOW_SIZE``
  long): every routed attempt's uncached length and its modelled arrival time (the simulator's
  window sees every arrival, all uncached);
- local prefill nodes and backlog: the home site's prefill nodes taking work, and the uncached
  tokens of the prefills the gateway sent them and has not seen end (queued or running: the
  registry's ``queued_tokens``, ``NodeRegistry.track``) at the router's per-token estimate
  (``policy.placement.work_left_s``); the simulator sums each such request's own ``T_local(l)``;
- the link rate: the tenant file's ``pool.link`` (as the simulator's);
- the pool's group size and egress: the pool's shape in its feedback (``Feedback.pool``; a door
  that does not say it leaves ``t`` as it is);
- coordinated: the attainable share, expected queueing and link backlog of the pool's latest
  feedback (``TenantPoolLink.feedback``, polled every heartbeat; the simulator reads the
  admission at the tick's instant); uncoordinated: ``NOTHING_SAID`` (share 1, no feedback);
- cost models: the tenant's local one and the pool site's (``with_pool_site``: an H200 of the
  tenant's model; the simulator prices with the pool group's own hardware).

A new ``t`` goes through ``ControlLoop.set_threshold`` (the one way the live ``t`` changes), so
the router reads it from its next request on. ``pool.tenant_router.TenantRouter`` holds a
coordinated tenant's router gate: a request it would offload stays home when
``policy.keeps_local`` says so (the pool's expected queueing for the tenant, from the latest
feedback, over ``pool.ttft_target_s`` and the home queue shorter), counted
``prfaas_pool_kept_local_total{reason="expected_queueing"}``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from prfaas.config import DeploymentConfig
from prfaas.core import ClusterView, NodeRole, SiteId
from prfaas.perf import CostModel
from prfaas.policy.placement import work_left_s
from prfaas.policy.pool_coordination import (
    NOTHING_SAID,
    TUNE_MIN_SAMPLES,
    TUNE_PERIOD_S,
    PoolCapacity,
    PoolSaid,
    TenantLoad,
    ThresholdChoice,
    choose_threshold,
    tuner_inputs,
)
from prfaas.pool.client import Feedback
from prfaas.serve.gateway.control import ControlLoop

NUM_CHOICES_KEPT = 32
"""The last re-choices ``/internal/control`` lists (each with its inputs)."""
PER_TOKEN_PROBE_TOKENS = 8192
"""The local per-token prefill estimate is ``T_local`` of this many tokens over them (the
``prfaas`` router's own estimate of a queue it cannot otherwise price)."""


def per_token_s(local: CostModel) -> float:
    return local.prefill_s(PER_TOKEN_PROBE_TOKENS) / PER_TOKEN_PROBE_TOKENS


def home_prefill(cluster: ClusterView, home: SiteId, per_token: float) -> tuple[int, float]:
    """(home prefill nodes taking work, seconds of prefill work sent to every home prefill node
    and not ended): what the simulator's tenant knows as its local nodes and ``local_work_s``."""
    nodes = cluster.nodes(home, NodeRole.PREFILL)
    backlog_s = sum(work_left_s(cluster, n, per_token) for n in nodes)
    return sum(1 for n in nodes if n.accepting), backlog_s


class TenantTuner:
    """``pool.tuner`` coordinated or uncoordinated, live (module docstring). ``tick`` is called
    by the gateway's control loop (at least every 0.25 s of wall time) with modelled seconds."""

    def __init__(
        self,
        d: DeploymentConfig,
        control: ControlLoop,
        feedback: Callable[[], Feedback | None],
        local: CostModel,
        pool: CostModel,
        metrics: CollectorRegistry,
    ) -> None:
        """``d``: the tenant's deployment (with its pool site); ``feedback()``: the pool's latest
        ``Feedback`` or None (``TenantPoolLink.feedback``)."""
        assert d.pool is not None and d.pool.tuner != "fixed"
        self.kind = d.pool.tuner
        self.ttft_target_s = d.pool.ttft_target_s
        self.model = d.engine.model
        self.control = control
        self.registry = control.registry
        self._feedback = feedback
        self.local = local
        self.pool = pool
        self.home = SiteId(d.home_site.name)
        # The same conversion as the simulator's tenant (``commands/sim_pool.py``).
        self.link_bytes_per_s = d.pool.link.gbps * 1e9 / 8
        self.per_token_s = per_token_s(local)
        self.period_s = TUNE_PERIOD_S
        # The simulator's count, unless the tenant file sets its own (a test's short window).
        given = "tune_min_samples" in d.policy.model_fields_set
        self.min_samples = d.policy.tune_min_samples if given else TUNE_MIN_SAMPLES
        self._due_s: float | None = None
        self.num_choices = 0
        self.choices: deque[dict[str, object]] = deque(maxlen=NUM_CHOICES_KEPT)
        self.waiting = "the first period"
        """Why the last due tick chose nothing ("" once one did)."""
        self._metrics(metrics)
        self.threshold.set(self.registry.view.threshold_tokens)

    def _metrics(self, r: CollectorRegistry) -> None:
        self.threshold = Gauge(
            "pool_threshold_tokens", "The tenant's threshold t: uncached prompts longer than "
            "this are offloaded to the pool", namespace="prfaas", registry=r,
        )  # fmt: skip
        self.num_chosen = Counter(
            "pool_tuner_choices", "The tenant tuner's re-choices of t (pool.tuner), by whether "
            "t changed", ["changed"], namespace="prfaas", registry=r,
        )  # fmt: skip
        self.share = Gauge(
            "pool_tuner_share", "The pool share the last re-choice planned with (the feedback's "
            "attainable share; 1 uncoordinated)", namespace="prfaas", registry=r,
        )  # fmt: skip
        self.queueing = Gauge(
            "pool_tuner_expected_queueing_seconds", "The pool's expected queueing (modelled s) "
            "the last re-choice planned with (0 uncoordinated)", namespace="prfaas", registry=r,
        )  # fmt: skip
        self.link_backlog = Gauge(
            "pool_tuner_link_backlog_seconds", "The tenant's link backlog at the pool (modelled "
            "s) the last re-choice planned with (0 uncoordinated)",
            namespace="prfaas", registry=r,
        )  # fmt: skip
        self.rate = Gauge(
            "pool_tuner_rate_rps", "The arrival rate (modelled req/s) the last re-choice "
            "planned with", namespace="prfaas", registry=r,
        )  # fmt: skip

    def inputs(self) -> tuple[TenantLoad, PoolCapacity] | str:
        """``choose_threshold``'s inputs now, or why there are none."""
        fb = self._feedback()
        if fb is None or fb.pool is None:
            return "no pool shape in the feedback yet"
        num_pool_nodes = fb.pool.num_nodes_for(self.model)
        if num_pool_nodes is None:
            return f"the pool's feedback names no group for {self.model!r}"
        said = PoolSaid.of(fb) if self.kind == "coordinated" else NOTHING_SAID
        window = self.control.window
        num_local, backlog_s = home_prefill(self.registry.view, self.home, self.per_token_s)
        return tuner_inputs(
            tuple(window.prompt_lengths()),
            window.rate_rps(),
            num_local_prefill=num_local,
            link_bytes_per_s=self.link_bytes_per_s,
            local_backlog_s=backlog_s,
            num_pool_nodes=num_pool_nodes,
            egress_bytes_per_s=fb.pool.egress_bytes_per_s,
            said=said,
            period_s=self.period_s,
        )

    def _due(self, now_s: float) -> bool:
        if self._due_s is None:
            self._due_s = now_s + self.period_s
        if now_s < self._due_s:
            return False
        self._due_s += self.period_s
        if self._due_s <= now_s:  # late by more than a period: skip, do not burst
            self._due_s = now_s + self.period_s
        return True

    def tick(self, now_s: float) -> ThresholdChoice | None:
        """Re-choose ``t`` when a period is up (``now_s``: modelled); the choice, else None."""
        self.threshold.set(self.registry.view.threshold_tokens)
        if not self._due(now_s):
            return None
        n = len(self.control.window)
        if n < self.min_samples:
            self.waiting = f"{n} of {self.min_samples} lengths observed"
            return None
        built = self.inputs()
        if isinstance(built, str):
            self.waiting = built
            return None
        load, pool = built
        choice = choose_threshold(load, pool, self.local, self.pool)
        self._record(now_s, load, pool, choice)
        return choice

    def _record(
        self, now_s: float, load: TenantLoad, pool: PoolCapacity, choice: ThresholdChoice
    ) -> None:
        t = choice.threshold_tokens
        changed = t != self.registry.view.threshold_tokens
        self.waiting = ""
        self.num_choices += 1
        self.num_chosen.labels(changed="yes" if changed else "no").inc()
        self.share.set(pool.share)
        self.queueing.set(pool.expected_queueing_s)
        self.link_backlog.set(pool.link_backlog_s)
        self.rate.set(load.rate_rps)
        self.choices.append({
            "t_s": round(now_s, 3), "threshold_tokens": t, "changed": changed,
            "share": pool.share, "expected_queueing_s": pool.expected_queueing_s,
            "link_backlog_s": pool.link_backlog_s, "rate_rps": load.rate_rps,
            "num_lengths": len(load.lengths), "num_local_prefill": load.num_local_prefill,
            "local_backlog_s": load.local_backlog_s, "num_pool_nodes": pool.num_pool_nodes,
            "egress_bytes_per_s": pool.egress_bytes_per_s, "link_bytes_per_s":
            load.link_bytes_per_s, "rho_local": choice.rho_local, "rho_pool": choice.rho_pool,
            "rho_link": choice.rho_link,
        })  # fmt: skip
        if changed:
            reason = (
                f"pool {self.kind}: share {pool.share:.3f}, queueing "
                f"{pool.expected_queueing_s:.2f} s, link backlog {pool.link_backlog_s:.2f} s"
            )
            self.control.set_threshold(t, now_s, reason)
            self.threshold.set(t)

    def state(self) -> dict[str, object]:
        """``/internal/control``'s ``pool_tuner`` (``prfaas status`` shows it)."""
        return {
            "tuner": self.kind,
            "ttft_target_s": self.ttft_target_s,
            "period_s": self.period_s,
            "min_samples": self.min_samples,
            "threshold_tokens": self.registry.view.threshold_tokens,
            "num_choices": self.num_choices,
            "waiting": self.waiting,
            "choices": list(self.choices),
        }
