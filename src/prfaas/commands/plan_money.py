"""``prfaas plan`` in dollars: per deployment its $/hour and $ per million prompt / output tokens
at its ``lambda_max_exact``, at the deployment file's ``prices:`` or the stated assumption
(``analytic.prices``), and the line that prints them.

Owns the mapping of a plan's instances to priced hardware; the prices themselves and the
arithmetic are ``analytic.prices``'. Imports of the analytic layer stay inside the functions.
"""

from __future__ import annotations

import argparse
from typing import Any


def file_prices(args: argparse.Namespace) -> dict[str, float]:
    if args.deployment is None:
        return {}
    from prfaas.config import load_deployment

    return dict(load_deployment(args.deployment).prices)


def plan_money(planner: Any, result: Any, prices: dict[str, float]) -> dict[str, Any]:
    """Per deployment: $/hour and $ per million prompt / output tokens at its ``lambda_max_exact``
    (prices from the file's ``prices:``, else the stated assumption, ``analytic.prices``)."""
    from prfaas.analytic.lengths import mean
    from prfaas.analytic.prices import money

    s = result.scenario
    mean_prompt = mean(s.lengths)
    remote_gpus = planner.remote.hardware.gpus_per_instance
    local_gpus = planner.local.hardware.gpus_per_instance
    out: dict[str, Any] = {}
    for name in ("prfaas", "homogeneous", "naive"):
        d = getattr(result, name)
        instances: dict[str, tuple[int, int]] = {s.local_hardware: (d.n_p + d.n_d, local_gpus)}
        n_remote = getattr(d, "n_prfaas", 0) or 0
        if n_remote:
            count, _ = instances.get(s.prfaas_hardware, (0, remote_gpus))
            instances[s.prfaas_hardware] = (count + n_remote, remote_gpus)
        rate = d.lambda_max_exact
        m = money(instances, prices, rate * mean_prompt, rate * s.output_tokens)
        out[name] = {"unpriced": sorted(instances)} if m is None else m.as_dict()
    return out


def print_money(money: dict[str, Any]) -> None:
    parts = []
    for name, m in money.items():
        if "usd_per_hour" in m:
            parts.append(f"{name} {m['usd_per_hour']:.2f} $/h, "
                         f"{m['usd_per_million_output_tokens']:.2f} $/M output tokens")  # fmt: skip
    if parts:
        source = next((m["prices"] for m in money.values() if "prices" in m), "")
        print(f"Cost at Lambda_max ({source} prices): " + "; ".join(parts) + ".")
