"""Build a node's engine from the deployment: ``timed`` (cost model on the wall clock, scaled) or
``torch`` (a local Hugging Face folder, run on the engine's own thread, prefills in chunks so
decode streams keep going). torch is imported only for ``torch``."""

from __future__ import annotations

from prfaas.cache.prefix_quotas import timed_store_bytes
from prfaas.config import EngineConfig
from prfaas.core.clock import LoopClock
from prfaas.deployment_sections import SimulationConfig
from prfaas.engine.api import Engine
from prfaas.engine.timed import TimedConfig, TimedEngine
from prfaas.engine.waiting import LoopWaiter
from prfaas.perf import cost_model_for_hardware

MIB = 1 << 20


def build_engine(
    config: EngineConfig, hardware: str, simulation: SimulationConfig | None = None
) -> Engine:
    """``simulation``: the deployment's section, whose prefill token budget and decode KV share
    the timed engine batches and admits with, as the simulator does from the same file."""
    if config.kind == "timed":
        cost = cost_model_for_hardware(config.model, hardware)
        sim = simulation or SimulationConfig()
        timed = TimedConfig(
            time_scale=config.time_scale,
            byte_divisor=config.byte_divisor,
            token_chunk=config.token_chunk,
            # Made-up tokens drawn from ASCII: each one is a whole character for the gateway's
            # byte tokenizer, so a client sees text from the very first token.
            vocab_size=128,
            prefill_token_budget=sim.prefill_budget_for("timed"),
            decode_kv_fraction=sim.decode_kv_fraction,
        )
        return TimedEngine(cost, LoopWaiter(LoopClock()), timed)
    import torch

    from prfaas.engine.torch import TorchEngine

    # One thread by default: a deployment on one machine runs several node processes.
    torch.set_num_threads(config.threads)
    assert config.model_path is not None
    return TorchEngine.from_folder(
        config.model_path,
        dtype=config.dtype,
        device=config.device,
        kv_budget_bytes=config.kv_budget_mib * MIB,
        prefill_chunk_tokens=config.prefill_chunk_tokens,
    )


def prefix_store_bytes(config: EngineConfig, hardware: str) -> int:
    """What a site keeps for prefix checkpoints: ``prefix_store_mib`` (torch), or a tenth of one
    emulated instance's HBM, scaled (timed)."""
    if config.kind == "torch":
        return config.prefix_store_mib * MIB
    memory = cost_model_for_hardware(config.model, hardware).hardware.instance_memory_bytes
    return timed_store_bytes(memory, config.byte_divisor)  # the pool simulator's size too
