"""``Scenario``: the inputs of the paper's throughput model (defaults = the paper's case study)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prfaas.analytic.lengths import LengthDistribution, TruncatedLogNormal


@dataclass(frozen=True)
class Scenario:
    model: str = "paper-1t"
    prfaas_hardware: str = "h200"
    """Hardware of the remote PrfaaS cluster."""
    local_hardware: str = "h20"
    """Hardware of the local PD cluster (and of the homogeneous baseline)."""
    n_prfaas: int = 4
    """PrfaaS instances (8 GPUs each in the case study: 32 H200)."""
    n_local: int = 8
    """Local PD instances, N_p + N_d (64 H20)."""
    n_homogeneous: int = 12
    """Instances of the homogeneous baseline (same GPU count: 96 H20)."""
    link_gbps: float = 100.0
    """PrfaaS egress bandwidth B_out."""
    lengths: LengthDistribution = field(default_factory=TruncatedLogNormal)
    output_tokens: int = 1024
    """L_out, fixed."""
    decode_slo_tokens_per_s: float = 40.0
    """Per-request decode speed the SLO demands; sets T_decode and BS_max."""
    threshold_step_tokens: int = 100
    price_ratio: float = 2.0
    """Price of one PrfaaS GPU over one local GPU, for the equal-cost comparison (an ASSUMPTION:
    the paper gives no prices; its ~15% equal-cost gain implies about 2)."""

    def __post_init__(self) -> None:
        for name in ("n_prfaas", "n_local", "n_homogeneous", "output_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.n_local < 2:
            raise ValueError(f"n_local must be >= 2 (one prefill, one decode), got {self.n_local}")
        if self.n_homogeneous < 2:
            raise ValueError(f"n_homogeneous must be >= 2, got {self.n_homogeneous}")
        if not self.link_gbps > 0:
            raise ValueError(f"link_gbps must be > 0, got {self.link_gbps}")
        if not self.decode_slo_tokens_per_s > 0:
            raise ValueError(
                f"decode_slo_tokens_per_s must be > 0, got {self.decode_slo_tokens_per_s}"
            )
        if self.threshold_step_tokens <= 0:
            raise ValueError(f"threshold_step_tokens must be > 0, got {self.threshold_step_tokens}")
        if not self.price_ratio > 0:
            raise ValueError(f"price_ratio must be > 0, got {self.price_ratio}")

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8
