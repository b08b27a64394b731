"""A deployment started as separate ``prfaas serve`` processes (no launcher: the multi-host path),
on free ports, always stopped (each child in its own process group). With ``tls.control_plane``
in the file, its signed client calls the control listener and the nodes over HTTPS."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from prfaas.config import DeploymentConfig
from prfaas.serve.auth import SignedAuth
from prfaas.serve.control_tls import ControlTLS, control_tls, scheme, sync_client_options

PSK = "control-test-key-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deployment_dict(psk: str | None = PSK) -> dict[str, Any]:
    # fmt: off
    raw: dict[str, Any] = {
        "engine": {"kind": "timed", "model": "paper-1t", "time_scale": 0.05,
                   "byte_divisor": 1000, "token_chunk": 16},
        "gateway": {"port": free_port(), "control_port": free_port(), "request_timeout_s": 30,
                    "heartbeat_timeout_s": 1.5},
        "policy": {"router": "threshold", "threshold_tokens": 8192},
        "heartbeat_interval_s": 0.2,
        "sites": [
            {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
        ],
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 100, "rtt_ms": 10}],
    }
    # fmt: on
    if psk is not None:
        raw["psk"] = psk
    return raw


@dataclass
class Cluster:
    config: dict[str, Any]
    path: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    tls: ControlTLS | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config['gateway']['port']}"

    @property
    def control_url(self) -> str:
        return f"{scheme(self.tls)}://127.0.0.1:{self.config['gateway']['control_port']}"

    def signed(self, psk: str = PSK) -> httpx.Client:
        return httpx.Client(
            auth=SignedAuth(psk.encode()),
            timeout=5.0,
            trust_env=False,
            **sync_client_options(self.tls),
        )

    def nodes(self) -> list[dict[str, Any]]:
        with self.signed() as c:
            r = c.get(f"{self.control_url}/internal/nodes")
            r.raise_for_status()
            result: list[dict[str, Any]] = r.json()
            return result

    def endpoints(self) -> dict[str, dict[str, Any]]:
        with self.signed() as c:
            return {e["node"]: e for e in c.get(f"{self.control_url}/internal/endpoints").json()}

    def node_url(self, node: str) -> str:
        ep = self.endpoints()[node]
        return f"{scheme(self.tls)}://{ep['host']}:{ep['http_port']}"


def spawn(path: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "prfaas.cli", "serve", "--config", str(path), *args]
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _wait(what: str, ok: Any, c: Cluster, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p, log in zip(c.procs, c.logs, strict=True):
            if p.poll() is not None:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(
                    f"{log.stem} exited ({p.returncode}) while waiting for {what}:\n{tail}"
                )
        with contextlib.suppress(httpx.HTTPError):
            if ok():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")


@contextmanager
def cluster(workdir: Path, config: dict[str, Any] | None = None) -> Iterator[Cluster]:
    """The gateway, then one worker per site, each a ``prfaas serve`` process."""
    config = config or deployment_dict()
    path = workdir / "deployment.yaml"
    path.write_text(yaml.safe_dump(config))
    c = Cluster(config, path, tls=control_tls(DeploymentConfig.model_validate(config)))
    try:
        c.logs.append(workdir / "gateway.log")
        c.procs.append(spawn(path, ["--role", "gateway"], c.logs[-1]))
        _wait("the gateway", lambda: httpx.get(f"{c.url}/v1/models").status_code == 200, c, 60)
        for site in config["sites"]:
            args = ["--role", "node"]
            for n in site["nodes"]:
                args += ["--node", n["name"]]
            c.logs.append(workdir / f"{site['name']}.log")
            c.procs.append(spawn(path, args, c.logs[-1]))
        names = {n["name"] for s in config["sites"] for n in s["nodes"]}
        _wait("the nodes", lambda: names <= {n["node"] for n in c.nodes() if n["in_rotation"]},
              c, 60)  # fmt: skip
        yield c
    finally:
        stop(c.procs)
