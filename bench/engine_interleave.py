"""Benchmark: decode inter-token latency (ITL) of running streams while a long prefill is admitted,
with the prefill in one pass (before) and cut into chunks with decode steps between (after).

    .venv/bin/python bench/engine_interleave.py              # table, medians of --repeats runs
    .venv/bin/python bench/engine_interleave.py --json
    .venv/bin/python bench/engine_interleave.py --quick      # 1 repeat, shorter prompt

A random-weight Qwen3-Next-style model (Gated DeltaNet + attention 3:1, dense MLP, fp32, torch
fallbacks), one torch thread. ``--streams`` requests decode continuously, stepped the way a decode
node does (``await engine.step_async()`` in a loop); once they run, a ``--prompt-tokens`` prefill
is admitted on the same engine. Figures: ITL of the streams with no prefill (steady); while the
prefill runs, the worst gap between two tokens of a stream, the mean gap (prefill time / tokens
each stream got meanwhile) and those tokens; the prefill's own time (its TTFT, what chunking
costs).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

MODEL: dict[str, Any] = {  # ~30M parameters, Qwen3-Next-style hybrid
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "mlp_only_layers": list(range(8)),
    "max_position_embeddings": 8192,
}
VOCAB = 8192


async def _once(model: Any, chunk: int | None, streams: int, prompt_tokens: int) -> dict[str, Any]:
    from prfaas.engine import PrefillRequest, SamplingParams
    from prfaas.engine.torch import TorchEngine

    engine = TorchEngine(model, prefill_chunk_tokens=chunk)
    sampling = SamplingParams(max_new_tokens=2000, ignore_eos=True)
    try:
        for i in range(streams):
            ids = tuple((7 * i + 13 * j) % (model.vocab_size - 2) + 2 for j in range(128))
            engine.start(engine.prefill(PrefillRequest(f"s{i}", ids, sampling)), sampling)
        done_at: list[float] = []
        window: list[float] = []

        async def admit() -> None:
            await asyncio.sleep(0.5)  # steady decode first
            ids = tuple((11 * j + 5) % (model.vocab_size - 2) + 2 for j in range(prompt_tokens))
            req = PrefillRequest("long", ids, SamplingParams(max_new_tokens=1))
            window.append(time.perf_counter())
            async for _ in engine.prefill_stream(req):
                pass
            window.append(time.perf_counter())

        prefill = asyncio.ensure_future(admit())
        while not prefill.done() or time.perf_counter() < window[-1] + 0.3:
            await engine.step_async()
            done_at.append(time.perf_counter())
        await prefill
    finally:
        engine.close()
    start, end = window
    gaps = list(itertools.pairwise(done_at))
    steady = [b - a for a, b in gaps if b < start]
    inside = sum(1 for t in done_at if start < t <= end)
    return {
        "steady_itl_ms": 1000 * statistics.median(steady),
        "max_itl_ms": 1000 * max(b - a for a, b in gaps if b > start and a < end),
        "mean_itl_ms": 1000 * (end - start) / max(inside, 1),
        "tokens_during_prefill": inside,
        "prefill_s": end - start,
    }


def run(chunks: list[int | None], streams: int, prompt_tokens: int, repeats: int) -> dict[str, Any]:
    import torch

    from prfaas.engine.torch import load_model
    from prfaas.engine.torch.tiny import make_tiny

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny("qwen3_next", Path(tmp) / "m", vocab_size=VOCAB, overrides=MODEL)
        model = load_model(folder)
    num_params = sum(p.numel() for p in model.model.parameters())
    rows = []
    runs: dict[int | None, list[dict[str, Any]]] = {c: [] for c in chunks}
    for _ in range(repeats):  # interleaved, so machine noise hits every setting alike
        for chunk in chunks:
            runs[chunk].append(asyncio.run(_once(model, chunk, streams, prompt_tokens)))
    for chunk in chunks:
        row: dict[str, Any] = {"chunk_tokens": chunk}
        for key in runs[chunk][0]:
            row[key] = statistics.median(r[key] for r in runs[chunk])
        rows.append(row)
    return {
        "model": f"qwen3_next-style, {num_params / 1e6:.0f}M params, fp32, 1 thread",
        "streams": streams,
        "prompt_tokens": prompt_tokens,
        "repeats": repeats,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--chunks", default="none,512,256", help="comma list; none: one pass")
    args = parser.parse_args()
    chunks = [None if c == "none" else int(c) for c in args.chunks.split(",")]
    repeats, prompt_tokens = (1, 512) if args.quick else (args.repeats, args.prompt_tokens)
    res = run(chunks, args.streams, prompt_tokens, repeats)
    if args.json:
        print(json.dumps(res))
        return
    print(f"{res['model']}; {res['streams']} streams decoding; a {prompt_tokens}-token prefill")
    print(f"admitted; medians of {repeats} runs")
    print("| prefill chunk | steady ITL ms | max ITL ms | mean ITL ms | tokens | prefill s |")
    print("|---|---|---|---|---|---|")
    for r in res["rows"]:
        name = "one pass" if r["chunk_tokens"] is None else f"{r['chunk_tokens']} tokens"
        print(
            f"| {name} | {r['steady_itl_ms']:.1f} | {r['max_itl_ms']:.0f} | "
            f"{r['mean_itl_ms']:.0f} | {r['tokens_during_prefill']:.0f} | {r['prefill_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
