"""What ``prfaas status`` and ``prfaas drain`` share: the deployment file they are given (its key
and the gateway's real ports), a signed ``ControlClient``, and the split of failures into a user's
mistake (``UsageError``: exit 2) and a gateway that does not answer (``Unreachable``: exit 1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from prfaas.errors import UsageError

if TYPE_CHECKING:
    from prfaas.config import DeploymentConfig
    from prfaas.serve.control_client import ControlRefused


def load_with_ports(path: Path) -> DeploymentConfig:
    """The file, with its key, naming the gateway's real ports (not 0)."""
    from prfaas.config import load_deployment

    d = load_deployment(path, require_psk=True)
    zero = [name for name in ("port", "control_port") if getattr(d.gateway, name) == 0]
    if zero:
        fields = " and ".join(f"gateway.{name}" for name in zero)
        verb = "are" if len(zero) > 1 else "is"
        raise UsageError(
            f"{path}: {fields} {verb} 0 (a free port is picked when the gateway starts): pass the "
            "resolved file `prfaas up` wrote, WORKDIR/deployment.resolved.yaml"
        )
    return d


def refusal_error(path: Path, exc: ControlRefused) -> UsageError | None:
    """A refusal that is the user's to fix (the wrong key, an unknown node), else None."""
    if exc.status == 401:
        return UsageError(
            f"the gateway at {exc.url} refused the key (psk) in {path}: {exc.message}"
        )
    if exc.status == 404:
        return UsageError(f"{exc.url}: {exc.message}")
    return None


def control_failure(command: str, path: Path, exc: Exception) -> int:
    """What ``prfaas status`` / ``drain`` do when a control call fails: a refusal that is the
    user's to fix is a ``UsageError`` (exit 2); anything else (``GatewayUnreachable``, another
    refusal) is printed, exit status 1."""
    from prfaas.serve.control_client import ControlRefused

    if isinstance(exc, ControlRefused):
        user = refusal_error(path, exc)
        if user is not None:
            raise user from None
    print(f"prfaas {command}: error: {exc}", file=sys.stderr)
    return 1
