"""What a pod of each hardware kind asks Kubernetes for: GPUs (``nvidia.com/gpu``, one instance
of the preset's GPUs per node process), CPU and memory, and the GPU product label that places it
(NVIDIA GPU feature discovery's ``nvidia.com/gpu.product``).

A hardware kind with no mapping here (a profile file, a preset added later) is refused naming the
site's ``hardware`` field: guessing the GPU count of an instance is how a pod never schedules.
Emulated (``timed``) nodes and torch nodes on ``device: cpu`` need no GPU: they ask for CPU and
memory only, and say so in an annotation."""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.errors import UsageError

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True, slots=True)
class PodResources:
    requests: dict[str, str]
    limits: dict[str, str]
    gpu_product: str | None
    """The GPU product label value required of the node; None: no GPU."""
    why: str
    """One line for the ``prfaas.io/resources`` annotation: where the figures come from."""


@dataclass(frozen=True, slots=True)
class _Gpu:
    product: str
    num_gpus: int
    cpu_per_gpu: int
    memory_gib_per_gpu: int


# One 8-GPU instance per node process, as the presets model it (spec/presets.py); host CPU and
# memory per GPU are typical of those servers (an ASSUMPTION an operator tunes).
_GPUS: dict[str, _Gpu] = {
    "h200": _Gpu("NVIDIA-H200", 8, 12, 192),
    "h20": _Gpu("NVIDIA-H20", 8, 12, 192),
    "h100": _Gpu("NVIDIA-H100-80GB-HBM3", 8, 12, 128),
    "b200": _Gpu("NVIDIA-B200", 8, 14, 256),
}


def supported_hardware() -> tuple[str, ...]:
    return tuple(sorted(_GPUS))


def pod_resources(
    site: str,
    site_index: int,
    hardware: str,
    engine_kind: str,
    device: str,
    threads: int,
    field: str | None = None,
) -> PodResources:
    """The resources of one node process of ``site`` (``sites[site_index]`` in the file);
    ``field`` names the hardware in an error instead (a pool file's ``groups[i].hardware``)."""
    if engine_kind == "timed":
        cpu = {"cpu": "1", "memory": "1Gi"}
        return PodResources(cpu, {"memory": "2Gi"}, None, "emulated (timed): no GPU")
    if engine_kind == "torch" and device == "cpu":
        cpu = {"cpu": str(threads), "memory": "8Gi"}
        return PodResources(cpu, {"memory": "16Gi"}, None, "torch on cpu: no GPU")
    gpu = _GPUS.get(hardware)
    if gpu is None:
        known = ", ".join(supported_hardware())
        raise UsageError(
            f"{field or f'sites[{site_index}].hardware'}: {hardware!r} "
            f"({'group' if field else 'site'} {site}) has no Kubernetes resource mapping "
            f"(one of {known})"
        )
    n = gpu.num_gpus
    requests = {
        "cpu": str(gpu.cpu_per_gpu * n),
        "memory": f"{gpu.memory_gib_per_gpu * n}Gi",
        GPU_RESOURCE: str(n),
    }
    limits = {GPU_RESOURCE: str(n), "memory": f"{gpu.memory_gib_per_gpu * n}Gi"}
    return PodResources(requests, limits, gpu.product, f"{n}x {gpu.product} per node process")
