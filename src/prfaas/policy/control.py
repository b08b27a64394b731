"""``ControlPolicy``: the periodic control decision of one home site, the same object in both
drivers (``sim/control.py`` and ``serve/gateway/control.py``).

``tick(view, now)`` returns actions and acts on nothing: the rebalancer's plan (its role changes,
then the threshold it was planned at) when it has one, else the tuner's re-searched ``t``, else
nothing. The driver carries them out: the simulator drains a node and converts it after
``role_switch_s``; the gateway asks the node to switch (``POST /nodes/{node}/role``). The policy
owns the window of recent lengths the two read (``observe`` is called once per routed request),
so a decision log of observations and ticks replays it exactly. Pure: no clock reads, no I/O,
no import of ``prfaas.sim`` or ``prfaas.serve``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prfaas.core.ids import SiteId
from prfaas.core.views import ClusterView
from prfaas.perf import CostModel
from prfaas.policy.decisions import RoleChange
from prfaas.policy.tuning import Rebalancer, ThresholdTuner, TuningConfig
from prfaas.policy.window import LengthWindow


@dataclass(frozen=True, slots=True)
class SetThreshold:
    """Route with threshold ``t = threshold_tokens`` from now on."""

    threshold_tokens: int
    expected_lambda_rps: float
    reason: str


ControlAction = RoleChange | SetThreshold
"""What a control tick asks of its driver."""


class ControlPolicy:
    """The tuner and the rebalancer of one home site (either may be off) and the window they
    read. The rebalancer goes first: a plan changes the node counts the tuner would search on."""

    def __init__(
        self,
        tuner: ThresholdTuner | None,
        rebalancer: Rebalancer | None,
        window: LengthWindow | None = None,
    ) -> None:
        self.tuner = tuner
        self.rebalancer = rebalancer
        self.window = window if window is not None else LengthWindow()

    @property
    def active(self) -> bool:
        """False when neither the tuner nor the rebalancer is on (a driver need not tick)."""
        return self.tuner is not None or self.rebalancer is not None

    def observe(self, num_uncached_tokens: int, num_output_tokens: int, now: float) -> None:
        """One routed request's lengths (what its prefill computes, what it decodes)."""
        self.window.observe(num_uncached_tokens, num_output_tokens, now)

    @property
    def observer(self) -> Callable[[int, int, float], None]:
        """``observe`` as one bound call, for a driver's hot path (the simulator's arrival):
        what ``observe`` does, without its forwarding frame. Keep the two the same."""
        return self.window.observe

    def tick(self, cluster: ClusterView, now: float) -> tuple[ControlAction, ...]:
        if self.rebalancer is not None:
            plan = self.rebalancer.plan(cluster, now, self.window)
            if plan is not None:
                last = SetThreshold(plan.threshold_tokens, plan.expected_lambda_rps, plan.reason)
                return (*plan.changes, last)
        if self.tuner is not None:
            upd = self.tuner.maybe_retune(cluster, now, self.window)
            if upd is not None:
                return (SetThreshold(upd.threshold_tokens, upd.expected_lambda_rps, upd.reason),)
        return ()


def control_policy(
    home_site: SiteId,
    prfaas_sites: Sequence[SiteId],
    remote: CostModel | None,
    local: CostModel | None,
    *,
    tune: bool,
    rebalance: bool,
    config: TuningConfig | None = None,
) -> ControlPolicy:
    """The one construction both drivers use: the tuner when ``tune`` and a PrfaaS site is in
    reach, the rebalancer when ``rebalance``; neither without a local cost model (a driver with
    no modelled hardware cannot evaluate Eqs. 3-8)."""
    cfg = config or TuningConfig()
    tuner = (
        ThresholdTuner(home_site, prfaas_sites, remote, local, cfg)
        if tune and local is not None and prfaas_sites
        else None
    )
    rebalancer = (
        Rebalancer(home_site, prfaas_sites, remote, local, cfg)
        if rebalance and local is not None
        else None
    )
    return ControlPolicy(tuner, rebalancer)
