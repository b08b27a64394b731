"""``prfaas kv``: the KV-throughput table Phi_kv (with S_kv, T_prefill) of a model on hardware."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError

DEFAULT_LENGTHS = (1024, 8192, 32768, 131072)


def register(subparsers: Any) -> None:
    from prfaas.spec import hardware_names, model_names

    p = subparsers.add_parser(
        "kv",
        help="KV cache size, prefill time and KV throughput per instance (paper Eq. 1)",
        description=(
            "For each prompt length: S_kv (bytes of the request's KV cache and states), "
            "T_prefill on one instance, and Phi_kv = S_kv / T_prefill, the egress one instance "
            "needs (paper Eq. 1, Tables 3 and 5). Models: " + ", ".join(model_names())
            + ". Hardware: " + ", ".join(hardware_names()) + "."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--model",
        default=None,
        help="model preset, or a Hugging Face config.json / model folder (its cache spec and "
        "parameter count; timings from the roofline) [paper-1t, or the profile's model]",
    )
    p.add_argument("--hardware", default="h200", help="hardware preset")
    p.add_argument(
        "--profile", type=Path, default=None, metavar="FILE",
        help="profile file (`prfaas profile`): its timings instead of --hardware's",
    )  # fmt: skip
    p.add_argument(
        "--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS), help="prompt lengths"
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of rows")
    p.set_defaults(run=run)


def kv_rows(
    model: str | None, hardware: str, lengths: list[int], profile: Path | None = None
) -> list[dict[str, Any]]:
    from prfaas.analytic import phi_kv_gbps
    from prfaas.commands.common import cost_model_or_usage_error, model_arg, profile_cost_model

    spec = model_arg(model)
    if profile is not None:
        cost = profile_cost_model(profile, spec)
    else:
        cost = cost_model_or_usage_error(spec or "paper-1t", hardware)
    limit = cost.model.max_context_tokens
    rows = []
    for length in lengths:
        if not 0 < length <= limit:
            raise UsageError(f"length {length} is outside 1..{limit} for {cost.model.name}")
        rows.append(
            {
                "length": length,
                "s_kv_bytes": cost.kv_bytes(length),
                "t_prefill_s": cost.prefill_s(length),
                "phi_kv_gbps": phi_kv_gbps(cost, length),
                "source": cost.prefill_source,
            }
        )
    return rows


def run(args: argparse.Namespace) -> int:
    rows = kv_rows(args.model, args.hardware, args.lengths, args.profile)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    if args.profile is not None:
        title = f"KV throughput per instance, from profile file {args.profile}"
    else:
        title = f"KV throughput of {args.model or 'paper-1t'} on one {args.hardware} instance"
    table = Table(title=title)
    for col in ("length", "S_kv (MiB)", "T_prefill (s)", "Phi_kv (Gbps)", "source"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r['length']:,}",
            f"{r['s_kv_bytes'] / 2**20:.1f}",
            f"{r['t_prefill_s']:.3f}",
            f"{r['phi_kv_gbps']:.2f}",
            r["source"],
        )
    Console().print(table)
    return 0
