"""``prfaas``: the command line. Thin: parses arguments and calls the drivers.

Each subcommand lives in ``prfaas.commands.<name>`` with a ``register(subparsers)`` function that
adds its parser and sets ``run`` (a function of the parsed args returning an exit status). Heavy
imports (torch, the simulator, servers) happen inside ``run`` so ``prfaas --help`` stays fast.
A ``UsageError`` becomes one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from prfaas.errors import MeasurementError, UsageError

# Subcommand modules, in the order `prfaas --help` lists them. Add one line per new command.
COMMANDS: tuple[str, ...] = (
    "plan",
    "kv",
    "profile",
    "sim",
    "model",
    "bench",
    "tokenizer",
    "serve",
    "up",
    "status",
    "drain",
    "reload",
    "demo",
    "k8s",
    "epp",
    "epp-sidecar",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prfaas",
        description=(
            "Prefill-as-a-Service: plan, simulate and serve hybrid-attention LLMs whose long "
            "prefills run in a remote compute-dense cluster."
        ),
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"prfaas.commands.{name.replace('-', '_')}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.run(args)
    except UsageError as exc:
        print(f"prfaas {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except MeasurementError as exc:
        print(f"prfaas {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"prfaas {args.command}: interrupted", file=sys.stderr)
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
