"""Start and stop a live pool (``prfaas up pool.yaml``) for the pool's e2e tests; every process
is stopped (its whole process group) however the test ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import yaml

from prfaas.pool.client import Refusal

KEYS = {
    "PRFAAS_POOL_KEY_A": "tenant-a-pool-key-0123456789abcdef",
    "PRFAAS_POOL_KEY_B": "tenant-b-pool-key-0123456789abcdef",
}
POOL_FILE = """
version: 1
units: {time_scale: 0.1, byte_divisor: 1000, block_tokens: 512}
front_door: {host: 127.0.0.1, port: 0, control_port: 0}
egress_gbps: 100
heartbeat_interval_s: 0.5
lease_s: 3.0
groups:
  - {name: g-1t, model: paper-1t, kind: timed, hardware: h200, num_nodes: 2}
tenants:
  - {name: tenant-a, weight: 2, keys: [{id: a-1, env: PRFAAS_POOL_KEY_A}]}
  - {name: tenant-b, weight: 1, keys: [{id: b-1, env: PRFAAS_POOL_KEY_B}]}
"""


def submit_body(
    tenant: str,
    rid: str,
    receiver: str,
    num_tokens: int,
    model: str = "paper-1t",
    token: int | None = None,
) -> dict[str, object]:
    """A ``POST /v1/submit`` body for a prefill of ``num_tokens`` of a preset ``model`` (session
    ``s-RID``): ``token`` repeated (such prompts share their prefixes: at the pool node, a
    tenant's later ones find its earlier ones), or by default a first token of the request's own
    and 5s after it, so that no prefill finds another's prefix and each computes its whole
    prompt, what the tests timing or sharing out the pool's work count on."""
    first = token if token is not None else zlib.crc32(f"{tenant}/{rid}".encode()) & 0x7FFFFFFF
    tokens = ([first] + [5 if token is None else token] * (num_tokens - 1))[:num_tokens]
    from prfaas.serve.node.messages import pack_tokens

    return {
        "tenant": tenant, "request_id": rid, "model": model,
        "fingerprint": {"config": model, "block_tokens": "512"},
        "num_uncached_tokens": num_tokens, "receiver": receiver, "session": f"s-{rid}",
        "tokens": pack_tokens(tokens), "sampling": {"max_new_tokens": 4},
    }  # fmt: skip


class LeaseRenewer:
    """Heartbeats every tenant client at most every ``every_s`` seconds, as a tenant does: a
    lease that lapses drops the tenant's prefills (loaded hosts ran tests past the pool files'
    30 s lease without it: queued prefills dropped, ``lease_expired``)."""

    def __init__(self, clients: Iterable[Any], every_s: float = 5.0) -> None:
        self.clients = list(clients)
        self.every_s = every_s
        self.renewed = time.monotonic()

    async def when_due(self) -> None:
        if time.monotonic() - self.renewed <= self.every_s:
            return
        for c in self.clients:
            assert not isinstance(await c.heartbeat(), Refusal)
        self.renewed = time.monotonic()


class LivePool:
    def __init__(self, proc: subprocess.Popen[bytes], workdir: Path) -> None:
        self.proc = proc
        self.workdir = workdir
        resolved = yaml.safe_load((workdir / "pool.resolved.yaml").read_text())
        door = resolved["front_door"]
        scheme = "https" if door.get("tls") else "http"
        self.url = f"{scheme}://{door['host']}:{door['port']}"
        self.control_url = f"http://{door['host']}:{door['control_port']}"
        self.internal_key = (workdir / "pool-internal.key").read_text().strip()

    def kill_front_door(self, sig: int) -> None:
        """Signal the front door's process (its launcher restarts it, with a new epoch)."""
        self.kill("frontdoor", sig)

    def kill(self, name: str, sig: int) -> None:
        """Signal one of the pool's processes (``frontdoor`` or a node group's, by the group's
        name); its launcher restarts it."""
        doc = json.loads((self.workdir / "processes.json").read_text())
        pid = next(p["pid"] for p in doc["processes"] if p["name"] == name)
        os.kill(int(pid), sig)

    def log_tail(self) -> str:
        return "\n".join(
            f"== {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            for p in sorted(self.workdir.glob("*.log"))
        )


@contextmanager
def live_pool(
    tmp: Path, ready_timeout_s: float = 60.0, pool_text: str = POOL_FILE
) -> Iterator[LivePool]:
    pool_file = tmp / "pool.yaml"
    pool_file.write_text(pool_text)
    workdir = tmp / "pool-wd"
    env = {**os.environ, **KEYS}
    cmd = [sys.executable, "-m", "prfaas.cli", "up", str(pool_file), "--workdir", str(workdir),
           "--ready-timeout", str(ready_timeout_s)]  # fmt: skip
    out = tmp / "pool-up.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + ready_timeout_s + 10
        while b"ready:" not in out.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("pool did not come up:\n" + out.read_text(errors="replace"))
            time.sleep(0.2)
        yield LivePool(proc, workdir)
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """SIGTERM (``up`` stops its children), then SIGKILL the whole group if anything is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)
