"""Helpers for live-deployment tests: write a deployment, launch it, always tear it down. Calls to
the gateway's control listener and to worker APIs are signed with the deployment's key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from prfaas.config import DeploymentConfig
from prfaas.serve.auth import SignedAuth
from prfaas.serve.control_tls import control_tls, sync_client_options
from prfaas.serve.launcher import Launcher


def timed_deployment(**engine: Any) -> DeploymentConfig:
    # fmt: off
    raw: dict[str, Any] = {
        "engine": {
            "kind": "timed",
            "model": "paper-1t",
            "time_scale": 0.05,
            "byte_divisor": 1000,
            "token_chunk": 16,
            **engine,
        },
        "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 60,
                    "heartbeat_timeout_s": 1.5},
        "policy": {"router": "threshold", "threshold_tokens": 8192},
        "heartbeat_interval_s": 0.2,
        "sites": [
            {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"},
                       {"name": "d1", "role": "decode"}]},
        ],
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 100, "rtt_ms": 10}],
        "psk": "test-key-0123456789abcdef",
    }
    # fmt: on
    return DeploymentConfig.model_validate(raw)


@contextmanager
def launched(deployment: DeploymentConfig, workdir: Path, **launcher: Any) -> Iterator[Launcher]:
    """A started launcher, stopped however the test ends; ``launcher`` goes to ``Launcher``
    (``process_per_node``, ``restart``)."""
    live = Launcher(deployment, workdir, **launcher)
    try:
        live.start(ready_timeout_s=90)
        yield live
    finally:
        live.stop()


def signed(launcher: Launcher, timeout_s: float = 5.0) -> httpx.Client:
    """An httpx client whose every request is signed with the deployment's key (and, with
    ``tls.control_plane``, verifies the listeners' certificate)."""
    psk = launcher.deployment.psk.encode()
    tls = sync_client_options(control_tls(launcher.deployment))
    return httpx.Client(auth=SignedAuth(psk), timeout=timeout_s, trust_env=False, **tls)


def control(launcher: Launcher, path: str) -> Any:
    """``GET`` a control-listener route (``/internal/...``), signed."""
    with signed(launcher) as client:
        r = client.get(f"{launcher.deployment.control_url}{path}")
        r.raise_for_status()
        return r.json()


def routes(launcher: Launcher) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = control(launcher, "/internal/routes")
    return result


def wait_idle(launcher: Launcher, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """Until no node holds a batch or KV; returns the last node listing."""
    deadline = time.monotonic() + timeout_s
    nodes: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        nodes = launcher.nodes()
        if all(n["batch_size"] == 0 and n["kv_used_bytes"] == 0 for n in nodes):
            return nodes
        time.sleep(0.1)
    return nodes
