"""``prfaas plan``: the paper's throughput model and grid search (defaults = its case study).

The command: its flags (``register``) and ``run``. Its inputs from the flags and a deployment file
are ``plan_inputs.py``, the report (table, JSON, Fig. 5) ``plan_report.py``, the money
``plan_money.py``, the file's simulated capacity and pool bound ``plan_capacity.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prfaas.commands.plan_capacity import file_capacity, file_pool_bound, print_capacity
from prfaas.commands.plan_inputs import file_split, scenario_from_args, side_costs
from prfaas.commands.plan_money import file_prices, plan_money, print_money
from prfaas.commands.plan_report import plot, print_table, result_to_json
from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan",
        help="throughput model and best threshold/split (the paper's Eqs. 1-8)",
        description=(
            "Grid-search the offload threshold t and the local prefill/decode split N_p/N_d that "
            "maximise sustainable throughput (paper Eqs. 1-8), and compare with the homogeneous "
            "PD baseline and naive heterogeneous PD. Defaults reproduce the paper's case study."
        ),
    )
    p.add_argument(
        "--deployment", type=Path, default=None, metavar="FILE",
        help="deployment file (as for prfaas up and sim): its model, hardware, node counts, "
        "link, workload lengths and prices; flags override it",
    )  # fmt: skip
    a = p.add_argument
    a("--model", default=None, help="model preset (see `prfaas kv --help`), or a Hugging Face "
      "config.json / model folder (timings from the roofline unless a profile is given) "
      "[paper: paper-1t]")  # fmt: skip
    a("--prfaas-hardware", default=None, help="hardware of the PrfaaS cluster [paper: h200]")
    a("--local-hardware", default=None, help="hardware of the local PD cluster [paper: h20]")
    a(
        "--prfaas-profile",
        type=Path,
        default=None,
        metavar="FILE",
        help="profile file of the PrfaaS cluster (`prfaas profile`), instead of its hardware",
    )
    a(
        "--local-profile",
        type=Path,
        default=None,
        metavar="FILE",
        help="profile file of the local PD cluster (prefill and decode), instead of its hardware",
    )
    a("--n-prfaas", type=int, default=None, help="PrfaaS instances [paper: 4]")
    a("--n-local", type=int, default=None, help="local PD instances, N_p + N_d [paper: 8]")
    a("--n-homogeneous", type=int, default=None, help="instances of the baseline [paper: 12]")
    a("--link-gbps", type=float, default=None, help="PrfaaS egress bandwidth [paper: 100]")
    a("--mu", type=float, default=None, help="log-normal mu of prompt length [paper: 9.90]")
    a("--sigma", type=float, default=None, help="log-normal sigma [paper: 1.00]")
    a("--min-tokens", type=int, default=None, help="shortest prompt (truncation) [paper: 128]")
    a("--max-tokens", type=int, default=None, help="longest prompt (truncation) [paper: 131072]")
    a("--trace", type=Path, default=None,
      help="Mooncake JSONL trace: its prompt lengths replace the log-normal")  # fmt: skip
    a("--output-tokens", type=int, default=None, help="output length L_out [paper: 1024]")
    a("--decode-slo", type=float, default=None, help="decode tokens/s per request [paper: 40]")
    a("--threshold", type=int, default=None, help="fix t instead of searching it")
    a("--threshold-step", type=int, default=None, help="grid step of t, tokens [paper: 100]")
    a("--price-ratio", type=float, default=None,
      help="PrfaaS GPU price / local GPU [paper: 2; a file's prices: give it]")  # fmt: skip
    p.add_argument(
        "--no-capacity", action="store_true",
        help="with --deployment: skip the file's simulated capacity (capacity.py: the one "
        "definition, as sim --find-max-rate; it takes seconds)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object (schema: README)")
    p.add_argument("--plot", type=Path, default=None, help="write the paper's Fig. 5 to this PNG")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from prfaas.analytic import Planner

    scenario = scenario_from_args(args)
    if args.plot is not None and not args.plot.parent.exists():
        raise UsageError(f"--plot: folder {args.plot.parent} does not exist")
    try:
        planner = Planner(scenario, *side_costs(args))
        file_t, file_n_p = file_split(args)
        lo, hi = scenario.lengths.min_tokens, scenario.lengths.max_tokens
        if file_t is not None and not lo <= file_t <= hi:
            file_t = min(max(file_t, lo), hi)  # same routes: nothing / everything offloaded
        threshold = args.threshold if args.threshold is not None else file_t
        result = planner.plan(threshold, n_p=file_n_p)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    prices = file_prices(args)
    capacity = file_capacity(args, planner)
    pool = file_pool_bound(args)
    if args.json:
        out = result_to_json(result)
        out["money"] = plan_money(planner, result, prices)
        if capacity is not None:
            out["capacity"] = capacity
        if pool is not None:
            out["elastic_pool_bound"] = pool
        print(json.dumps(out, indent=2))
    else:
        print_table(result)
        print_money(plan_money(planner, result, prices))
        if capacity is not None:
            print_capacity(capacity)
        if pool is not None:
            from prfaas.commands.sim_elastic import print_bound

            print("Elastic pool (the file's autoscale: section; its workload, its load shape):")
            print_bound(pool["intervals"])
    if args.plot is not None:
        plot(planner, result, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0
