"""``prfaas epp --config FILE``: the router as an Endpoint Picker (Envoy ext_proc) beside the
gateway's control plane (``prfaas.serve.epp``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "epp",
        help="serve the router as an Endpoint Picker (Envoy ext_proc, Inference Extension)",
        description=(
            "Serve the Endpoint Picker Protocol over Envoy ext_proc (gRPC) on --grpc-port, with "
            "the gRPC health services (liveness, readiness). Nodes register and heartbeat here "
            "as at a gateway (gateway.control_port); the picked endpoint is a decode node's pod "
            "at --endpoint-port. docs/kubernetes.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--config", type=Path, required=True, help="deployment YAML")
    p.add_argument("--grpc-port", type=int, default=9002, help="ext_proc port")
    p.add_argument("--health-port", type=int, default=9003, help="gRPC health port")
    p.add_argument(
        "--endpoint-port",
        type=int,
        default=8300,
        help="the decode pods' OpenAI port (0: the node's own HTTP port)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from prfaas.config import load_deployment
    from prfaas.serve.epp.run import run_epp

    for flag in ("grpc_port", "health_port", "endpoint_port"):
        value = getattr(args, flag)
        if not 0 <= value <= 65535:
            raise UsageError(f"--{flag.replace('_', '-')}: {value} is not a port")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    d = load_deployment(args.config, require_psk=True)
    d.require_one_pd_site()
    run_epp(d, args.grpc_port, args.health_port or None, args.endpoint_port or None)
    return 0
