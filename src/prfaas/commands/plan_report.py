"""``prfaas plan``'s report of the three deployments it compares (PrfaaS-PD, homogeneous PD, naive
heterogeneous PD): the JSON object (``result_to_json``, schema in the README), the table, and the
paper's Fig. 5 as a PNG.

Owns only the presentation of a ``Planner``'s result; nothing here plans or reads files but the
PNG it writes. rich and matplotlib are imported inside the functions that draw.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

_PRFAAS_KEYS = (
    "threshold_tokens", "n_prfaas", "n_p", "n_d", "theta_prfaas", "theta_pdp", "theta_pdd",
    "lambda_max", "lambda_max_exact", "p_offload", "mean_offloaded_tokens", "mean_local_tokens",
    "ttft_mean_s", "ttft_p90_s", "egress_gbps", "num_gpus", "cost_units",
)  # fmt: skip


_HOMOGENEOUS_KEYS = (
    "n_p", "n_d", "theta_pdp", "theta_pdd", "lambda_max", "lambda_max_exact",
    "ttft_mean_s", "ttft_p90_s", "num_gpus", "cost_units",
)  # fmt: skip


_NAIVE_KEYS = (
    "n_prfaas", "n_d", "theta_prfaas", "theta_pdd", "lambda_max", "lambda_max_exact",
    "ttft_mean_s", "ttft_p90_s", "egress_gbps", "num_gpus", "cost_units",
)  # fmt: skip


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def result_to_json(result: Any) -> dict[str, Any]:
    def pick(plan: Any, keys: tuple[str, ...]) -> dict[str, Any]:
        return {k: _clean(getattr(plan, k)) for k in keys}

    s = result.scenario
    return {
        "prfaas": pick(result.prfaas, _PRFAAS_KEYS),
        "homogeneous": pick(result.homogeneous, _HOMOGENEOUS_KEYS),
        "naive": pick(result.naive, _NAIVE_KEYS),
        "ratios": {
            "prfaas_vs_homogeneous": result.prfaas_vs_homogeneous,
            "prfaas_vs_naive": result.prfaas_vs_naive,
            "equal_cost_prfaas_vs_homogeneous": result.equal_cost_gain,
        },
        "checks": {
            "eq7_remote_rps": result.check.eq7_remote_rps,
            "eq7_local_rps": result.check.eq7_local_rps,
            "eq7_holds": result.check.eq7_holds,
            "eq8_prefill_rps": result.check.eq8_prefill_rps,
            "eq8_decode_rps": result.check.eq8_decode_rps,
            "eq8_holds": result.check.eq8_holds,
        },
        "decode": {"max_batch": result.decode.max_batch, "step_s": result.decode.step_s},
        "sources": dict(result.prefill_sources),
        "scenario": {
            "model": s.model,
            "prfaas_hardware": s.prfaas_hardware,
            "local_hardware": s.local_hardware,
            "link_gbps": s.link_gbps,
            "lengths": s.lengths.describe(),
            "output_tokens": s.output_tokens,
            "decode_slo_tokens_per_s": s.decode_slo_tokens_per_s,
            "price_ratio": s.price_ratio,
        },
    }


def print_table(result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    s = result.scenario
    table = Table(
        title=f"prfaas plan: {s.model}, {s.lengths.describe()}, link {s.link_gbps:g} Gbps"
    )
    table.add_column("")
    for title in ("PrfaaS-PD", "Homogeneous PD", "Naive heterogeneous"):
        table.add_column(title, justify="right")
    pf, ho, na = result.prfaas, result.homogeneous, result.naive

    def f(x: float, digits: int = 2) -> str:
        return "-" if x is None or not math.isfinite(x) or x == 0 else f"{x:.{digits}f}"

    rows = [
        ("threshold t (tokens)", f"{pf.threshold_tokens:,}", "-", "-"),
        ("N_prfaas / N_p / N_d", f"{pf.n_prfaas} / {pf.n_p} / {pf.n_d}",
         f"- / {ho.n_p} / {ho.n_d}", f"{na.n_prfaas} / - / {na.n_d}"),
        ("Theta prfaas / pdp / pdd (req/s)",
         *(f"{f(d.theta_prfaas)} / {f(d.theta_pdp)} / {f(d.theta_pdd)}" for d in (pf, ho, na))),
        ("Lambda_max (req/s, paper's shortcut)", *(f(d.lambda_max, 3) for d in (pf, ho, na))),
        ("Lambda_max exact service (req/s)", *(f(d.lambda_max_exact, 3) for d in (pf, ho, na))),
        ("vs homogeneous", f"{result.prfaas_vs_homogeneous:.2f}x", "1.00x",
         f"{na.lambda_max / ho.lambda_max:.2f}x"),
        ("offloaded share p", f(pf.p_offload, 3), "0", f(na.p_offload, 3)),
        ("mean / P90 TTFT (s)",
         *(f"{d.ttft_mean_s:.2f} / {d.ttft_p90_s:.2f}" for d in (pf, ho, na))),
        ("PrfaaS egress (Gbps)", f(pf.egress_gbps, 1), "-", f(na.egress_gbps, 1)),
        ("GPUs (cost units)", *(f"{d.num_gpus} ({d.cost_units:g})" for d in (pf, ho, na))),
    ]  # fmt: skip
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    c = result.check
    console.print(
        f"Equal cost (PrfaaS GPU = {s.price_ratio:g}x local): "
        f"{result.equal_cost_gain:.2f}x the homogeneous throughput per cost unit. "
        f"Eq. 7 {'holds' if c.eq7_holds else 'FAILS'} "
        f"({c.eq7_remote_rps:.2f} vs {c.eq7_local_rps:.2f} req/s); Eq. 8 "
        f"{'holds' if c.eq8_holds else 'FAILS'} within one instance "
        f"({c.eq8_prefill_rps:.2f} vs {c.eq8_decode_rps:.2f} req/s)."
    )
    src, dec = result.prefill_sources, result.decode
    console.print(
        f"Timing: PrfaaS prefill {src['prfaas']}, local prefill {src['local']}, decode "
        f"{src['decode']} (BS_max {dec.max_batch}, step {dec.step_s * 1e3:.1f} ms)."
    )


def plot(planner: Any, result: Any, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = planner.figure5(result)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(data["thresholds"] / 1000, data["lambda_vs_t"])
    left.axvline((result.prfaas.threshold_tokens or 0) / 1000, linestyle="--", color="gray")
    left.set_xlabel("threshold t (K tokens)")
    left.set_ylabel("Lambda_max (req/s)")
    left.set_title(f"Lambda vs t at N_p/N_d = {result.prfaas.n_p}/{result.prfaas.n_d}")
    right.plot(data["n_p"], data["prefill_bound"], marker="o", label="prefill-bound")
    right.plot(data["n_p"], data["decode_bound"], marker="s", label="decode-bound")
    right.set_xlabel("N_p (local prefill instances)")
    right.set_ylabel("req/s")
    right.set_title("prefill bound (best t per N_p) and decode bound")
    right.legend()
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    tmp.replace(path)  # never leave a half-written file under the requested name
    plt.close(fig)
