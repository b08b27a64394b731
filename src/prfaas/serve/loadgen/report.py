"""The bench summary: one JSON-able dict (schema in docs/api.md) and its rich table."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from prfaas.serve.loadgen.client import RequestResult

SCHEMA_VERSION = 1


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "count": len(values),
        "mean": float(a.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(a.max()),
    }


def summarize(
    results: Sequence[RequestResult], wall_s: float, meta: dict[str, Any]
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    failures = Counter(r.reason for r in results if not r.ok)
    num_output_tokens = sum(r.num_output_tokens for r in ok)
    examples = {}
    for r in results:
        if not r.ok and r.reason not in examples:
            examples[r.reason] = r.message
    return {
        "schema_version": SCHEMA_VERSION,
        **meta,
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "failures": dict(sorted(failures.items())),
        "failure_examples": examples,
        "rejected_429": failures.get("http_429", 0),
        "duration_s": wall_s,
        "throughput_rps": len(ok) / wall_s if wall_s > 0 else 0.0,
        "output_tokens_per_s": num_output_tokens / wall_s if wall_s > 0 else 0.0,
        "prompt_tokens": sum(r.num_prompt_tokens for r in ok),
        "output_tokens": num_output_tokens,
        "ttft_s": distribution([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_s": distribution([t for r in ok if (t := r.tpot_s) is not None]),
        "itl_s": distribution([g for r in ok for g in r.chunk_gaps_s]),
        "latency_s": distribution([r.latency_s for r in ok if r.latency_s is not None]),
    }


def render(summary: dict[str, Any]) -> Any:
    """A rich renderable of the summary."""
    from rich.console import Group
    from rich.table import Table

    head = Table(title=f"prfaas bench: {summary['model']} at {summary['url']}", show_header=False)
    head.add_row(
        "requests (completed / failed)",
        f"{summary['requests']} ({summary['completed']} / {summary['failed']})",
    )
    head.add_row("duration", f"{summary['duration_s']:.2f} s")
    head.add_row(
        "throughput",
        f"{summary['throughput_rps']:.3f} req/s, {summary['output_tokens_per_s']:.1f} tok/s",
    )
    head.add_row("429 rejections", str(summary["rejected_429"]))
    for reason, count in summary["failures"].items():
        head.add_row(
            f"failed: {reason}", f"{count}  ({summary['failure_examples'].get(reason, '')[:60]})"
        )
    lat = Table(title="latency (seconds)")
    for col in ("metric", "count", "mean", "P50", "P90", "P99", "max"):
        lat.add_column(col, justify="right")
    for key, label in (
        ("ttft_s", "TTFT"),
        ("tpot_s", "per token (TPOT)"),
        ("itl_s", "inter-token"),
        ("latency_s", "end to end"),
    ):
        d = summary[key]
        cells = [
            f"{d[k]:.4f}" if d[k] is not None else "-" for k in ("mean", "p50", "p90", "p99", "max")
        ]
        lat.add_row(label, str(d["count"]), *cells)
    return Group(head, lat)
