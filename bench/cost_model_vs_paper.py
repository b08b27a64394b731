"""The cost model's Phi_kv beside the paper's Table 3 (8xH200, SGLang), with the error of each cell.

Presets without a shipped profile answer from the roofline, whose per-hardware efficiency and
overhead were calibrated once on the paper's own 1T profile (never per model). Prints a Markdown
table (pasted into docs/cost-model.md). Run: .venv/bin/python bench/cost_model_vs_paper.py
"""

from __future__ import annotations

from prfaas.analytic import phi_kv_gbps
from prfaas.perf import cost_model_for

LENGTHS = (1024, 8192, 32768, 131072)
# Paper Table 3 (Gbps, one 8xH200 instance) and Table 5 for the internal 1T model.
PAPER = {
    "kimi-linear-48b": (1.19, 2.29, 3.87, 4.88),
    "mimo-v2-flash": (0.82, 2.85, 4.66, 4.71),
    "qwen3.5-397b-a17b": (4.13, 6.28, 8.25, 7.47),
    "minimax-m2.5": (4.94, 32.87, 59.93, 47.82),
    "qwen3-235b-a22b": (4.12, 22.42, 33.35, 21.50),
    "paper-1t": (3.61, 3.59, 3.19, 2.62),
}


def main() -> None:
    print("| model | source | " + " | ".join(f"{n // 1024}K ours / paper (err)" for n in LENGTHS))
    print("|---|---|" + "---|" * len(LENGTHS))
    errors = []
    for model, paper in PAPER.items():
        cost = cost_model_for(model, "h200")
        cells = []
        for length, ref in zip(LENGTHS, paper, strict=True):
            ours = phi_kv_gbps(cost, length)
            err = ours / ref - 1
            if cost.source.startswith("roofline"):
                errors.append(abs(err))
            cells.append(f"{ours:.2f} / {ref:.2f} ({err:+.0%})")
        print(f"| {model} | {cost.source} | " + " | ".join(cells) + " |")
    errors.sort()
    print(
        f"\nroofline cells: {len(errors)}, median |error| {errors[len(errors) // 2]:.0%}, "
        f"max {errors[-1]:.0%}"
    )


if __name__ == "__main__":
    main()
