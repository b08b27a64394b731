"""``TwoSiteTestbed``: two network namespaces (site A, site B) joined by a shaped, delayed link.

Layout without delay:   [A: a0 10.77.x.1] ==veth== [B: b0 10.77.x.2]
Layout with delay:      [A: a0] ==veth== [M: ma | delay line | mb] ==veth== [B: b0]
``tc qdisc tbf`` on ``a0`` (A -> B, the KV direction) holds the rate; the delay line
(``prfaas.netlab.delayline``, a process in the middle namespace M) adds ``one_way_delay_s`` each
way. Names are unique per run (``pfx<owner pid>x<random>``); ``sweep_stale()`` (called on every
setup) removes namespaces and helper processes of runs whose owner process is gone, so a killed run
leaves nothing behind for long. Teardown always runs (context manager), also when a test fails.

Needs root, ``ip`` and ``tc`` (Debian package ``iproute2``). ``unavailable_reason()`` says why not.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "pfx"
STATE_DIR = Path("/run/prfaas-testbed")


_RTT_PROBE = """
import socket, statistics, sys, time
rtts = []
for _ in range(int(sys.argv[2])):
    s = socket.socket()
    t0 = time.perf_counter()
    try:
        s.connect((sys.argv[1], 9))  # discard: nothing listens in the testbed, B answers RST
    except ConnectionRefusedError:
        rtts.append(time.perf_counter() - t0)
    finally:
        s.close()
    time.sleep(0.05)
print(statistics.median(rtts))
"""


def _sh(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=timeout)


def unavailable_reason() -> str | None:
    """None if namespaces and tc can be used here, else a one-line reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (install iproute2)"
    probe = f"{PREFIX}{os.getpid()}xprobe"
    try:
        _sh("ip", "netns", "add", probe)
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot create a network namespace: {exc}"
    finally:
        _sh("ip", "netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_if_ours(pid: int, run_id: str) -> None:
    """SIGKILL ``pid`` only if its command line names our run (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if run_id.encode() in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def sweep_stale() -> list[str]:
    """Remove what runs whose owner died left behind. Returns what was removed."""
    removed = []
    if STATE_DIR.exists():
        for f in STATE_DIR.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                state = json.loads(f.read_text())
                if _alive(int(state["owner_pid"])):
                    continue
                for pid in state.get("helper_pids", []):
                    _kill_if_ours(int(pid), state["run_id"])
                f.unlink()
                removed.append(f.name)
    out = _sh("ip", "netns", "list", check=False).stdout
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX) :].split("x", 1)[0]
        if owner.isdigit() and not _alive(int(owner)):
            _sh("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


@dataclass
class TwoSiteTestbed:
    rate_mbit: float | None = None
    """tbf rate on A -> B (None: unshaped)."""
    one_way_delay_s: float = 0.0
    """Delay added each way by the relay (0: no middle namespace)."""
    tbf_latency_s: float = 0.025
    """tbf queue bound expressed as time at the rate (the ``latency`` parameter)."""
    tcp_mem_max_bytes: int | None = None
    """Raise net.ipv4.tcp_wmem/rmem maxima inside A and B (None: kernel defaults)."""
    b_in_root: bool = False
    """Site B is this machine's own (root) namespace, so B's services stay reachable from it (the
    live launcher's PD site and gateway); only A gets a namespace. B's end is a uniquely named
    veth in the root namespace, deleted with A's (or M's) namespace."""
    run_id: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}")
    ns_a: str = ""
    ns_b: str = ""
    ns_m: str = ""
    ip_a: str = ""
    ip_b: str = ""
    dev_b: str = ""
    _helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _up: bool = False

    def __post_init__(self) -> None:
        self.ns_a, self.ns_b, self.ns_m = (f"{self.run_id}{s}" for s in "abm")
        self.dev_b = f"pb{secrets.token_hex(4)}" if self.b_in_root else "b0"
        subnet = 16 + secrets.randbelow(200)
        self.ip_a, self.ip_b = f"10.77.{subnet}.1", f"10.77.{subnet}.2"

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> TwoSiteTestbed:
        try:
            self.setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _save_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {
            "run_id": self.run_id,
            "owner_pid": os.getpid(),
            "namespaces": [self.ns_a, self.ns_b, self.ns_m],
            "helper_pids": [p.pid for p in self._helpers],
        }
        (STATE_DIR / f"{self.run_id}.json").write_text(json.dumps(state))

    def setup(self) -> None:
        sweep_stale()
        self._up = True
        self._save_state()
        a, b, m = self.ns_a, self.ns_b, self.ns_m
        for ns in (a,) if self.b_in_root else (a, b):
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "dev", "lo", "up")
        b_side = () if self.b_in_root else ("netns", b)  # where B's veth end goes
        if self.one_way_delay_s > 0:
            _sh("ip", "netns", "add", m)
            _sh("ip", "-n", m, "link", "set", "dev", "lo", "up")
            _sh("ip", "link", "add", "dev", "a0", "netns", a,
                "type", "veth", "peer", "name", "ma", "netns", m)  # fmt: skip
            _sh("ip", "link", "add", "dev", self.dev_b, *b_side,
                "type", "veth", "peer", "name", "mb", "netns", m)  # fmt: skip
            for dev in ("ma", "mb"):
                _sh("ip", "-n", m, "link", "set", "dev", dev, "up")
        else:
            _sh("ip", "link", "add", "dev", "a0", "netns", a,
                "type", "veth", "peer", "name", self.dev_b, *b_side)  # fmt: skip
        for ns, dev, ip in ((a, "a0", self.ip_a), (b, self.dev_b, self.ip_b)):
            where = () if ns == b and self.b_in_root else ("-n", ns)
            _sh("ip", *where, "addr", "add", f"{ip}/24", "dev", dev)
            _sh("ip", *where, "link", "set", "dev", dev, "up")
            if self.tcp_mem_max_bytes is not None and where:
                mx = str(self.tcp_mem_max_bytes)
                for key in ("net.ipv4.tcp_wmem", "net.ipv4.tcp_rmem"):
                    _sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}=4096 131072 {mx}")
        if self.rate_mbit is not None:
            rate_bytes = self.rate_mbit * 1e6 / 8
            burst = max(64 << 10, int(rate_bytes * 0.001))  # >= one GSO frame, >= 1 ms of rate
            _sh("ip", "netns", "exec", a, "tc", "qdisc", "add", "dev", "a0", "root", "tbf",
                "rate", f"{self.rate_mbit}mbit", "burst", str(burst),
                "latency", f"{self.tbf_latency_s * 1000:.0f}ms")  # fmt: skip
        if self.one_way_delay_s > 0:
            self._start_delay_line()
        self._save_state()

    def _start_delay_line(self) -> None:
        argv = [
            "ip", "netns", "exec", self.ns_m, sys.executable, "-m", "prfaas.netlab.delayline",
            "ma", "mb", str(self.one_way_delay_s), "--run-id", self.run_id,
        ]  # fmt: skip
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._helpers.append(proc)
        self._save_state()
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "ready" once both sockets are bound
        if line.strip() != b"ready":
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"delay line did not start: {line!r} {err}")

    def teardown(self) -> None:
        if not self._up:
            return
        self._up = False
        for proc in self._helpers:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=3)
        self._helpers.clear()
        for ns in (self.ns_a, self.ns_b, self.ns_m):
            _sh("ip", "netns", "del", ns, check=False)
        if self.b_in_root:  # normally gone with its peer's namespace; make sure
            _sh("ip", "link", "del", "dev", self.dev_b, check=False)
        with contextlib.suppress(OSError):
            (STATE_DIR / f"{self.run_id}.json").unlink()

    # -- use ----------------------------------------------------------------------------------
    def netns_argv(self, site: str, argv: list[str]) -> list[str]:
        """``argv`` wrapped to run inside site ``"a"`` or ``"b"``."""
        if site == "b" and self.b_in_root:
            return list(argv)
        ns = {"a": self.ns_a, "b": self.ns_b}[site]
        return ["ip", "netns", "exec", ns, *argv]

    def popen(self, site: str, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start a helper process in a site; it is killed at teardown."""
        proc = subprocess.Popen(self.netns_argv(site, argv), **kwargs)  # type: ignore[call-overload]
        self._helpers.append(proc)
        self._save_state()
        return proc  # type: ignore[no-any-return]

    def probe_rtt_s(self, count: int = 3) -> float:
        """Median round trip from A to B (seconds), without ``ping`` (not installed everywhere): a
        TCP connect from A to a closed port of B is refused after exactly one round trip."""
        out = _sh("ip", "netns", "exec", self.ns_a, sys.executable, "-c", _RTT_PROBE, self.ip_b,
                  str(count), timeout=30).stdout  # fmt: skip
        return float(out.strip())
