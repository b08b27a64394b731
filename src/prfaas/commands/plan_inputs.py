"""``prfaas plan``'s inputs: the ``analytic.Scenario`` and the two sides' cost models that the
flags describe, over a deployment file's own (its model, hardware or profiles, node counts, link,
workload lengths, prices) or the paper's case study, and the split (``t``, ``N_p``) a file fixes.

Owns the flags' fallbacks and range checks (a ``UsageError`` each); the planning and the output
are ``plan.py``'s and ``plan_report.py``'s. Heavy imports (the analytic model, config) stay inside
the functions, so ``prfaas --help`` stays fast.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError


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


def file_split(args: argparse.Namespace) -> tuple[int | None, int | None]:
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


def scenario_from_args(args: argparse.Namespace) -> Any:
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
