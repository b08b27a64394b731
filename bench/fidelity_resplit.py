"""Re-simulate a saved ``bench/fidelity.py --json`` run with its profiles' decode terms split
anew, against the live figures that run measured (no live run here: simulations only).

Each profile's ``decode_per_output_token_s + decode_per_step_s`` (the decode node's per-token CPU
at batch 1) is split by ``perf.plumbing.split_decode_overhead`` with an engine step overhead of
``--per-step-s + --per-request-s x b`` at batch 1 and 8 (what ``prfaas profile`` measures in
``commands/profile_step.py``); the split profiles and deployment file are written to ``--out``.
For each row of the saved run: burst throughput and step-searched capacity (the bench's rule and
steps) and TTFT P50/P90 at its load points, sim/live, for the saved charging ("as saved") and the
new split. ``--per-step-s`` large (it is capped at the batch-1 figure less ``--per-request-s``)
gives the other extreme: nearly all of the batch-1 figure paid once per step. ``--terms-from
FILE`` takes both decode terms from another profile as they stand (e.g. one whose split was
measured live).

    .venv/bin/python bench/fidelity_resplit.py --json fidelity.json --per-step-s 0.00055 \\
        --per-request-s 0.00021 --out /tmp/resplit
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

BENCH = Path(__file__).resolve().parent / "fidelity.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_split(
    saved: dict[str, Any], per_step_s: float, per_request_s: float, out: Path,
    terms_from: Path | None = None, shared_core_overhead: float | None = None,
) -> Path:  # fmt: skip
    from prfaas.perf.plumbing import split_decode_overhead
    from prfaas.perf.profile_read import load_profile_file
    from prfaas.perf.profile_write import dump_profile_file

    deployment = Path(saved["deployment"])
    data = yaml.safe_load(deployment.read_text())
    overhead = {1: per_step_s + per_request_s, 8: per_step_s + 8 * per_request_s}
    for site in data["sites"]:
        src = deployment.parent / site["hardware"]
        pf = load_profile_file(src)
        p = pf.plumbing
        batch1 = p.decode_per_output_token_s + p.decode_per_step_s
        split = split_decode_overhead(overhead, batch1)
        if terms_from is not None:  # another profile's measured pair, as it stands
            q = load_profile_file(terms_from).plumbing
            split = replace(split, per_step_s=q.decode_per_step_s,
                            per_output_token_s=q.decode_per_output_token_s)  # fmt: skip
        print(f"{site['name']}: batch-1 {batch1 * 1e3:.3f} ms -> per step "
              f"{split.per_step_s * 1e3:.3f} ms + per token {split.per_output_token_s * 1e3:.3f} "
              "ms")  # fmt: skip
        missing = tuple(t for t in p.missing if t != "decode_per_step_s")
        plumbing = replace(p, decode_per_step_s=split.per_step_s,
                           decode_per_output_token_s=split.per_output_token_s,
                           missing=missing)  # fmt: skip
        if shared_core_overhead is not None:  # the time-sharing term, set
            missing = tuple(t for t in missing if t != "shared_core_overhead")
            plumbing = replace(plumbing, shared_core_overhead=shared_core_overhead,
                               missing=missing)  # fmt: skip
        dst = out / src.name
        dump_profile_file(replace(pf, plumbing=plumbing), dst)
        site["hardware"] = str(dst)
    path = out / "split-deployment.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="a saved bench/fidelity.py --json")
    p.add_argument("--per-step-s", type=float, default=0.0)
    p.add_argument("--per-request-s", type=float, default=0.0)
    p.add_argument(
        "--terms-from", type=Path,
        help="take both decode terms from this profile instead (ignores --per-*-s)",
    )  # fmt: skip
    p.add_argument(
        "--shared-core-overhead", type=float, metavar="FRACTION",
        help="set the profiles' shared_core_overhead to this (e.g. what a newer profile "
        "measured; with --terms-from the saved profile, only this term changes)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="folder for the split files")
    args = p.parse_args()
    fid = _bench()
    saved = json.loads(args.json.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    split = write_split(saved, args.per_step_s, args.per_request_s, args.out, args.terms_from,
                        args.shared_core_overhead)  # fmt: skip
    sides = {"as saved": Path(saved["deployment"]), "split": split}
    print("| shape | seed | charging | burst sim/live | capacity sim/live | TTFT sim/live |")
    print("|---|---|---|---|---|---|")
    for row in saved["rows"]:
        specs = fid.workload_specs(row["shape"], row["seed"], saved["requests"],
                                   saved["mean_output"], saved.get("engine", "torch"))  # fmt: skip
        for name, deployment in sides.items():

            def sim(rate: float, d: Path = deployment, sp: Any = specs) -> Any:
                return fid.run_sim(d, fid.at_rate(sp, rate))

            burst = fid.summarize(sim(1e6))["throughput_rps"]
            if saved.get("capacity_rule") == "one":  # prfaas bench --find-max-rate's rule
                cap = fid.one_rule_capacity(
                    lambda paced, d=deployment: fid.run_sim(d, paced), specs, burst,
                    saved["start_step"],
                )[0]  # fmt: skip
            else:  # a run before 2026-12-05: the rule its live capacity was measured by
                cap = fid.step_capacity(sim, burst, saved["steps"])[0]
            cells = [row["shape"], str(row["seed"]), name,
                     f"{burst / row['burst']['live_rps']:.2f}",
                     f"{cap / row['capacity']['live_rps']:.2f}"]  # fmt: skip
            ttft = []
            for load, pt in row["loads"].items():
                s = fid.summarize(sim(pt["rate_rps"]))
                ttft.append(f"{load}: P50 {s['ttft_p50_s'] / pt['live']['ttft_p50_s']:.2f} "
                            f"P90 {s['ttft_p90_s'] / pt['live']['ttft_p90_s']:.2f}")  # fmt: skip
            cells.append("; ".join(ttft))
            print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
