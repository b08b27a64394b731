"""``prfaas serve``: run one process of a deployment (the gateway, or nodes of one site)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prfaas.commands.common import check_api_key_env
from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the gateway or prefill/decode nodes of a deployment",
        description=(
            "Run one process of the deployment described by --config. On real hosts, start "
            "the gateway once and each node on its own host; `prfaas up` does all of it on one "
            "machine. Nodes register with the gateway's control listener "
            "(gateway.control_port) and heartbeat their load; every call between the "
            "processes is signed with the file's psk, which must be set."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--role", required=True, choices=("gateway", "prefill", "decode", "node"),
        help="gateway; or the role of the --node(s) (node: nodes of mixed roles of one site)",
    )  # fmt: skip
    p.add_argument("--config", type=Path, required=True, help="deployment YAML")
    p.add_argument("--node", action="append", default=[], help="node name (repeatable)")
    p.add_argument("--host", default="127.0.0.1", help="address the nodes listen on")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from prfaas.commands.launch_checks import check_model_folders
    from prfaas.config import load_deployment
    from prfaas.serve.run import run_gateway, run_worker

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    # Processes started one by one must share the file's key: no random per-process default.
    d = load_deployment(args.config, require_psk=True)
    check_api_key_env()
    d.require_one_pd_site()
    if args.role == "gateway":
        if args.node:
            raise UsageError("--node is for node processes, not the gateway")
        _refuse_placeholder_key(args.config, d.psk, d.accept_psks)
        check_model_folders(d, [d.home_site.name])  # the gateway's tokenizer
        run_gateway(d, config_path=args.config)
        return 0
    if not args.node:
        raise UsageError(f"--role {args.role} needs at least one --node NAME")
    if d.gateway.control_port == 0:
        raise UsageError(
            f"{args.config}: gateway.control_port: 0 picks a free port at the gateway, which "
            "nodes cannot know: give the gateway's real control port"
        )
    for name in args.node:
        node = d.node(name)
        if args.role != "node" and node.role != args.role:
            raise UsageError(f"node {name} has role {node.role}, not {args.role}")
    sites = {d.site_of(n).name for n in args.node}
    if len(sites) > 1:
        raise UsageError(f"one process hosts nodes of one site, got {sorted(sites)}")
    _refuse_placeholder_key(args.config, d.psk, d.accept_psks)
    check_model_folders(d, sites)
    run_worker(d, args.node, host=args.host, config_path=args.config)
    return 0


def _refuse_placeholder_key(path: Path, psk: str, accept_psks: list[str]) -> None:
    import os

    from prfaas.serve.keyring import LAUNCHED_BY_UP_ENV, placeholder_in

    if os.environ.get(LAUNCHED_BY_UP_ENV) == "1":
        return  # `prfaas up` warned already: these are its own children on one machine
    key = placeholder_in(psk, accept_psks)
    if key is not None:
        raise UsageError(
            f"{path}: psk: {key!r} is the examples' public placeholder: anyone could sign control "
            "calls and KV handshakes with it. Put a secret of your own in the file (e.g. the "
            "output of `openssl rand -hex 32`)"
        )
