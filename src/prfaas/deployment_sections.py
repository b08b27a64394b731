"""The deployment file's sections that describe what runs *against* a deployment rather than the
deployment itself: ``workload:`` (arrivals, prompt lengths, a trace), ``simulation:`` (what only the
simulator models) and ``prices:`` (money per instance-hour). ``prfaas sim`` and ``prfaas plan``
read them; ``prfaas up`` ignores them, so one file serves all three. Also ``engine.vllm`` (how a
vLLM site's server is started: ``VllmSettings``, a site's ``VllmOverride``). pydantic models, no
I/O (``config.py`` reads the file) beyond checking that a named python is executable.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


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

    @field_validator("trace")
    @classmethod
    def _relative_to_the_file(cls, trace: str | None, info: ValidationInfo) -> str | None:
        """A relative trace is the deployment file's neighbour (as a profile file is), so every
        command reads the same trace from any folder; one that is not there stays as written
        (relative to the folder the command runs in, as before)."""
        base = (info.context or {}).get("base_dir")
        if trace is None or base is None or Path(trace).is_absolute():
            return trace
        beside = Path(base) / trace
        return str(beside.resolve()) if beside.is_file() else trace


class PlumbingSwitches(_Strict):
    """``simulation.plumbing``: which measured plumbing terms of the profiles the simulator
    charges (``perf.plumbing``; docs/profiles.md). Off: charged as 0 (what each term buys)."""

    prefill_per_request: bool = True
    decode_per_request: bool = True
    decode_per_kv_byte: bool = True
    decode_per_output_token: bool = True
    gateway_per_request: bool = True
    gateway_per_output_token: bool = True
    decode_per_step: bool = True
    shared_core_overhead: bool = True
    prefill_per_token: bool = True
    decode_per_context_token: bool = True
    gateway_per_step: bool = True
    first_token_wait_per_decoding: bool = True
    first_token_wait: bool = True
    prefill_in_service_excess: bool = True
    node_per_request: bool = True
    """Files written before the prefill and decode nodes' fixed terms were measured apart: off
    switches both (``prefill_per_request`` and ``decode_per_request``)."""

    def off(self) -> tuple[str, ...]:
        """The ``PlumbingCosts`` field names switched off (each a switch's name with ``_s``, but
        the ratios, ``shared_core_overhead`` and ``prefill_in_service_excess``, and
        ``node_per_request``, both nodes' terms)."""
        names = {"shared_core_overhead": ("shared_core_overhead",),
                 "prefill_in_service_excess": ("prefill_in_service_excess",),
                 "node_per_request": ("prefill_per_request_s", "decode_per_request_s")}  # fmt: skip
        off = (n for k, on in self.model_dump().items() if not on
               for n in names.get(k, (f"{k}_s",)))  # fmt: skip
        return tuple(dict.fromkeys(off))


class SimulationConfig(_Strict):
    """What only the simulator models (the live system measures it instead)."""

    prefix_cache: bool = True
    cache_bytes_per_node: float = Field(1e12, ge=0, description="prefix-cache pool per node")
    drain_s: float = Field(600.0, ge=0, description="longest run after arrivals stop")
    tune: bool | None = Field(None, description="re-search t online (None: on for prfaas)")
    role_switch_s: float = Field(10.0, ge=0, description="time to reload a node in a new role")
    local_fabric_gbps: float = Field(400.0, gt=0, description="RDMA rate inside a site")
    prefill_token_budget: int | None = Field(
        None,
        ge=1,
        description="uncached tokens one prefill batch may hold; None: the engine kind's own "
        "(ENGINE_PREFILL_TOKEN_BUDGET: timed 32768, torch 1 = one request per prefill, "
        "vllm 2048 = vLLM's OpenAI server max_num_batched_tokens)",
    )
    decode_pads_batch: bool | None = Field(
        None,
        description="a decode step costs batch x the longest context (the engine pads its batch) "
        "rather than the contexts' sum; None: the engine kind's own (ENGINE_DECODE_PADS_BATCH: "
        "torch pads, timed and vllm do not)",
    )
    decode_max_batch: int | None = Field(
        None,
        ge=1,
        description="the most requests a decode step holds; None: the engine kind's own "
        "(ENGINE_DECODE_MAX_BATCH: vllm 128 = a vLLM OpenAI server's max_num_seqs on CPU; give "
        "256 for a GPU server, or its --max-num-seqs; torch 64 = engine.torch's batch; timed: "
        "the batch whose step meets slo_tpot_s at 8K context, the paper's BS_max)",
    )
    decode_kv_fraction: float = Field(0.25, gt=0, le=1)
    slo_ttft_s: float = Field(10.0, gt=0)
    slo_tpot_s: float = Field(0.025, gt=0)
    sample_interval_s: float = Field(1.0, gt=0)
    plumbing: PlumbingSwitches = PlumbingSwitches()

    def prefill_budget_for(self, engine_kind: str) -> int:
        """``prefill_token_budget``, or the engine kind's own batching when the file gives none."""
        if self.prefill_token_budget is not None:
            return self.prefill_token_budget
        return ENGINE_PREFILL_TOKEN_BUDGET[engine_kind]

    def decode_max_batch_for(self, engine_kind: str) -> int | None:
        """``decode_max_batch``, or the engine kind's own (None: the SLO's batch)."""
        if self.decode_max_batch is not None:
            return self.decode_max_batch
        return ENGINE_DECODE_MAX_BATCH[engine_kind]

    def decode_pads_batch_for(self, engine_kind: str) -> bool:
        """``decode_pads_batch``, or the engine kind's own when the file gives none."""
        if self.decode_pads_batch is not None:
            return self.decode_pads_batch
        return ENGINE_DECODE_PADS_BATCH[engine_kind]


TORCH_DECODE_MAX_BATCH = 64
"""Requests one ``engine.torch`` decode step holds (its ``DEFAULT_MAX_BATCH``), whatever its steps
take: it admits by its KV budget, not by a decode SLO, and more running requests take turns."""

ENGINE_DECODE_MAX_BATCH: dict[str, int | None] = {
    "timed": None, "torch": TORCH_DECODE_MAX_BATCH, "vllm": 128,
}  # fmt: skip
"""The most requests one decode step of each engine kind holds, in the simulator (None: the
batch whose step meets ``slo_tpot_s`` at 8K context, the cost model's ``max_decode_batch``, the
paper's BS_max, which the timed engine admits too). A vLLM server admits up to ``max_num_seqs``
(128 by default for its OpenAI server on CPU, 256 on GPU) whatever its steps take: capped at the
SLO's batch (10 on the tiny model here), the simulator decoded a 90-request burst in nine waves
and drained it in 3.0 s where the server took 1.3 s (2026-12-06). ``engine.torch`` likewise holds
64 (since 2026-12-07; before, the SLO's batch: 10-20 on the tiny model, and none at all, the
simulator refusing the file, where a loaded machine's profile missed the SLO at batch 1)."""

ENGINE_PREFILL_TOKEN_BUDGET = {"timed": 32768, "torch": 1, "vllm": 2048}
"""How each engine kind batches prefills, in the simulator's terms (uncached tokens per batch; the
head request always runs, alone if larger): the timed engine batches with ``PrefillBatcher`` at
32K tokens; the torch engine prefills one request at a time; a vLLM server schedules up to
``max_num_batched_tokens`` (2048 by default for its OpenAI server, CPU and GPU)."""


ENGINE_DECODE_PADS_BATCH = {"timed": False, "torch": True, "vllm": False}
"""Whether each engine kind's decode step computes its batch padded to the longest context:
``engine.torch`` left-pads the batch's caches into one (``hf_cache.build_cache``) and its
attention runs over the padding (measured: 14 requests of 387-5,109 tokens step in 23 ms of CPU,
14 of their mean 1,756 in 15 ms, 14 of 5,109 in 20 ms); vLLM's paged attention and the timed
engine (the cost model's own sum) do not pad."""


Prices = dict[str, float]
"""USD per instance-hour, by a site's ``hardware`` (preset name or profile file)."""


CPUS_PATTERN = r"^\d+(-\d+)?(,\d+(-\d+)?)*$"
"""Core ids: "0", "1", "0-3", "0,2-3"."""
CPU_BIND_PATTERN = r"^(auto|\d+(-\d+)?(,\d+(-\d+)?)*)$"
"""``VLLM_CPU_OMP_THREADS_BIND`` of one server: ``auto`` or core ids ("0", "1", "0-3", "0,2")."""


def cpu_set(cores: str) -> frozenset[int] | None:
    """The cores a ``CPUS_PATTERN`` / ``CPU_BIND_PATTERN`` value names; None for ``auto``."""
    if cores == "auto":
        return None
    out: set[int] = set()
    for part in cores.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return frozenset(out)


class VllmSettings(_Strict):
    """``engine.vllm``: how a vLLM site's sidecar starts its vLLM OpenAI server (one per node
    process). Validated where the file is read; the sidecar builds the command line from it."""

    python: str | None = Field(
        None,
        description="the vLLM venv's python (None: .venv-vllm/bin/python beside the project if it "
        "exists, else python3 on PATH); must exist and be executable",
    )
    max_model_len: int | None = Field(
        None, ge=16, description="--max-model-len (None: the model's max_position_embeddings)"
    )
    kv_cache_space_gib: int = Field(
        1, ge=1, description="VLLM_CPU_KVCACHE_SPACE: KV cache of a CPU server, GiB"
    )
    cpu_bind: str = Field(
        "auto", pattern=CPU_BIND_PATTERN, description="VLLM_CPU_OMP_THREADS_BIND (CPU servers)"
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="--gpu-memory-utilization (CUDA hosts; None: vLLM's)"
    )
    startup_timeout_s: float = Field(
        180.0, gt=0, description="longest wait for a (re)started server's /health"
    )
    extra_args: list[str] = Field(
        [],
        description="more vLLM command-line arguments, appended as given (not tensor parallelism: "
        "PrfaasConnector moves one worker's KV)",
    )

    @field_validator("python")
    @classmethod
    def _python_is_executable(cls, python: str | None, info: ValidationInfo) -> str | None:
        return _executable(python, info)

    @field_validator("extra_args")
    @classmethod
    def _no_unsupported_args(cls, args: list[str]) -> list[str]:
        _supported_extra_args(args)
        return args


UNSUPPORTED_VLLM_ARGS = {
    "--tensor-parallel-size": "PrfaasConnector moves one worker's KV: no tensor parallelism yet",
    "-tp": "PrfaasConnector moves one worker's KV: no tensor parallelism yet",
}
"""vLLM arguments ``extra_args`` may not carry, and why (also spelled ``--flag=value``)."""


def _supported_extra_args(args: list[str] | None) -> list[str] | None:
    for arg in args or ():
        flag = arg.split("=", 1)[0]
        if flag in UNSUPPORTED_VLLM_ARGS:
            raise ValueError(f"{arg!r} is not supported: {UNSUPPORTED_VLLM_ARGS[flag]}")
    return args


class VllmOverride(_Strict):
    """A site's ``engine.vllm``: only the fields it names replace the top-level ones (every
    field None here means "not set", so a resolved file read back merges the same way)."""

    python: str | None = None
    max_model_len: int | None = Field(None, ge=16)
    kv_cache_space_gib: int | None = Field(None, ge=1)
    cpu_bind: str | None = Field(None, pattern=CPU_BIND_PATTERN)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    startup_timeout_s: float | None = Field(None, gt=0)
    extra_args: list[str] | None = None

    @field_validator("python")
    @classmethod
    def _python_is_executable(cls, python: str | None, info: ValidationInfo) -> str | None:
        return _executable(python, info)

    @field_validator("extra_args")
    @classmethod
    def _no_unsupported_args(cls, args: list[str] | None) -> list[str] | None:
        return _supported_extra_args(args)

    def over(self, base: VllmSettings) -> VllmSettings:
        """``base`` with the fields this override sets."""
        changes = {k: v for k, v in self.model_dump().items() if v is not None}
        return VllmSettings.model_validate({**base.model_dump(), **changes})


def _executable(python: str | None, info: ValidationInfo) -> str | None:
    """An absolute path to an executable file (relative: to the deployment file's folder)."""
    if python is None:
        return None
    base = (info.context or {}).get("base_dir")
    path = Path(python).expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    if not path.is_file():
        raise ValueError(f"{str(path)!r} does not exist")
    if not os.access(path, os.X_OK):
        raise ValueError(f"{str(path)!r} is not executable")
    return str(path.absolute())


def default_vllm_python() -> str:
    """``.venv-vllm/bin/python`` beside the project (an editable install's checkout) if it exists,
    else ``python3`` from PATH (as a path when found, so the error names what was tried)."""
    project = Path(__file__).resolve().parents[2]
    venv = project / ".venv-vllm" / "bin" / "python"
    if venv.is_file() and os.access(venv, os.X_OK):
        return str(venv)
    return shutil.which("python3") or "python3"
