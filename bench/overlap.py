"""Benchmark of the layer-wise overlap of an ``engine.torch`` prefill with its KV transfer.

    .venv/bin/python bench/overlap.py --before /tmp/before/src   # before/after side by side
    .venv/bin/python bench/overlap.py --rate-mbit 50 --repeats 3 --json

For each prompt length (1,900 and 8,000 tokens) and with prefix-cache checkpoints on (every 512
tokens, the live default) and off, one request is prefilled alone on one thread and streamed over
a loopback prfaas.transfer link paced by the transfer engine's token bucket (``--rate-mbit``) to
a receiver that verifies the session (digest) before it counts as delivered. Per run:
- first / last hand-out: when the first and the last of the request's bytes were handed to the
  sender (``session.send``), as a share of the prefill's compute time (submit -> result);
- TTFT: submit -> the receiver verified every byte and knows the first token (the decode side's
  TTFT without its first step); tail: TTFT - prefill, the transfer the overlap did not hide
  (less sensitive than TTFT to the compute noise of a shared machine).
``--before SRC`` runs the same measurement in a subprocess importing prfaas from ``SRC`` (a
checkout of the commit before the change, e.g. ``git worktree add /tmp/before HEAD~1``), runs
interleaved with this checkout's, and prints medians of ``--repeats`` runs side by side.
Model: a random-weight Qwen3-Next-style hybrid (3 Gated DeltaNet : 1 gated attention, 8 layers,
hidden 256, fp32, torch fallbacks), small enough that 3 x 2 x 2 x 2 runs fit in minutes on a
shared 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODEL: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "mlp_only_layers": list(range(8)),
    "max_position_embeddings": 16384,
}
VOCAB = 4096
BLOCK_TOKENS = 512
PSK = b"overlap-bench-key-0123456789"


async def _one(
    engine: Any, model_spec: Any, n: int, block: int | None, rate: float, rep: int
) -> dict[str, float]:
    from prfaas.engine import LayerOutput, PrefillRequest, SamplingParams
    from prfaas.transfer import Link, Manifest, Receiver, TransferConfig

    def allocate(manifest: Any) -> list[memoryview]:
        return [memoryview(bytearray(layer.num_bytes)) for layer in manifest.layers]

    cfg = TransferConfig(psk=PSK, num_connections=2, rate_limit_bytes_per_s=rate)
    ids = tuple((13 * j + 7 * rep + n) % (VOCAB - 2) + 2 for j in range(n))
    req = PrefillRequest(
        f"r{n}-{rep}", ids, SamplingParams(max_new_tokens=1), checkpoint_block_tokens=block
    )
    async with Receiver(cfg, allocate) as rx:
        host, port = await rx.listen("127.0.0.1", 0)
        link = await Link.connect(host, port, cfg)
        async with link:
            manifest = Manifest.from_layout(req.request_id, model_spec.layout(n))
            marks: dict[str, float] = {}
            first_token = -1
            t0 = time.perf_counter()

            async def send() -> None:
                nonlocal first_token
                async with link.session(manifest) as session:
                    async for item in engine.prefill_stream(req):
                        if isinstance(item, LayerOutput):
                            marks.setdefault("first", time.perf_counter())
                            for offset, view in item.pieces():
                                await session.send(item.position, offset, view)
                            marks["last"] = time.perf_counter()
                        else:
                            marks["prefill"] = time.perf_counter()
                            first_token = item.first_token
                    await session.finish(first_token)

            sender = asyncio.create_task(send())
            await (await rx.next_session()).complete()
            done = time.perf_counter()
            await sender
    prefill = marks["prefill"] - t0
    return {
        "prefill_s": prefill,
        "first_share": (marks["first"] - t0) / prefill,
        "last_share": (marks["last"] - t0) / prefill,
        "ttft_s": done - t0,
        "tail_s": done - marks["prefill"],
        "kv_bytes": float(model_spec.layout(n).num_bytes),
    }


def worker(args: argparse.Namespace) -> None:
    """One pass over every case (one run each); JSON lines on stdout."""
    sys.path.insert(0, args.src)
    import torch

    from prfaas.engine.torch import TorchEngine, load_model
    from prfaas.engine.torch.tiny import make_tiny

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny("qwen3_next", Path(tmp) / "m", vocab_size=VOCAB, overrides=MODEL)
        model = load_model(folder)
    engine = TorchEngine(model)
    rate = args.rate_mbit * 1e6 / 8
    try:
        # Warm-up (first-call allocations) outside the figures.
        asyncio.run(_one(engine, model.cmap.spec, 600, BLOCK_TOKENS, rate, -1))
        for n in args.tokens:
            for block in (BLOCK_TOKENS, None):
                row = asyncio.run(_one(engine, model.cmap.spec, n, block, rate, args.rep))
                row.update(tokens=n, checkpoints=block is not None)
                print(json.dumps(row), flush=True)
    finally:
        engine.close()


def _run_worker(src: str, args: argparse.Namespace, rep: int) -> list[dict[str, Any]]:
    cmd = [
        sys.executable, __file__, "--worker", "--src", src, "--rep", str(rep),
        "--rate-mbit", str(args.rate_mbit), "--tokens", *map(str, args.tokens),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=1800)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--before", help="src folder of the commit before (runs side by side)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rate-mbit", type=float, default=50.0)
    p.add_argument("--tokens", type=int, nargs="+", default=[1900, 8000])
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--src", default=str(ROOT / "src"), help=argparse.SUPPRESS)
    p.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    versions = {"after": str(ROOT / "src")}
    if args.before:
        versions = {"before": str(Path(args.before).resolve()), **versions}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in versions}
    for rep in range(args.repeats):
        for name, src in versions.items():  # interleaved: drift on a shared machine hits both
            runs[name].extend(_run_worker(src, args, rep))
            print(f"run {rep + 1}/{args.repeats} {name} done", file=sys.stderr, flush=True)
    table = []
    for n in args.tokens:
        for ckpt in (True, False):
            row: dict[str, Any] = {"tokens": n, "checkpoints": ckpt}
            for name in versions:
                rs = [r for r in runs[name] if r["tokens"] == n and r["checkpoints"] == ckpt]
                for key in ("prefill_s", "first_share", "last_share", "ttft_s", "tail_s"):
                    row[f"{name}_{key}"] = statistics.median(r[key] for r in rs)
            table.append(row)
    result = {"rate_mbit": args.rate_mbit, "repeats": args.repeats, "rows": table}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"layer-wise overlap, qwen3_next-style tiny (8 layers, hidden 256, fp32, 1 thread), "
        f"link paced at {args.rate_mbit:g} Mbit/s (loopback), medians of {args.repeats}; "
        "a shared, noisy 2-core machine"
    )
    head = f"{'tokens':>6} {'ckpt':>4} "
    cols = [n for n in versions]
    for name in cols:
        head += f"| {name + ' prefill':>14} {'first':>6} {'last':>6} {'TTFT':>7} {'tail':>6} "
    if "before" in versions:
        head += "| TTFT gain"
    print(head)
    for r in table:
        line = f"{r['tokens']:>6} {'on' if r['checkpoints'] else 'off':>4} "
        for name in cols:
            line += (
                f"| {r[f'{name}_prefill_s']:>12.3f} s {r[f'{name}_first_share']:>6.1%} "
                f"{r[f'{name}_last_share']:>6.1%} {r[f'{name}_ttft_s']:>6.3f}s "
                f"{r[f'{name}_tail_s']:>5.3f}s "
            )
        if "before" in versions:
            gain = r["before_ttft_s"] - r["after_ttft_s"]
            line += f"| {gain:+.3f} s ({gain / r['before_ttft_s']:+.0%})"
        print(line)


if __name__ == "__main__":
    main()
