"""``prfaas plan``: the paper's throughput model and grid search (defaults = its case study)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError

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


def _base(args: argparse.Namespace) -> Any:
    """What flags not given fall back to: the deployment file's scenario, or the case study."""
    from prfaas.analytic import Scenario

    if args.deployment is None:
        return Scenario()
    from prfaas.config import load_deployment
    from prfaas.scenarios import plan_scenario, workload_lengths

    d = load_deployment(args.deployment)
    wl = workload_lengths(d)  # the trace's lengths when the file names one, cut to the context
    if wl.warning and args.trace is None:
        print(f"warning: {wl.warning}", file=sys.stderr)
    try:
        return plan_scenario(d, profiles_ok=True, lengths=wl.lengths)
    except ValueError as exc:
        raise UsageError(f"{args.deployment}: {exc}") from None


def _file_split(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """(t, N_p) a deployment file fixes: its ``policy.threshold_tokens`` and its PD site's
    prefill nodes (the planner then searches only ``t``, over the file's roles, as the gateway
    and the simulator do: ``scenarios.planned_threshold``); (None, None) without a file or when
    ``--n-local`` resizes it."""
    if args.deployment is None or args.n_local_given:
        return None, None
    from prfaas.config import load_deployment
    from prfaas.scenarios import home_roles

    d = load_deployment(args.deployment)
    n_prfaas, n_p, n_d = home_roles(d)
    if n_prfaas == 0 or n_d == 0 or n_p + n_d != args.n_local:
        return d.policy.threshold_tokens, None
    return d.policy.threshold_tokens, n_p


def _profiles_from_file(args: argparse.Namespace) -> None:
    """A deployment file whose PrfaaS or PD site names a profile file as its hardware stands for
    ``--prfaas-profile`` / ``--local-profile`` (unless those are given)."""
    if args.deployment is None:
        return
    from prfaas.config import load_deployment
    from prfaas.perf import is_profile_file

    d = load_deployment(args.deployment)
    remote = next((s for s in d.sites if s.kind == "prfaas"), None)
    if args.local_profile is None and is_profile_file(d.home_site.hardware):
        args.local_profile = Path(d.home_site.hardware)
    if remote is not None and args.prfaas_profile is None and is_profile_file(remote.hardware):
        args.prfaas_profile = Path(remote.hardware)


def _scenario(args: argparse.Namespace) -> Any:
    from prfaas.analytic import EmpiricalLengths, Scenario, TruncatedLogNormal
    from prfaas.analytic.lengths import cut_to_context
    from prfaas.commands.common import model_arg, read_trace_lengths

    args.n_local_given = args.n_local is not None
    # Flags that make the plan another deployment than the file (its capacity is the file's).
    args.reshaping_flags = [
        flag for flag in ("model", "prfaas_hardware", "local_hardware", "prfaas_profile",
                          "local_profile", "n_prfaas", "n_local", "link_gbps", "mu", "sigma",
                          "min_tokens", "max_tokens", "trace", "output_tokens", "decode_slo",
                          "threshold")
        if getattr(args, flag) is not None
    ]  # fmt: skip
    args.model = model_arg(args.model)  # a preset name, or the ModelSpec of a config
    _profiles_from_file(args)
    apply_profiles(args)  # before the fallbacks: a profile names its model and hardware
    base = _base(args)
    for flag, name in (("model", "model"), ("prfaas_hardware", "prfaas_hardware"),
                       ("local_hardware", "local_hardware"), ("n_prfaas", "n_prfaas"),
                       ("n_local", "n_local"), ("n_homogeneous", "n_homogeneous"),
                       ("link_gbps", "link_gbps"), ("output_tokens", "output_tokens"),
                       ("decode_slo", "decode_slo_tokens_per_s"),
                       ("threshold_step", "threshold_step_tokens"),
                       ("price_ratio", "price_ratio")):  # fmt: skip
        if getattr(args, flag) is None:
            setattr(args, flag, getattr(base, name))
    lengths_base = base.lengths
    length_flags = ("mu", "sigma", "min_tokens", "max_tokens")
    # A file's own workload (its trace, a fixed length, or its log-normal) stands unless a
    # length flag is given.
    keep_file_lengths = (
        args.deployment is not None
        and args.trace is None
        and all(getattr(args, flag) is None for flag in length_flags)
    )
    for flag, name in (("mu", "mu"), ("sigma", "sigma"), ("min_tokens", "lo"),
                       ("max_tokens", "hi")):  # fmt: skip
        if getattr(args, flag) is None:
            # A file with a trace or fixed lengths: the log-normal flags start from the paper's.
            setattr(args, flag, getattr(lengths_base, name, getattr(TruncatedLogNormal(), name)))
    for name in ("n_prfaas", "n_local", "n_homogeneous", "output_tokens", "threshold_step"):
        value = getattr(args, name)
        if value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {value}")
    for name in ("link_gbps", "decode_slo", "price_ratio", "sigma"):
        value = getattr(args, name)
        if not (value > 0 and math.isfinite(value)):
            raise UsageError(f"--{name.replace('_', '-')} must be > 0, got {value:g}")
    if args.n_local < 2 or args.n_homogeneous < 2:
        raise UsageError("--n-local and --n-homogeneous need at least 2 instances (P and D)")
    remote, local = side_costs(args)
    if keep_file_lengths:
        lengths: Any = lengths_base
    elif args.trace is not None:
        lengths = EmpiricalLengths(read_trace_lengths(args.trace), label=str(args.trace))
    else:
        if not 0 < args.min_tokens < args.max_tokens:
            raise UsageError(
                f"need 0 < --min-tokens < --max-tokens, got {args.min_tokens} / {args.max_tokens}"
            )
        try:
            lengths = TruncatedLogNormal(args.mu, args.sigma, args.min_tokens, args.max_tokens)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    # One rule everywhere (analytic.lengths.cut_to_context): prompts longer than the model's
    # context are cut to it, with a warning; plan, sim and the gateway's t read the same cut.
    limit = min(remote.model.max_context_tokens, local.model.max_context_tokens)
    lengths, warning = cut_to_context(lengths, limit, f"{lengths.describe()} ({remote.model.name})")
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return Scenario(
        model=remote.model.name,
        prfaas_hardware=args.prfaas_hardware,
        local_hardware=args.local_hardware,
        n_prfaas=args.n_prfaas,
        n_local=args.n_local,
        n_homogeneous=args.n_homogeneous,
        link_gbps=args.link_gbps,
        lengths=lengths,
        output_tokens=args.output_tokens,
        decode_slo_tokens_per_s=args.decode_slo,
        threshold_step_tokens=args.threshold_step,
        price_ratio=args.price_ratio,
    )


def apply_profiles(args: argparse.Namespace) -> None:
    """Read ``--prfaas-profile`` / ``--local-profile``: their cost models go in
    ``args.profile_costs``, and ``--model`` and each side's hardware name default to what the
    profile was measured for (a ``--model`` naming another model is an error)."""
    from prfaas.commands.common import profile_cost_model

    costs: list[Any] = []
    for path, side in ((args.prfaas_profile, "prfaas"), (args.local_profile, "local")):
        cost = None if path is None else profile_cost_model(path, args.model)
        if cost is not None:
            args.model = args.model or cost.model.name
            setattr(args, f"{side}_hardware", cost.hardware.name)
        costs.append(cost)
    args.profile_costs = tuple(costs)


def side_costs(args: argparse.Namespace) -> tuple[Any, Any]:
    """(PrfaaS, local) cost models: a side's profile file where given, else its presets."""
    from prfaas.commands.common import cost_model_or_usage_error

    remote, local = (
        given or cost_model_or_usage_error(args.model, hardware)
        for given, hardware in zip(
            args.profile_costs, (args.prfaas_hardware, args.local_hardware), strict=True
        )
    )
    if remote.model.name != local.model.name:
        raise UsageError(
            f"the PrfaaS side is model {remote.model.name!r}, the local side "
            f"{local.model.name!r}: profile one model on both"
        )
    return remote, local


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


def _file_prices(args: argparse.Namespace) -> dict[str, float]:
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


def _print_money(money: dict[str, Any]) -> None:
    parts = []
    for name, m in money.items():
        if "usd_per_hour" in m:
            parts.append(f"{name} {m['usd_per_hour']:.2f} $/h, "
                         f"{m['usd_per_million_output_tokens']:.2f} $/M output tokens")  # fmt: skip
    if parts:
        source = next((m["prices"] for m in money.values() if "prices" in m), "")
        print(f"Cost at Lambda_max ({source} prices): " + "; ".join(parts) + ".")


def _print_table(result: Any) -> None:
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


def _file_capacity(args: argparse.Namespace, planner: Any) -> dict[str, Any] | None:
    """With ``--deployment`` (unless ``--n-local``/``--trace`` reshape it): the file's one
    capacity (``prfaas.capacity``: the simulator's rule over the file's roles, shared cores,
    batching, plumbing), beside Eqs. 1-8's ``lambda_max_exact`` for the same roles and ``t``,
    and what those leave out."""
    if args.deployment is None or args.no_capacity:
        return None
    if args.reshaping_flags:
        flags = ", ".join("--" + f.replace("_", "-") for f in args.reshaping_flags)
        print(f"prfaas plan: no capacity of the file: {flags} change the deployment "
              "(simulate the changed file: prfaas sim FILE --find-max-rate)",
              file=sys.stderr)  # fmt: skip
        return None
    from prfaas.capacity import deployment_capacity
    from prfaas.config import load_deployment
    from prfaas.scenarios import home_roles, sim_scenario

    d = load_deployment(args.deployment)
    if len(d.pd_sites) != 1:
        return None
    try:
        sc = sim_scenario(d)
        sc.validate()
        n_prfaas, n_p, n_d = home_roles(d)
        offloads = n_prfaas > 0 and d.policy.router != "local_only"
        t = sc.threshold_tokens if offloads else None
        exact = planner.evaluate(t, n_prfaas if offloads else 0, n_p, n_d).lambda_max_exact
        cap = deployment_capacity(d, sc, exact)
    except ValueError as exc:
        raise UsageError(f"{args.deployment}: capacity: {exc}") from None
    return cap.as_dict()


def _file_pool_bound(args: argparse.Namespace) -> dict[str, Any] | None:
    """With ``--deployment`` whose file has ``autoscale:``: the pool's nodes per interval at
    steady state for the rate over time (``commands.sim_elastic.file_bound``), a bound that
    ignores start-up; None otherwise."""
    if args.deployment is None:
        return None
    from prfaas.commands.sim_elastic import file_bound
    from prfaas.config import load_deployment

    d = load_deployment(args.deployment)
    if d.autoscale is None:
        return None
    try:
        return file_bound(d, args.deployment)
    except (ValueError, OSError) as exc:
        raise UsageError(f"{args.deployment}: autoscale: {exc}") from None


def _print_capacity(c: dict[str, Any]) -> None:
    eqs = c["lambda_max_exact_eqs_1_8"]
    print(
        f"Capacity of the file (simulated, the one definition: {c['definition']}): "
        f"{c['capacity_rps']:.3f} req/s"
        + (f"; Eqs. 1-8 exact {eqs:.3f} req/s (x{c['ratio_to_eqs']:.3f})" if eqs else "")
        + "."
    )
    for line in c["eqs_1_8_leave_out"]:
        print(f"  Eqs. 1-8 leave out: {line}")


def _plot(planner: Any, result: Any, path: Path) -> None:
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


def run(args: argparse.Namespace) -> int:
    from prfaas.analytic import Planner

    scenario = _scenario(args)
    if args.plot is not None and not args.plot.parent.exists():
        raise UsageError(f"--plot: folder {args.plot.parent} does not exist")
    try:
        planner = Planner(scenario, *side_costs(args))
        file_t, file_n_p = _file_split(args)
        lo, hi = scenario.lengths.min_tokens, scenario.lengths.max_tokens
        if file_t is not None and not lo <= file_t <= hi:
            file_t = min(max(file_t, lo), hi)  # same routes: nothing / everything offloaded
        threshold = args.threshold if args.threshold is not None else file_t
        result = planner.plan(threshold, n_p=file_n_p)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    prices = _file_prices(args)
    capacity = _file_capacity(args, planner)
    pool = _file_pool_bound(args)
    if args.json:
        out = result_to_json(result)
        out["money"] = plan_money(planner, result, prices)
        if capacity is not None:
            out["capacity"] = capacity
        if pool is not None:
            out["elastic_pool_bound"] = pool
        print(json.dumps(out, indent=2))
    else:
        _print_table(result)
        _print_money(plan_money(planner, result, prices))
        if capacity is not None:
            _print_capacity(capacity)
        if pool is not None:
            from prfaas.commands.sim_elastic import print_bound

            print("Elastic pool (the file's autoscale: section; its workload, its load shape):")
            print_bound(pool["intervals"])
    if args.plot is not None:
        _plot(planner, result, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0
