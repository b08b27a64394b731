"""The deployment file's sections that describe what runs *against* a deployment rather than the
deployment itself: ``workload:`` (arrivals, prompt lengths, a trace), ``simulation:`` (what only the
simulator models) and ``prices:`` (money per instance-hour). ``prfaas sim`` and ``prfaas plan``
read them; ``prfaas up`` ignores them, so one file serves all three. pydantic models, no I/O
(``config.py`` reads the file).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArrivalSection(_Strict):
    kind: Literal["uniform", "poisson", "gamma", "onoff"] = "uniform"
    rate_rps: float | None = Field(
        None, gt=0, description="mean arrivals/s (None: 80% of the planner's capacity)"
    )
    cv: float = Field(2.0, gt=0, description="gamma: coefficient of variation of inter-arrivals")
    on_s: float = Field(10.0, gt=0, description="onoff: mean on period, s")
    on_fraction: float = Field(0.5, gt=0, le=1, description="onoff: share of time on")


class LengthSection(_Strict):
    kind: Literal["lognormal", "fixed"] = "lognormal"
    mu: float = Field(9.90, description="log-normal mu of prompt tokens (paper: 9.90)")
    sigma: float = Field(1.00, gt=0)
    min_tokens: int = Field(128, ge=1)
    max_tokens: int = Field(131072, ge=1)
    fixed_tokens: int = Field(8192, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> LengthSection:
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        return self


class WorkloadConfig(_Strict):
    """What the simulator and the planner feed the deployment (live: real clients)."""

    arrival: ArrivalSection = ArrivalSection()
    lengths: LengthSection = LengthSection()
    output_tokens: int = Field(1024, ge=1)
    trace: str | None = Field(None, description="Mooncake JSONL trace replayed instead")
    trace_limit: int | None = Field(None, ge=1)
    rate_scale: float = Field(1.0, gt=0, description="trace: >1 replays faster")
    duration_s: float = Field(600.0, gt=0, description="seconds of arrivals")
    warmup_s: float = Field(0.0, ge=0, description="arrivals before this are not counted")
    seed: int = 0


class SimulationConfig(_Strict):
    """What only the simulator models (the live system measures it instead)."""

    prefix_cache: bool = True
    cache_bytes_per_node: float = Field(1e12, ge=0, description="prefix-cache pool per node")
    drain_s: float = Field(600.0, ge=0, description="longest run after arrivals stop")
    tune: bool | None = Field(None, description="re-search t online (None: on for prfaas)")
    role_switch_s: float = Field(10.0, ge=0, description="time to reload a node in a new role")
    local_fabric_gbps: float = Field(400.0, gt=0, description="RDMA rate inside a site")
    prefill_token_budget: int = Field(32768, ge=1)
    decode_kv_fraction: float = Field(0.25, gt=0, le=1)
    slo_ttft_s: float = Field(10.0, gt=0)
    slo_tpot_s: float = Field(0.025, gt=0)
    sample_interval_s: float = Field(1.0, gt=0)


Prices = dict[str, float]
"""USD per instance-hour, by a site's ``hardware`` (preset name or profile file)."""
