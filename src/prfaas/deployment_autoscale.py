"""The deployment file's ``autoscale:`` section: the PrfaaS pool's node groups (on-demand or spot,
with start-up, price, notice and preemptions), the autoscaler's bounds, targets and cooldowns, and
the load shape ``prfaas sim`` replays against it. Validation errors name the field in one line
(``autoscale.max_nodes``, ``autoscale.groups.0.usd_per_hour``, ...). Builds the pure objects the
simulator and the live provider use (``policy.AutoscaleConfig``, ``sim.elastic`` configs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    # The pure objects are built on demand: loading a deployment file (every command) does not
    # import the policy and simulator packages for a section most files do not have.
    from prfaas.policy.autoscaler import AutoscaleConfig
    from prfaas.sim.elastic import GroupConfig, PreemptionConfig, RateProfile


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PreemptionSection(_Strict):
    mttp_s: float | None = Field(None, gt=0, description="mean time to preemption per node, s")
    trace: str | list[int] | None = Field(
        None,
        description="spot availability per interval, 0/1 ('1101' or [1, 1, 0, 1]); replayed",
    )
    interval_s: float = Field(600.0, gt=0, description="the trace's interval, s")

    @field_validator("trace")
    @classmethod
    def _parses(cls, trace: str | list[int] | None) -> str | list[int] | None:
        if trace is None:
            return None
        from prfaas.sim.elastic import parse_availability
        from prfaas.sim.scenario import ScenarioError

        text = trace if isinstance(trace, str) else " ".join(str(x) for x in trace)
        try:
            parse_availability(text, "trace")
        except ScenarioError as exc:
            raise ValueError(str(exc).removeprefix("trace: ")) from None
        return trace

    def build(self) -> PreemptionConfig:
        from prfaas.sim.elastic import PreemptionConfig, parse_availability

        trace: tuple[int, ...] = ()
        if self.trace is not None:
            raw = self.trace if isinstance(self.trace, str) else " ".join(map(str, self.trace))
            trace = parse_availability(raw)
        return PreemptionConfig(self.mttp_s, trace, self.interval_s)


class GroupSection(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")
    spot: bool = False
    usd_per_hour: float | None = Field(None, gt=0, description="per node; required for spot")
    notice_s: float = Field(
        120.0, ge=0, description="spot: notice before the end (AWS 120, GCP 30)"
    )
    startup_s: float = Field(180.0, ge=0, description="modelled start-up of a node, s")
    initial_nodes: int = Field(0, ge=0)
    preemption: PreemptionSection = PreemptionSection()

    @model_validator(mode="after")
    def _spot_needs_price(self) -> GroupSection:
        if self.spot and self.usd_per_hour is None:
            raise ValueError(f"group {self.name}: usd_per_hour: a spot group needs its price")
        p = self.preemption
        if not self.spot and (p.mttp_s is not None or p.trace is not None):
            raise ValueError(f"group {self.name}: preemption: only a spot group is preempted")
        return self

    def build(self, hardware: str) -> GroupConfig:
        from prfaas.sim.elastic import GroupConfig

        return GroupConfig(
            self.name, hardware, self.spot, self.usd_per_hour, self.notice_s, self.startup_s,
            self.initial_nodes, self.preemption.build(),
        )  # fmt: skip


class LoadSection(_Strict):
    """The rate shape ``prfaas sim`` replays the workload's trace under."""

    kind: Literal["flat", "burst", "ramp"] = "flat"
    factor: float = Field(1.0, gt=0)
    period_s: float = Field(1800.0, gt=0)
    burst_s: float = Field(300.0, ge=0)
    ramp_s: float = Field(600.0, ge=0)
    offset_s: float = Field(600.0, ge=0)

    def build(self) -> RateProfile:
        from prfaas.sim.elastic import RateProfile

        return RateProfile(self.kind, self.factor, self.period_s, self.burst_s, self.ramp_s,
                           self.offset_s)  # fmt: skip


class AutoscaleSection(_Strict):
    site: str | None = Field(None, description="the PrfaaS site it scales (default: the first)")
    min_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(8, ge=1)
    ttft_target_s: float = Field(4.0, gt=0)
    up_utilisation: float = Field(0.8, gt=0, le=1)
    down_utilisation: float = Field(0.6, gt=0, lt=1)
    up_cooldown_s: float = Field(30.0, ge=0)
    down_cooldown_s: float = Field(300.0, ge=0)
    down_stabilisation_s: float = Field(180.0, ge=0)
    season_s: float | None = Field(None, gt=0, description="the load's period, for a forecast")
    tick_s: float = Field(5.0, gt=0, description="how often the autoscaler looks")
    rate_window_s: float = Field(
        60.0, gt=0, description="offered tokens/s is measured over this window (sim and live)"
    )
    prior_tokens_per_s: float = Field(10_000.0, gt=0, description="per node, until measured")
    groups: list[GroupSection] = Field(default_factory=lambda: [GroupSection(name="on-demand")])
    load: LoadSection = LoadSection()

    @model_validator(mode="after")
    def _consistent(self) -> AutoscaleSection:
        if self.min_nodes > self.max_nodes:
            raise ValueError(
                f"max_nodes ({self.max_nodes}) must be >= min_nodes ({self.min_nodes})"
            )
        if self.down_utilisation >= self.up_utilisation:
            raise ValueError(
                f"down_utilisation ({self.down_utilisation}) must be < up_utilisation "
                f"({self.up_utilisation})"
            )
        names = [g.name for g in self.groups]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"groups: need one or more, with distinct names; got {names}")
        startup = max(g.startup_s for g in self.groups)
        if self.season_s is not None and self.season_s <= startup:
            raise ValueError(f"season_s ({self.season_s}) must be > startup_s ({startup})")
        return self

    def spot_notice_s(self, site: str, node: str) -> float | None:
        """The ``notice_s`` of the spot group a node was added to (the local provider names it
        ``SITE-GROUP-N``); None for any other node."""
        for g in self.groups:
            prefix = f"{site}-{g.name}-"
            if g.spot and node.startswith(prefix) and node[len(prefix) :].isdigit():
                return g.notice_s
        return None

    def policy(self) -> AutoscaleConfig:
        from prfaas.policy.autoscaler import AutoscaleConfig

        return AutoscaleConfig(
            min_nodes=self.min_nodes, max_nodes=self.max_nodes, ttft_target_s=self.ttft_target_s,
            startup_s=max(g.startup_s for g in self.groups), up_utilisation=self.up_utilisation,
            down_utilisation=self.down_utilisation, up_cooldown_s=self.up_cooldown_s,
            down_cooldown_s=self.down_cooldown_s, down_stabilisation_s=self.down_stabilisation_s,
            prior_tokens_per_s=self.prior_tokens_per_s, season_s=self.season_s,
        )  # fmt: skip
