"""``prfaas k8s FILE... -o DIR``: Kubernetes manifests from deployment files (``prfaas.k8s``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "k8s",
        help="render Kubernetes manifests from deployment files",
        description=(
            "Render each deployment FILE (the same files up, sim and plan take) into "
            "DIR/NAME.yaml: a ConfigMap, the gateway and one workload per site and role, "
            "Services, probes, budgets, NetworkPolicies, a ServiceMonitor and a KEDA "
            "ScaledObject per PrfaaS group; a pool file: its front door and one workload per "
            "node group; a pool's tenant file: its PD site and gateway. No key material unless "
            "--with-secrets (DIR/NAME.secrets.yaml, mode 0600). docs/kubernetes.md."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="deployment YAML")
    p.add_argument("-o", "--out", type=Path, required=True, help="output directory")
    p.add_argument("--image", default="prfaas:0.1.0", help="container image (see Dockerfile)")
    p.add_argument("--namespace", default="prfaas", help="namespace of every object")
    p.add_argument("--name", help="object name prefix (one FILE only; default: the file's stem)")
    p.add_argument("--target", default="1.37", help="Kubernetes version (major.minor)")
    p.add_argument(
        "--site-topology",
        action="append",
        default=[],
        metavar="SITE=REGION[/ZONE]",
        help="place SITE's pods by topology labels (else by the prfaas.io/site node label)",
    )
    p.add_argument("--weights-claim", help="PVC with the model folder (default NAME-weights)")
    p.add_argument(
        "--prometheus-url",
        default="http://prometheus-operated.monitoring.svc:9090",
        help="where KEDA reads prfaas's metrics",
    )
    p.add_argument(
        "--inference-pool",
        action="store_true",
        help="also an InferencePool, the Endpoint Picker (prfaas epp) and an example HTTPRoute",
    )
    p.add_argument("--gateway-name", default="inference-gateway", help="the HTTPRoute's parent")
    p.add_argument(
        "--with-secrets",
        action="store_true",
        help="also write the Secrets (the file's psk, TLS files, API key): test clusters only",
    )
    p.add_argument(
        "--validate",
        action="store_true",
        help="validate offline against the --target schemas (kubernetes-validate)",
    )
    p.add_argument(
        "--crds",
        type=Path,
        help="with --validate: also check custom resources against the CRDs here",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from prfaas.k8s import RenderOptions
    from prfaas.k8s.emit import write_rendering
    from prfaas.k8s.files import render_file
    from prfaas.k8s.options import default_name, parse_topology

    if args.name and len(args.files) > 1:
        raise UsageError("--name: one FILE only (several files are named by their stems)")
    topology = parse_topology(args.site_topology)
    stems = [args.name or default_name(f.stem) for f in args.files]
    if len(set(stems)) != len(stems):
        raise UsageError(f"FILE: two files render to the same name ({stems}); use --name")
    for path, name in zip(args.files, stems, strict=True):
        opts = RenderOptions(
            name=name,
            image=args.image,
            namespace=args.namespace,
            target=args.target,
            topology=topology,
            weights_claim=args.weights_claim,
            prometheus_url=args.prometheus_url,
            with_secrets=args.with_secrets,
        )
        r = render_file(path, opts, args.inference_pool, args.gateway_name)
        for w in r.warnings:
            print(f"prfaas k8s: {path}: warning: {w}", file=sys.stderr)
        if args.validate:
            from prfaas.k8s.validate import validate_all

            if args.crds is None:
                print(
                    f"prfaas k8s: {path}: custom resources not validated (no --crds DIR)",
                    file=sys.stderr,
                )
            problems = validate_all(r.manifests + r.secrets, args.target, args.crds)
            if problems:
                for p in problems:
                    print(f"prfaas k8s: {path}: invalid: {p}", file=sys.stderr)
                return 1
        for written in write_rendering(r, args.out, name, str(path)):
            print(written)
    return 0
