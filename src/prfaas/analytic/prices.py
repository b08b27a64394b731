"""Money: what a deployment costs per hour and per million tokens, from a price per instance-hour
for each hardware kind. The deployment file's ``prices:`` table gives them; a kind it does not
name falls back to ``ASSUMED_USD_PER_GPU_HOUR`` x GPUs per instance, and every figure says which
prices it used. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ASSUMED_USD_PER_GPU_HOUR: Mapping[str, float] = {
    "h20": 1.85,
    "h200": 3.70,
    "h100": 3.00,
    "b200": 5.50,
}
"""ASSUMPTION, not a quote: round on-demand cloud prices of late 2025, chosen so that one H200
costs twice one H20 (the paper's equal-cost assumption, ``price_ratio`` 2). Override them with
the deployment file's ``prices:`` (USD per instance-hour)."""


@dataclass(frozen=True, slots=True)
class InstancePrice:
    usd_per_hour: float
    source: str
    """``file`` (the deployment's ``prices:``) or ``assumption`` (``ASSUMED_USD_PER_GPU_HOUR``)."""


def instance_price(
    hardware: str, gpus_per_instance: int, prices: Mapping[str, float]
) -> InstancePrice | None:
    """One instance-hour of ``hardware``; None when neither the file nor the assumption has it."""
    if hardware in prices:
        return InstancePrice(prices[hardware], "file")
    per_gpu = ASSUMED_USD_PER_GPU_HOUR.get(hardware)
    if per_gpu is None:
        return None
    return InstancePrice(per_gpu * gpus_per_instance, "assumption")


@dataclass(frozen=True, slots=True)
class Money:
    usd_per_hour: float
    usd_per_million_prompt_tokens: float
    """The whole hourly cost over the prompt tokens served in that hour (not a split)."""
    usd_per_million_output_tokens: float
    """The whole hourly cost over the output tokens generated in that hour (not a split)."""
    prices: str
    """Where the prices came from: ``file``, ``assumption`` or ``file+assumption``."""

    def as_dict(self) -> dict[str, float | str]:
        return {
            "usd_per_hour": round(self.usd_per_hour, 4),
            "usd_per_million_prompt_tokens": round(self.usd_per_million_prompt_tokens, 4),
            "usd_per_million_output_tokens": round(self.usd_per_million_output_tokens, 4),
            "prices": self.prices,
        }


def money(
    instances: Mapping[str, tuple[int, int]],
    prices: Mapping[str, float],
    prompt_tokens_per_s: float,
    output_tokens_per_s: float,
) -> Money | None:
    """``instances``: hardware -> (instances, GPUs per instance). None when a kind has no price."""
    total = 0.0
    sources: set[str] = set()
    for hardware, (count, gpus) in instances.items():
        if count == 0:
            continue
        price = instance_price(hardware, gpus, prices)
        if price is None:
            return None
        total += count * price.usd_per_hour
        sources.add(price.source)

    def per_million(tokens_per_s: float) -> float:
        return total / (tokens_per_s * 3600) * 1e6 if tokens_per_s > 0 else float("inf")

    return Money(
        total,
        per_million(prompt_tokens_per_s),
        per_million(output_tokens_per_s),
        "+".join(sorted(sources)) or "none",
    )


def instances_by_hardware(
    model: str, sites: Iterable[tuple[str, int]]
) -> dict[str, tuple[int, int]]:
    """``(hardware, instances)`` per site -> hardware name -> (instances, GPUs per instance), for
    ``money``. A site's hardware is a preset or a profile file; it is priced by the hardware name
    (the preset's, or the one the profile was measured on)."""
    from prfaas.perf import cost_model_for_hardware

    out: dict[str, tuple[int, int]] = {}
    for hardware_ref, count in sites:
        hardware = cost_model_for_hardware(model, hardware_ref).hardware
        total, _ = out.get(hardware.name, (0, hardware.gpus_per_instance))
        out[hardware.name] = (total + count, hardware.gpus_per_instance)
    return out
