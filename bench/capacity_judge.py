"""How a capacity step's judge behaves with the step's length: the simulator (deterministic, so
only the judge varies) runs a fidelity workload's requests at a constant rate over a grid of
rates, and each step is judged by

- ``trend``: ``serve/loadgen/maxrate.py``'s rule, the least-squares trend of the requests'
  latencies against their send times (at most ``LiveRule.max_trend`` s per s);
- ``in flight``: the rule before 2026-12-05, the requests in flight at half the sending window
  and at its end (growth at most 2% of the window in seconds of arrivals).

A judge fit to find a capacity passes every step below some rate and fails every step above it,
and finds about what a long step finds. Prints one line per step length: ``P`` passed, ``.``
failed, per rate.

    .venv/bin/python bench/capacity_judge.py --workdir /tmp/fid12 --seed 1122388127

The deployment and profiles are a fidelity run's (``bench/fidelity.py --workdir``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from prfaas.serve.loadgen.maxrate import LiveRule, LiveStep, judge_step


def _fidelity() -> ModuleType:
    """``bench/fidelity.py`` (its workloads and its simulator runner)."""
    spec = importlib.util.spec_from_file_location(
        "fidelity_bench", Path(__file__).resolve().parent / "fidelity.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def in_flight_passes(step: LiveStep, growth_fraction: float = 0.02) -> bool:
    """The rule before 2026-12-05, from a step's in-flight counts."""
    growth_s = (step.in_flight_end - step.in_flight_half) / step.rate_rps
    return growth_s <= growth_fraction * step.window_s


def main(argv: Sequence[str] | None = None) -> int:
    fid = _fidelity()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/prfaas-fidelity"))
    p.add_argument("--shape", choices=fid.SHAPES, default="lognormal")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--requests", type=int, nargs="+", default=[60, 240, 1500])
    p.add_argument("--rates", type=float, nargs=3, default=(3.0, 8.0, 0.25),
                   metavar=("FROM", "TO", "STEP"))  # fmt: skip
    args = p.parse_args(argv)
    deployment = args.workdir / "fidelity-deployment.yaml"
    if not deployment.is_file():
        p.error(f"no {deployment}: run bench/fidelity.py --workdir {args.workdir} first")
    gen = fid.session_specs if args.shape == "sessions" else fid.lognormal_specs
    lo, hi, step = args.rates
    rates = [lo + step * k for k in range(int((hi - lo) / step + 1e-9) + 1)]
    print(f"{args.shape} seed {args.seed}, rates {lo:g}-{hi:g} req/s; per rate: trend judge, "
          "in-flight judge (P passed, . failed)")  # fmt: skip
    for n in args.requests:
        specs = gen(args.seed, n, 47)
        cells = []
        for rate in rates:
            paced = fid.uniform_at_rate(specs, rate)
            results = fid.as_results(fid.run_sim(deployment, paced), paced)
            st = judge_step(results, rate, paced[-1].arrival_s, LiveRule())
            cells.append(
                f"{rate:g}:{'P' if st.passed else '.'}{'P' if in_flight_passes(st) else '.'}"
            )
        print(f"{n:5d} requests  " + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
