"""``prfaas epp-sidecar --config FILE --node NODE``: the decode-side sidecar the Endpoint Picker
routes to (``prfaas.serve.epp.sidecar``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "epp-sidecar",
        help="the decode pod's OpenAI endpoint behind the Endpoint Picker",
        description=(
            "Serve the OpenAI API for the decode NODE(s) of this pod: each request runs its "
            "prefill where the picker's x-prfaas-prefill-node header says (locally after a lost "
            "prefill), then its decode here, through the gateway's dispatcher. The nodes' "
            "endpoints come from the picker's control listener (gateway.control_port)."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", type=Path, required=True, help="deployment YAML")
    p.add_argument("--node", action="append", default=[], help="decode node of this pod")
    p.add_argument("--host", default="0.0.0.0", help="listen address")
    p.add_argument("--port", type=int, default=8300, help="the OpenAI port")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from prfaas.config import load_deployment
    from prfaas.serve.epp.sidecar import run_sidecar

    d = load_deployment(args.config, require_psk=True)
    d.require_one_pd_site()
    if not args.node:
        raise UsageError("--node: name this pod's decode node(s)")
    for name in args.node:
        if d.node(name).role != "decode":
            raise UsageError(f"--node: {name} is not a decode node")
    if not 0 < args.port <= 65535:
        raise UsageError(f"--port: {args.port} is not a port")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    run_sidecar(d, frozenset(args.node), args.host, args.port)
    return 0
