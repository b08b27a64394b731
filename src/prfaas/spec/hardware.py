"""``HardwareSpec``: what one serving instance (P GPUs of one type) can do. Pure data."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    name: str
    flops_per_gpu: float
    """Dense bf16 FLOP/s of one GPU (vendor peak, no sparsity)."""
    hbm_bytes_per_s_per_gpu: float
    memory_bytes_per_gpu: float
    gpus_per_instance: int = 8
    efficiency: float = 0.4
    """The one fraction of peak FLOP/s and HBM bandwidth the roofline assumes this hardware reaches
    in practice (kernels, communication). Per hardware, never per model."""
    prefill_overhead_s: float = 0.0
    """Fixed cost of one prefill on one instance (scheduling, launches, collectives), whatever its
    length: the paper's profiles show ~0.4 s even at 1K tokens. Per hardware, never per model."""
    source: str = ""

    def __post_init__(self) -> None:
        for field_name in ("flops_per_gpu", "hbm_bytes_per_s_per_gpu", "memory_bytes_per_gpu"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"hardware {self.name}: {field_name} must be > 0")
        if self.gpus_per_instance <= 0:
            raise ValueError(f"hardware {self.name}: gpus_per_instance must be > 0")
        if self.prefill_overhead_s < 0:
            raise ValueError(f"hardware {self.name}: prefill_overhead_s must be >= 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"hardware {self.name}: efficiency must be in (0, 1]")

    @property
    def instance_flops(self) -> float:
        return self.flops_per_gpu * self.gpus_per_instance

    @property
    def instance_hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes_per_s_per_gpu * self.gpus_per_instance

    @property
    def instance_memory_bytes(self) -> float:
        return self.memory_bytes_per_gpu * self.gpus_per_instance
