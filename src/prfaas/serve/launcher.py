"""``Launcher``: a whole deployment on one machine, as real processes, stopped cleanly.

The gateway starts first (its port resolved if the file says 0), then one worker process per site
(``timed`` nodes of a site share a process; ``torch`` nodes get one each). Every child runs in its
own session (process group), so stopping kills each group: SIGTERM, then SIGKILL after a grace
period; nothing is left behind even if a child spawned helpers. The resolved deployment file and one
log per process go to ``workdir``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from prfaas.config import DeploymentConfig

STOP_GRACE_S = 5.0


class LaunchError(RuntimeError):
    """The deployment did not come up; the message says which process and shows its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


class Launcher:
    def __init__(
        self, deployment: DeploymentConfig, workdir: Path, process_per_node: bool = False
    ) -> None:
        self.testbed: Any = None
        if deployment.netns:
            deployment = self._network(deployment)
        gw = deployment.gateway
        if gw.port == 0:
            gw = gw.model_copy(update={"port": free_port(gw.host)})
            deployment = deployment.model_copy(update={"gateway": gw})
        self.deployment = deployment
        self.workdir = workdir
        self.process_per_node = process_per_node or deployment.engine.kind == "torch"
        self.children: list[Child] = []
        self.config_path = workdir / "deployment.resolved.yaml"

    def _network(self, d: DeploymentConfig) -> DeploymentConfig:
        """Put the PrfaaS site in its own network namespace, joined to this one (the PD site and
        the gateway) by a veth whose PrfaaS -> PD direction is tbf-shaped to the link's emulated
        rate, with the link's RTT from a userspace delay line (``prfaas.testbed``). The gateway
        and PD workers then listen on this side's veth address."""
        from prfaas.testbed import TwoSiteTestbed, unavailable_reason

        remote = [s for s in d.sites if s.kind == "prfaas"]
        if len(remote) != 1:
            raise LaunchError("netns: true places exactly one PrfaaS site in a namespace")
        reason = unavailable_reason()
        if reason is not None:
            raise LaunchError(f"netns: true: {reason}")
        link = d.link_to_home(remote[0].name)
        assert link is not None
        eng = d.engine
        scale = eng.byte_divisor * (eng.time_scale if eng.kind == "timed" else 1.0)
        self.testbed = TwoSiteTestbed(
            rate_mbit=link.gbps * 1000 / scale,
            one_way_delay_s=link.rtt_ms / 2000 * (eng.time_scale if eng.kind == "timed" else 1.0),
            tcp_mem_max_bytes=64 << 20,
            b_in_root=True,
        )
        self.testbed.setup()
        gateway = d.gateway.model_copy(update={"host": self.testbed.ip_b})
        return d.model_copy(update={"gateway": gateway})

    @property
    def url(self) -> str:
        g = self.deployment.gateway
        return f"http://{g.host}:{g.port}"

    def groups(self) -> list[tuple[str, list[str]]]:
        out = []
        for site in self.deployment.sites:
            names = [n.name for n in site.nodes]
            if self.process_per_node:
                out.extend((n, [n]) for n in names)
            else:
                out.append((site.name, names))
        return out

    # -- life cycle ------------------------------------------------------------------------------
    def start(self, ready_timeout_s: float = 120.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.deployment.model_dump(mode="json")))
        try:
            self._spawn("gateway", ["--role", "gateway"])
            self._wait_gateway(ready_timeout_s)
            for name, nodes in self.groups():
                args = ["--role", "node"]
                for n in nodes:
                    args += ["--node", n]
                site = self.deployment.site_of(nodes[0])
                self._spawn(name, args, site="a" if site.kind == "prfaas" else "b")
            self.wait_nodes(ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, args: list[str], site: str = "b") -> Child:
        log_path = self.workdir / f"{name}.log"
        cmd = [sys.executable, "-m", "prfaas.cli", "serve", "--config", str(self.config_path)]
        if self.testbed is not None and name != "gateway":
            args = [*args, "--host", self.testbed.ip_a if site == "a" else self.testbed.ip_b]
            cmd = self.testbed.netns_argv(site, cmd)
        # Workers log warnings, not transformers' notes about missing GPU kernels.
        env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd + args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def _check_alive(self) -> None:
        for child in self.children:
            if child.proc.poll() is not None:
                raise LaunchError(
                    f"process {child.name} exited with status {child.proc.returncode}:\n"
                    + child.log_tail()
                )

    def _wait_gateway(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise LaunchError(f"gateway did not answer within {timeout_s:.0f} s")

    def nodes(self) -> list[dict[str, object]]:
        nodes: list[dict[str, object]] = httpx.get(f"{self.url}/internal/nodes", timeout=2.0).json()
        return nodes

    def wait_nodes(self, timeout_s: float, names: list[str] | None = None) -> None:
        wanted = set(names or [n.name for s in self.deployment.sites for n in s.nodes])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                healthy = {str(n["node"]) for n in self.nodes() if n["healthy"]}
                if wanted <= healthy:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise LaunchError(f"nodes {sorted(wanted)} did not all register within {timeout_s:.0f} s")

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill one process group (fault injection)."""
        child = self.child(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, sig)
        child.proc.wait(timeout=STOP_GRACE_S)

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.proc.poll() is None:
                try:
                    os.killpg(child.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + STOP_GRACE_S
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGKILL)  # the group: helpers included
            child.proc.wait()
        self.children.clear()
        if self.testbed is not None:
            self.testbed.teardown()  # namespaces, veth, delay line

    def __enter__(self) -> Launcher:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
