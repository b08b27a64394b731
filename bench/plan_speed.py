"""How long `prfaas plan` takes on the paper's case study (target: under 2 s).

Prints the median of several runs of the in-process planner and of the whole CLI process (Python
start-up and imports included). Run: .venv/bin/python bench/plan_speed.py [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from prfaas.analytic import plan

    in_process = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        plan()
        in_process.append(time.perf_counter() - t0)
    cli = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "prfaas.cli", "plan", "--json"],
            check=True,
            capture_output=True,
        )
        cli.append(time.perf_counter() - t0)
    figures = {
        "runs": args.runs,
        "planner_median_s": statistics.median(in_process),
        "cli_median_s": statistics.median(cli),
        "cli_max_s": max(cli),
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"planner in-process: median {figures['planner_median_s']:.3f} s over {args.runs}")
        print(
            f"`prfaas plan --json` process: median {figures['cli_median_s']:.3f} s, "
            f"max {figures['cli_max_s']:.3f} s"
        )


if __name__ == "__main__":
    main()
