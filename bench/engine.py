"""Benchmark of the engines: what one CPU core does with a ~100M-parameter Qwen3-Next-style model,
and how closely the timed engine keeps the cost model's time on a real clock.

    .venv/bin/python bench/engine.py            # tables (medians of --repeats runs)
    .venv/bin/python bench/engine.py --json     # one JSON object
    .venv/bin/python bench/engine.py --quick    # 1 repeat, shorter prompts

engine.torch: a random-weight Qwen3-Next-style model (Gated DeltaNet + gated attention 3:1, dense
MLP, fp32, torch fallbacks: no fast kernels) made with ``make_tiny`` overrides, one thread. Prefill
runs request by request; decode runs 1, 4 and 16 requests in one continuous batch. Aggregate
decode tokens/s at 16 vs 1 is the batching gain. Exported cache: bytes per prompt token
(full-attention KV) and per request (S_kv at the prompt length, measured on the export).
engine.timed: paper-1t on h200 at ``--time-scale`` wall seconds per modelled second on a LoopClock;
drift = wall time taken - target, for a prefill and for decode steps, with 1 and 12 emulated nodes
sharing this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

BENCH_MODEL: dict[str, Any] = {  # ~100M parameters, Qwen3-Next-style hybrid
    "hidden_size": 768,
    "intermediate_size": 3584,
    "num_hidden_layers": 8,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 8,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "mlp_only_layers": list(range(8)),
    "max_position_embeddings": 4096,
}
VOCAB = 16384


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def bench_torch(prompt_tokens: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    import torch

    from prfaas.engine import PrefillRequest, SamplingParams
    from prfaas.engine.torch import TorchEngine, load_model
    from prfaas.engine.torch.tiny import make_tiny

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny("qwen3_next", Path(tmp) / "m", vocab_size=VOCAB, overrides=BENCH_MODEL)
        model = load_model(folder)
    num_params = sum(p.numel() for p in model.model.parameters())
    sampling = SamplingParams(max_new_tokens=new_tokens + 1, ignore_eos=True)
    rows = []
    export_bytes = 0
    for concurrency in (1, 4, 16):
        prefill_tps, decode_tps, step_ms = [], [], []
        for rep in range(repeats):
            engine = TorchEngine(model)
            t0 = time.perf_counter()
            results = []
            for i in range(concurrency):
                ids = tuple((7 * i + 13 * j + rep) % (VOCAB - 2) + 2 for j in range(prompt_tokens))
                results.append(engine.prefill(PrefillRequest(f"r{i}", ids, sampling)))
            prefill_s = time.perf_counter() - t0
            export_bytes = sum(o.num_bytes for o in engine.export("r0"))
            for r in results:
                engine.start(r, sampling)
            t0, steps, tokens = time.perf_counter(), 0, 0
            while engine.num_running:
                tokens += sum(len(ev.token_ids) for ev in engine.step())
                steps += 1
            decode_s = time.perf_counter() - t0
            prefill_tps.append(concurrency * prompt_tokens / prefill_s)
            decode_tps.append(tokens / decode_s)
            step_ms.append(1000 * decode_s / steps)
        rows.append(
            {
                "concurrency": concurrency,
                "prefill_tokens_per_s": _median(prefill_tps),
                "decode_tokens_per_s": _median(decode_tps),
                "decode_step_ms": _median(step_ms),
            }
        )
    spec = model.cmap.spec
    return {
        "model": f"qwen3_next-style, {num_params / 1e6:.0f}M params, fp32, {spec.num_layers} lay.",
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "rows": rows,
        "decode_gain_16_vs_1": rows[2]["decode_tokens_per_s"] / rows[0]["decode_tokens_per_s"],
        "cache_bytes_per_token": spec.full_attention_bytes_per_token,
        "cache_fixed_bytes": spec.fixed_bytes,
        "cache_bytes_per_request": export_bytes,
        "cache_bytes_per_request_spec": spec.bytes_for(prompt_tokens),
    }


async def _timed_once(num_nodes: int, time_scale: float, prompt_tokens: int) -> dict[str, float]:
    from prfaas.core.clock import LoopClock
    from prfaas.engine import LayerOutput, LayoutManifest, PrefillRequest, SamplingParams
    from prfaas.engine.timed import TimedConfig, TimedEngine
    from prfaas.engine.waiting import LoopWaiter
    from prfaas.perf import cost_model_for

    clock = LoopClock()
    cm = cost_model_for("paper-1t", "h200")
    config = TimedConfig(time_scale=time_scale, byte_divisor=1000, token_chunk=8)
    engines = [TimedEngine(cm, LoopWaiter(clock), config) for _ in range(num_nodes)]

    async def prefill(engine: TimedEngine) -> float:
        req = PrefillRequest("p", tuple(range(prompt_tokens)), SamplingParams(max_new_tokens=64))
        start = time.perf_counter()
        async for item in engine.prefill_stream(req):
            if isinstance(item, LayerOutput):
                bytes(item.buffers[0][:16])  # touch the payload like a sender would
        return (time.perf_counter() - start) - engine.prefill_plan(prompt_tokens).duration_s

    async def decode(engine: TimedEngine) -> float:
        target = 0.0
        start = time.perf_counter()
        while engine.num_running:
            plan = engine.next_decode_plan()
            assert plan is not None
            target += plan.duration_s
            await engine.step_async()
        targets.append(target)
        return (time.perf_counter() - start) - target

    targets: list[float] = []
    prefill_drift = await asyncio.gather(*(prefill(e) for e in engines))
    for engine in engines:  # 20 requests of 8K tokens each, installed before the clock matters
        for i in range(20):
            alloc = engine.allocate(LayoutManifest.of(f"d{i}", engine.layout(8192)), 64)
            engine.install(alloc, 1, SamplingParams(max_new_tokens=64))
    decode_drift = await asyncio.gather(*(decode(e) for e in engines))
    return {
        "prefill_target_s": engines[0].prefill_plan(prompt_tokens).duration_s,
        "prefill_drift_ms": 1000 * max(prefill_drift),
        "decode_target_s": max(targets),
        "decode_drift_ms": 1000 * max(decode_drift),
    }


def bench_timed(time_scale: float, repeats: int) -> dict[str, Any]:
    rows = []
    for num_nodes in (1, 12):
        runs = [asyncio.run(_timed_once(num_nodes, time_scale, 32768)) for _ in range(repeats)]
        rows.append(
            {
                "nodes": num_nodes,
                "prefill_target_s": runs[0]["prefill_target_s"],
                "prefill_drift_ms": _median([r["prefill_drift_ms"] for r in runs]),
                "decode_target_s": runs[0]["decode_target_s"],
                "decode_drift_ms": _median([r["decode_drift_ms"] for r in runs]),
            }
        )
    return {
        "model": "paper-1t@h200",
        "time_scale": time_scale,
        "prompt_tokens": 32768,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=0.1)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    prompt_tokens, new_tokens = (128, 8) if args.quick else (256, 16)
    torch_res = bench_torch(prompt_tokens, new_tokens, repeats)
    timed_res = bench_timed(args.time_scale, repeats)
    if args.json:
        print(json.dumps({"torch": torch_res, "timed": timed_res}))
        return
    print(f"engine.torch: {torch_res['model']}, prompt {prompt_tokens}, {new_tokens} decode steps")
    print("| concurrent | prefill tok/s | decode tok/s (aggregate) | decode step ms |")
    print("|---|---|---|---|")
    for r in torch_res["rows"]:
        print(
            f"| {r['concurrency']} | {r['prefill_tokens_per_s']:.0f} | "
            f"{r['decode_tokens_per_s']:.1f} | {r['decode_step_ms']:.1f} |"
        )
    print(f"decode tok/s at 16 vs 1: {torch_res['decode_gain_16_vs_1']:.2f}x")
    print(
        f"exported cache: {torch_res['cache_bytes_per_token']} B/token (full attention) + "
        f"{torch_res['cache_fixed_bytes']} B fixed; per request at {prompt_tokens} tokens: "
        f"{torch_res['cache_bytes_per_request']} B "
        f"(spec: {torch_res['cache_bytes_per_request_spec']})"
    )
    print(f"\nengine.timed: {timed_res['model']}, time scale {timed_res['time_scale']}")
    print(
        "| emulated nodes | prefill target s | prefill drift ms (max over nodes) "
        "| 20x64-token decode target s | decode drift ms (max over nodes) |"
    )
    print("|---|---|---|---|---|")
    for r in timed_res["rows"]:
        print(
            f"| {r['nodes']} | {r['prefill_target_s']:.3f} | {r['prefill_drift_ms']:.2f} | "
            f"{r['decode_target_s']:.3f} | {r['decode_drift_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()
