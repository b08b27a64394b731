"""What a deployment file adds to ``prfaas plan`` beyond Eqs. 1-8: the file's one simulated
capacity beside Eqs. 1-8's ``lambda_max_exact`` for the same roles and ``t`` (``prfaas.capacity``),
and an elastic pool's steady-state bound for the file's ``autoscale:`` section
(``commands.sim_elastic.file_bound``), with the lines that print the capacity.

Owns when these apply (a file, not reshaped by flags; one PD site; an ``autoscale:`` section) and
their errors as ``UsageError``; the figures come from the simulator's modules, imported inside.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prfaas.errors import UsageError


def file_capacity(args: argparse.Namespace, planner: Any) -> dict[str, Any] | None:
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


def file_pool_bound(args: argparse.Namespace) -> dict[str, Any] | None:
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


def print_capacity(c: dict[str, Any]) -> None:
    eqs = c["lambda_max_exact_eqs_1_8"]
    print(
        f"Capacity of the file (simulated, the one definition: {c['definition']}): "
        f"{c['capacity_rps']:.3f} req/s"
        + (f"; Eqs. 1-8 exact {eqs:.3f} req/s (x{c['ratio_to_eqs']:.3f})" if eqs else "")
        + "."
    )
    for line in c["eqs_1_8_leave_out"]:
        print(f"  Eqs. 1-8 leave out: {line}")
