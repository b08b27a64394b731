"""Benchmark of prfaas.transfer: loopback vs iperf3, shaped links, RTT, layer-wise overlap, TLS,
and the CPU cost of the per-frame MAC against a checkout from before it.

    .venv/bin/python bench/transfer.py            # table (medians of --repeats runs)
    .venv/bin/python bench/transfer.py --json     # one JSON object
    .venv/bin/python bench/transfer.py --quick    # 1 repeat, shorter windows
    # MAC cost: sender and receiver CPU s/GB, this tree vs another (e.g. before the MAC), in turn
    git archive bdcebf8 src bench | tar -x -C /tmp/prfaas-before
    .venv/bin/python bench/transfer.py --only mac primitives --baseline /tmp/prfaas-before

Sender and receiver run as separate processes (as they will live); shaped rows run them in the two
namespaces of ``prfaas.netlab.TwoSiteTestbed`` (root only; skipped with a reason otherwise).
Goodput counts only bytes the receiver verified (MAC-checked and acknowledged). CPU s/GB is the
sender's plus the receiver's CPU time per GB moved. iperf3 (``-l 1M``, same -P, same window) runs
in the same invocation for the ratio; if it is missing the column says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from prfaas.spec import DType, LayerKind  # noqa: E402
from prfaas.transfer import (  # noqa: E402
    DEFAULT_NUM_CONNECTIONS,
    LayerEntry,
    Link,
    Manifest,
    Receiver,
    Refused,
    TensorEntry,
    TransferConfig,
)

Json = dict[str, Any]
PSK = b"bench-key-0123456789abcdef"
MIB = 1 << 20
SECTIONS = ["loopback", "tls", "mac", "primitives", "preauth", "shaped", "overlap"]


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _manifest(request_id: str, num_layers: int, layer_bytes: int) -> Manifest:
    t = (TensorEntry("state", DType.FP32, (layer_bytes // 4,)),)
    layers = tuple(LayerEntry(i, LayerKind.LINEAR, 0, 0, t) for i in range(num_layers))
    return Manifest(request_id, 1, 0, layers)


def _tls(dirpath: Path, server: bool) -> ssl.SSLContext:
    cert, key = dirpath / "cert.pem", dirpath / "key.pem"
    if server:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        return ctx
    return ssl.create_default_context(cafile=str(cert))


def make_cert(dirpath: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=prfaas-bench", "-addext", "subjectAltName=DNS:prfaas-bench",
         "-keyout", str(dirpath / "key.pem"), "-out", str(dirpath / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip


# -- receiver process -------------------------------------------------------------------------
class Pool:
    """A decode node's KV pool stand-in: fixed, touched slots handed out per session."""

    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        self.slots = [bytearray(slot_bytes) for _ in range(num_slots)]
        for s in self.slots:
            s[::4096] = b"\1" * len(s[::4096])  # touch every page once
        self.free = list(range(num_slots))

    def allocate(self, m: Manifest) -> list[memoryview]:
        if not self.free or m.num_bytes > len(self.slots[0]):
            raise Refused("bench pool full")
        slot = self.free.pop()
        view, out, off = memoryview(self.slots[slot]), [], 0
        for n in m.layer_bytes():
            out.append(view[off : off + n])
            off += n
        self._owner = getattr(self, "_owner", {})
        self._owner[m.request_id] = slot
        return out

    def release(self, request_id: str) -> None:
        self.free.append(self._owner.pop(request_id))


async def rx_main(args: argparse.Namespace) -> None:
    ssl_ctx = _tls(Path(args.tls), server=True) if args.tls else None
    cfg = TransferConfig(psk=PSK, ssl_context=ssl_ctx, timeout_s=60, stall_timeout_s=60)
    pool = Pool(args.slots, args.slot_mib * MIB)
    loop = asyncio.get_running_loop()
    async with Receiver(cfg, pool.allocate) as rx:
        _, port = await rx.listen(args.host, args.port)
        cpu0 = _cpu_s()
        print(json.dumps({"event": "ready", "port": port}), flush=True)

        pending: set[asyncio.Task[None]] = set()

        async def consume() -> None:
            async for s in rx:
                t = loop.create_task(finish(s))
                pending.add(t)
                t.add_done_callback(pending.discard)

        async def finish(s: Any) -> None:
            try:
                await s.complete(timeout_s=60)
                print(json.dumps({"event": "verified", "request_id": s.request_id,
                                  "at": time.monotonic()}), flush=True)  # fmt: skip
            finally:
                pool.release(s.request_id)

        task = loop.create_task(consume())
        await loop.run_in_executor(None, sys.stdin.read)  # until the orchestrator closes stdin
        task.cancel()
        cpu = _cpu_s() - cpu0
        print(json.dumps({"event": "exit", "cpu_s": cpu, "bytes": rx.bytes_verified}), flush=True)


# -- sender process ---------------------------------------------------------------------------
async def tx_main(args: argparse.Namespace) -> None:
    ssl_ctx = _tls(Path(args.tls), server=False) if args.tls else None
    cfg = TransferConfig(
        psk=PSK,
        num_connections=args.connections,
        ssl_context=ssl_ctx,
        server_hostname="prfaas-bench" if args.tls else None,
        timeout_s=60,
        chunk_bytes=int(args.chunk_kib * 1024),
    )
    layer_bytes = args.layer_mib * MIB
    src = bytearray(os.urandom(layer_bytes))
    async with await Link.connect(args.host, args.port, cfg) as link:
        cpu0 = _cpu_s()
        seq = 0

        async def session(compute_s: float = 0.0) -> float:
            nonlocal seq
            seq += 1
            m = _manifest(f"s{seq}", args.layers, layer_bytes)
            async with link.session(m) as s:
                for i in range(args.layers):
                    if compute_s:
                        await asyncio.sleep(compute_s)  # a layer's compute
                    await s.send(i, 0, src)
                last = time.monotonic()
                await s.finish(first_token=1)
            return last

        async def loop_sessions(stop_at: float) -> None:
            while time.monotonic() < stop_at:
                await session()

        out: dict[str, Any] = {}
        if args.mode == "throughput":
            t_warm = time.monotonic() + args.warmup_s
            t_end = t_warm + args.seconds
            tasks = [asyncio.create_task(loop_sessions(t_end)) for _ in range(2)]
            await asyncio.sleep(max(0.0, t_warm - time.monotonic()))
            acked0, w0 = link.counters().bytes_acked, time.monotonic()
            await asyncio.sleep(max(0.0, t_end - time.monotonic()))
            acked1, w1 = link.counters().bytes_acked, time.monotonic()
            await asyncio.gather(*tasks)
            out["goodput_bytes_per_s"] = (acked1 - acked0) / (w1 - w0)
        else:  # overlap: warm the connections up, then stream layers at the given compute pace
            await loop_sessions(time.monotonic() + args.warmup_s)
            out["last_layer_at"] = []
            out["request_ids"] = []
            for _ in range(args.overlap_runs):
                await asyncio.sleep(0.2)
                out["last_layer_at"].append(await session(args.compute_s))
                out["request_ids"].append(f"s{seq}")
        out["cpu_s"] = _cpu_s() - cpu0
        out["bytes"] = link.counters().bytes_acked
        print(json.dumps(out), flush=True)


# -- orchestration ----------------------------------------------------------------------------
def _py(*extra: str, tree: Path | None = None) -> list[str]:
    """This bench (or the one in ``tree``, which then imports that tree's ``src``) as a child."""
    script = Path(__file__).resolve() if tree is None else tree / "bench" / "transfer.py"
    return [sys.executable, str(script), *extra]


class Run:
    """One receiver + sender pair, optionally inside a testbed."""

    def __init__(
        self,
        testbed: Any = None,
        tls: str | None = None,
        slots: int = 3,
        slot_mib: int = 64,
        tree: Path | None = None,
    ) -> None:
        self.slots, self.slot_mib = slots, slot_mib
        self.tb = testbed
        self.tls = tls
        self.tree = tree
        self.host = "127.0.0.1" if testbed is None else testbed.ip_b

    def __call__(
        self, connections: int, *tx_args: str
    ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        rx_argv = _py("_rx", "--host", self.host, "--slots", str(self.slots),
                      "--slot-mib", str(self.slot_mib), tree=self.tree)  # fmt: skip
        tx_extra = ["--tls", self.tls] if self.tls else []
        if self.tls:
            rx_argv += ["--tls", self.tls]
        kw = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
        rx = self.tb.popen("b", rx_argv, **kw) if self.tb else subprocess.Popen(rx_argv, **kw)
        try:
            port = json.loads(rx.stdout.readline())["port"]
            tx_argv = _py("_tx", "--host", self.host, "--port", str(port),
                          "--connections", str(connections), *tx_extra, *tx_args,
                          tree=self.tree)  # fmt: skip
            if self.tb:
                tx_argv = self.tb.netns_argv("a", tx_argv)
            done = subprocess.run(tx_argv, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"sender failed: {done.stderr[-2000:]}")
            tx = json.loads(done.stdout.strip().splitlines()[-1])
            rx.stdin.close()
            lines = [json.loads(x) for x in rx.stdout.read().splitlines() if x.strip()]
            rx.wait(timeout=30)
        finally:
            if rx.poll() is None:
                rx.kill()
                rx.wait()
        exit_ev = next(e for e in lines if e["event"] == "exit")
        return tx, exit_ev, [e for e in lines if e["event"] == "verified"]


def iperf3_bps(tb: Any, connections: int, seconds: float) -> float | None:
    if shutil.which("iperf3") is None:
        return None
    host = "127.0.0.1" if tb is None else tb.ip_b
    srv_argv = ["iperf3", "-s", "-1", "-B", host, "-p", "5299"]
    srv = tb.popen("b", srv_argv, stdout=subprocess.DEVNULL) if tb else subprocess.Popen(
        srv_argv, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.3)
        cli = ["iperf3", "-c", host, "-p", "5299", "-t", f"{seconds:g}", "-O", "1",
               "-P", str(connections), "-l", "1M", "-J"]  # fmt: skip
        if tb:
            cli = tb.netns_argv("a", cli)
        out = subprocess.run(cli, capture_output=True, text=True, timeout=120).stdout
        return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 8
    finally:
        if srv.poll() is None:
            srv.kill()
        srv.wait()


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    from prfaas.netlab import TwoSiteTestbed, unavailable_reason

    reps, secs = (1, 1.5) if args.quick else (args.repeats, args.seconds)
    tput = ["--mode", "throughput", "--seconds", f"{secs}", "--warmup-s", "0.7"]
    result: dict[str, Any] = {"default_connections": DEFAULT_NUM_CONNECTIONS, "notes": []}
    if shutil.which("iperf3") is None:
        result["notes"].append("iperf3 not installed (apt-get install -y iperf3): no ratios")

    # Loopback: connections sweep, iperf3 beside each. Repeats go round-robin over the
    # connection counts (and iperf3 right after each of ours) so that every row sees the same
    # mix of machine load: on a shared machine, load drifts over a minute.
    rows: list[Json] = []
    conns = args.connections if "loopback" in args.only else []
    runs: dict[int, tuple[list[float], list[float], list[float]]] = {n: ([], [], []) for n in conns}
    run = Run()
    for _ in range(reps):
        for n in conns:
            g, cpu, ip = runs[n]
            tx, rx, _ = run(n, *tput, "--layers", "16", "--layer-mib", "4")
            g.append(tx["goodput_bytes_per_s"])
            cpu.append((tx["cpu_s"] + rx["cpu_s"]) / (tx["bytes"] / 1e9))
            bps = iperf3_bps(None, n, secs)
            if bps is not None:
                ip.append(bps)
    for n in conns:
        g, cpu, ip = runs[n]
        row = {
            "connections": n,
            "goodput_gbps": _med(g) * 8 / 1e9,
            "iperf3_gbps": _med(ip) * 8 / 1e9 if ip else None,
            "cpu_s_per_gb": _med(cpu),
            "runs_gbps": [x * 8 / 1e9 for x in g],
            "iperf3_runs_gbps": [x * 8 / 1e9 for x in ip],
        }
        row["ratio"] = row["goodput_gbps"] / row["iperf3_gbps"] if ip else None
        rows.append(row)
    result["loopback"] = rows

    # TLS cost on loopback at the default connection count.
    if "tls" in args.only and shutil.which("openssl") is None:
        result["notes"].append("openssl CLI missing: no TLS row")
    elif "tls" in args.only:
        with tempfile.TemporaryDirectory() as d:
            make_cert(Path(d))
            g, cpu = [], []
            for _ in range(reps):
                tx, rx, _ = Run(tls=d)(
                    DEFAULT_NUM_CONNECTIONS, *tput, "--layers", "16", "--layer-mib", "4"
                )
                g.append(tx["goodput_bytes_per_s"])
                cpu.append((tx["cpu_s"] + rx["cpu_s"]) / (tx["bytes"] / 1e9))
        plain = next((r for r in rows if r["connections"] == DEFAULT_NUM_CONNECTIONS), None)
        tls_gbps = _med(g) * 8 / 1e9
        result["tls"] = {
            "connections": DEFAULT_NUM_CONNECTIONS,
            "goodput_gbps": tls_gbps,
            "cpu_s_per_gb": _med(cpu),
            "plain_cpu_s_per_gb": plain["cpu_s_per_gb"] if plain else None,
            "goodput_vs_plain": tls_gbps / plain["goodput_gbps"] if plain else None,
        }

    if "mac" in args.only:
        if args.baseline is None:
            result["notes"].append("mac section skipped: give --baseline DIR (a tree to compare)")
        else:
            result["mac"] = mac_cost(args.baseline, tput, reps)
    if "primitives" in args.only:
        result["primitives"] = primitives()
    if "preauth" in args.only:
        result["preauth"] = preauth(args.baseline)

    # Shaped links and the layer-wise overlap (namespaces; root only).
    result["shaped"] = []
    if "shaped" not in args.only and "overlap" not in args.only:
        return result
    why = unavailable_reason()
    if why is not None:
        result["notes"].append(f"shaped and overlap rows skipped: {why}")
        return result
    shaped_secs = max(secs, 3.0)
    stput = ["--mode", "throughput", "--seconds", f"{shaped_secs}", "--warmup-s", "1.5"]
    for rate, rtt_ms, conns in args.shaped if "shaped" in args.only else []:
        with TwoSiteTestbed(rate_mbit=rate, one_way_delay_s=rtt_ms / 2000) as tb:
            g = []
            for _ in range(reps if rtt_ms == 0 else max(1, reps - 1)):
                tx, _, _ = Run(tb)(conns, *stput, "--layers", "16", "--layer-mib", "2")
                g.append(tx["goodput_bytes_per_s"])
            ip = iperf3_bps(tb, conns, shaped_secs)
            result["shaped"].append({
                "rate_mbit": rate, "rtt_ms": rtt_ms, "connections": conns,
                "goodput_mbit": _med(g) * 8 / 1e6, "fraction": _med(g) * 8 / 1e6 / rate,
                "iperf3_mbit": None if ip is None else ip * 8 / 1e6,
                "measured_rtt_ms": tb.probe_rtt_s() * 1000 if rtt_ms else None,
            })  # fmt: skip

    # Overlap on the 1 Gbit/s link: compute per layer == one layer's transfer time.
    if "overlap" in args.only:
        result["overlap"] = overlap(args, result["shaped"], reps)
    return result


def mac_cost(baseline: Path, tput: list[str], reps: int) -> Json:
    """Loopback at the default connection count, this tree and ``baseline`` in turn (so both see
    the same drift of machine load): CPU seconds per GB moved, sender and receiver apart."""
    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(reps):
        for name, tree in (("this", None), ("baseline", baseline)):
            tx, rx, _ = Run(tree=tree)(
                DEFAULT_NUM_CONNECTIONS, *tput, "--layers", "16", "--layer-mib", "4"
            )
            gb = tx["bytes"] / 1e9
            row = rows.setdefault(name, {"tx": [], "rx": [], "both": [], "gbps": []})
            row["tx"].append(tx["cpu_s"] / gb)
            row["rx"].append(rx["cpu_s"] / gb)
            row["both"].append((tx["cpu_s"] + rx["cpu_s"]) / gb)
            row["gbps"].append(tx["goodput_bytes_per_s"] * 8 / 1e9)
    out: Json = {"baseline": str(baseline), "connections": DEFAULT_NUM_CONNECTIONS}
    for name, row in rows.items():
        out[name] = {
            "sender_cpu_s_per_gb": _med(row["tx"]),
            "receiver_cpu_s_per_gb": _med(row["rx"]),
            "cpu_s_per_gb": _med(row["both"]),
            "goodput_gbps": _med(row["gbps"]),
            "runs_cpu_s_per_gb": row["both"],
        }
    for key in ("sender_cpu_s_per_gb", "receiver_cpu_s_per_gb", "cpu_s_per_gb"):
        out[f"{key}_ratio"] = out["this"][key] / out["baseline"][key]
    out["over_1_3x"] = out["cpu_s_per_gb_ratio"] > 1.3
    return out


def primitives() -> Json:
    """Single-core speed of the candidate per-frame MACs (and xxh3, the unkeyed checksum they
    replace), over 256 MiB cut into 1 MiB frames fed in 64 KiB pieces, as the receiver feeds them
    (best of 3). Keyed BLAKE3 needs the ``blake3`` package, which prfaas does not depend on."""
    import xxhash
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    from cryptography.hazmat.primitives.poly1305 import Poly1305

    from prfaas.transfer.mac import FrameMac

    total, frame, piece = 256 * MIB, MIB, 64 << 10
    data = memoryview(bytearray(os.urandom(total)))
    key = os.urandom(32)
    gmac = FrameMac(key)

    def run_gmac(view: memoryview) -> None:
        h = gmac.stream()
        for p in range(0, len(view), piece):
            h.update(view[p : p + piece])
        h.tag()

    def run_poly(view: memoryview) -> None:  # one-time key per frame, as ChaCha20-Poly1305 does
        nonce = gmac.next_seq.to_bytes(16, "little")
        gmac.next_seq += 1
        otk = Cipher(algorithms.ChaCha20(key, nonce), None).encryptor().update(bytes(32))
        h = Poly1305(otk)
        for p in range(0, len(view), piece):
            h.update(view[p : p + piece])
        h.finalize()

    def run_xxh3(view: memoryview) -> None:
        h = xxhash.xxh3_64()
        for p in range(0, len(view), piece):
            h.update(view[p : p + piece])
        h.intdigest()

    cands: dict[str, Any] = {"xxh3_64 (unkeyed)": run_xxh3, "aes-256-gmac": run_gmac,
                             "poly1305": run_poly}  # fmt: skip
    try:
        import blake3  # type: ignore[import-not-found]

        def run_b3(view: memoryview) -> None:
            h = blake3.blake3(key=key)
            for p in range(0, len(view), piece):
                h.update(view[p : p + piece])
            h.digest(16)

        cands["blake3 keyed"] = run_b3
    except ImportError:
        cands["blake3 keyed"] = None
    out: Json = {}
    for name, fn in cands.items():
        if fn is None:
            out[name] = None
            continue
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for off in range(0, total, frame):
                fn(data[off : off + frame])
            best = min(best, time.perf_counter() - t0)
        out[name] = total / best / 1e9
    return {"gb_per_s": out, "frame_bytes": frame, "piece_bytes": piece}


PREAUTH_CONNECTIONS = 300


def preauth(baseline: Path | None) -> Json:
    """Unauthenticated connections that stop after a HELLO header declaring ``hello_bytes``: the
    receiver process's RSS growth and its own count of pre-auth buffered bytes, 0.5 s after the
    last one, in a fresh process each (this tree; the baseline too with ``--baseline``)."""
    out: Json = {"connections": PREAUTH_CONNECTIONS}
    trees: list[tuple[str, Path | None]] = [("this", None)]
    if baseline is not None:
        trees.append(("baseline", baseline))
    for name, tree in trees:
        src = str((ROOT if tree is None else tree) / "src")
        for hello in (1 << 20, 98):
            argv = _py("_preauth", "--src", src, "--hello-bytes", str(hello))
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
            out[f"{name}_hello_{hello}"] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


async def preauth_main(args: argparse.Namespace) -> None:
    sys.path.insert(0, args.src)  # the tree under test (this bench's own src otherwise)
    for name in [m for m in sys.modules if m.startswith("prfaas")]:
        del sys.modules[name]
    import logging

    from prfaas.transfer import Receiver as Rx
    from prfaas.transfer import TransferConfig as Cfg
    from prfaas.transfer import frames

    logging.disable(logging.WARNING)  # one refusal line per connection is not the figure

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    loop = asyncio.get_running_loop()
    async with Rx(Cfg(psk=PSK), lambda m: []) as rx:
        _, port = await rx.listen()
        rss0, socks = rss(), []
        for _ in range(PREAUTH_CONNECTIONS):
            s = socket.socket()
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", port))
            await loop.sock_sendall(s, frames.header(frames.FrameType.HELLO, args.hello_bytes))
            socks.append(s)
        await asyncio.sleep(0.5)
        buffered = getattr(rx, "pre_auth_buffered_bytes", None)
        print(json.dumps({
            "rss_growth_bytes": rss() - rss0,
            "pending": getattr(rx, "num_pending_handshakes", None),
            "refused": getattr(rx, "num_handshake_failures", None),
            "pre_auth_buffered_bytes": None if buffered is None else buffered(),
        }), flush=True)  # fmt: skip
        for s in socks:
            s.close()


def overlap(args: argparse.Namespace, shaped: list[Json], reps: int) -> Json:
    """Layer-wise streaming where each layer's compute time equals its transfer time."""
    from prfaas.netlab import TwoSiteTestbed

    layers, layer_mib = 16, 8
    with TwoSiteTestbed(rate_mbit=1000) as tb:
        row = next((r for r in shaped if r["rate_mbit"] == 1000 and r["rtt_ms"] == 0), None)
        if row is None:  # measure the goodput the producer is paced to
            tput = ["--mode", "throughput", "--seconds", "3", "--warmup-s", "1.5"]
            tx, _, _ = Run(tb)(DEFAULT_NUM_CONNECTIONS, *tput, "--layers", "16", "--layer-mib", "2")
            goodput = tx["goodput_bytes_per_s"]
        else:
            goodput = row["goodput_mbit"] * 1e6 / 8
        layer_s = layer_mib * MIB / goodput
        tx, _, verified = Run(tb, slot_mib=layers * layer_mib)(
            DEFAULT_NUM_CONNECTIONS, "--mode", "overlap", "--warmup-s", "1.5",
            "--layers", str(layers), "--layer-mib", str(layer_mib),
            "--compute-s", f"{layer_s}", "--overlap-runs", str(max(3, reps)),
        )  # fmt: skip
    at = {v["request_id"]: v["at"] for v in verified}
    tails = [at[r] - t for r, t in zip(tx["request_ids"], tx["last_layer_at"], strict=True)]
    tail = _med(tails)
    return {
        "num_layers": layers, "layer_bytes": layer_mib * MIB, "goodput_mbit": goodput * 8 / 1e6,
        "compute_s_per_layer": layer_s, "tail_s": tail, "layer_transfer_s": layer_s,
        "session_transfer_s": layers * layer_s, "tail_over_layer": tail / layer_s,
        "tails_s": tails,
    }  # fmt: skip


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def print_table(r: dict[str, Any]) -> None:
    print(f"prfaas.transfer bench (default connections: {r['default_connections']})")
    print("\nloopback            goodput    iperf3 -l 1M   ratio   CPU s/GB")
    for row in r["loopback"]:
        print(f"  {row['connections']} conn        {row['goodput_gbps']:6.2f} Gb/s  "
              f"{_fmt(row['iperf3_gbps'], '6.2f')} Gb/s   {_fmt(row['ratio'], '5.2f')}"
              f"   {row['cpu_s_per_gb']:.2f}")  # fmt: skip
    if "tls" in r:
        t = r["tls"]
        print(f"  TLS {t['connections']} conn    {t['goodput_gbps']:6.2f} Gb/s  "
              f"({_fmt(t['goodput_vs_plain'], '.2f')} of plain)        "
              f"{t['cpu_s_per_gb']:.2f}")  # fmt: skip
    if "mac" in r:
        m = r["mac"]
        print(f"\nMAC cost, loopback {m['connections']} conn (CPU s/GB: sender / receiver / both)")
        for name in ("baseline", "this"):
            x = m[name]
            tx, rx = x["sender_cpu_s_per_gb"], x["receiver_cpu_s_per_gb"]
            print(f"  {name:9s} {tx:.3f} / {rx:.3f} / {x['cpu_s_per_gb']:.3f}   "
                  f"{x['goodput_gbps']:6.2f} Gb/s")  # fmt: skip
        print(f"  this / baseline: sender {m['sender_cpu_s_per_gb_ratio']:.2f}x, receiver "
              f"{m['receiver_cpu_s_per_gb_ratio']:.2f}x, both {m['cpu_s_per_gb_ratio']:.2f}x"
              + ("   OVER 1.3x" if m["over_1_3x"] else ""))  # fmt: skip
    if "preauth" in r:
        pa = r["preauth"]
        print(f"\n{pa['connections']} unauthenticated connections stopped after a HELLO header")
        for key, v in pa.items():
            if key == "connections":
                continue
            name, _, hello = key.partition("_hello_")
            print(f"  {name:9s} HELLO declaring {int(hello):8d} B: RSS +"
                  f"{v['rss_growth_bytes'] / MIB:6.1f} MiB, refused {v['refused']}, "
                  f"pre-auth buffered {_fmt(v['pre_auth_buffered_bytes'], 'd')} B")  # fmt: skip
    if "primitives" in r:
        print("\nper-frame MAC candidates, one core (GB/s)")
        for name, v in r["primitives"]["gb_per_s"].items():
            print(f"  {name:20s} {_fmt(v, '6.2f')}")
    if r["shaped"]:
        print("\nshaped (tbf)        conns  goodput        of rate   iperf3        RTT")
        for s in r["shaped"]:
            print(f"  {s['rate_mbit']:5.0f} Mb/s rtt {s['rtt_ms']:3.0f}ms  {s['connections']}   "
                  f"{s['goodput_mbit']:7.1f} Mb/s   {s['fraction']:.3f}    "
                  f"{_fmt(s['iperf3_mbit'], '7.1f')} Mb/s  "
                  f"{_fmt(s['measured_rtt_ms'], '.1f')}")  # fmt: skip
    if "overlap" in r:
        o = r["overlap"]
        print(
            f"\nlayer-wise overlap ({o['num_layers']} x {o['layer_bytes'] // MIB} MiB, compute "
            f"per layer = one layer's transfer {o['layer_transfer_s'] * 1000:.1f} ms, 1 Gb/s)"
        )
        print(f"  tail after last layer {o['tail_s'] * 1000:.1f} ms = {o['tail_over_layer']:.2f} x "
              f"one layer, {o['tail_s'] / o['session_transfer_s']:.3f} x the session")  # fmt: skip
    for n in r["notes"]:
        print(f"note: {n}")


def main() -> None:
    p = argparse.ArgumentParser(description="prfaas.transfer benchmark")
    sub = p.add_subparsers(dest="role")
    pap = sub.add_parser("_preauth")
    pap.add_argument("--src", required=True)
    pap.add_argument("--hello-bytes", type=int, required=True)
    rxp = sub.add_parser("_rx")
    rxp.add_argument("--host", default="127.0.0.1")
    rxp.add_argument("--port", type=int, default=0)
    rxp.add_argument("--slots", type=int, default=4)
    rxp.add_argument("--slot-mib", type=int, default=256)
    rxp.add_argument("--tls")
    txp = sub.add_parser("_tx")
    txp.add_argument("--host", default="127.0.0.1")
    txp.add_argument("--port", type=int, required=True)
    txp.add_argument("--connections", type=int, default=DEFAULT_NUM_CONNECTIONS)
    txp.add_argument("--mode", choices=["throughput", "overlap"], default="throughput")
    txp.add_argument("--seconds", type=float, default=3.0)
    txp.add_argument("--warmup-s", type=float, default=0.5)
    txp.add_argument("--layers", type=int, default=16)
    txp.add_argument("--layer-mib", type=int, default=4)
    txp.add_argument("--compute-s", type=float, default=0.0)
    txp.add_argument("--overlap-runs", type=int, default=3)
    txp.add_argument("--tls")
    txp.add_argument("--chunk-kib", type=int, default=1024)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="1 repeat, short windows")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0, help="measurement window per run")
    p.add_argument("--connections", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--only", nargs="+", default=SECTIONS, choices=SECTIONS, help="sections to run")
    p.add_argument("--baseline", type=Path, help="a tree (src/ + bench/) for the mac section")
    args = p.parse_args()
    if args.role == "_preauth":
        asyncio.run(preauth_main(args))
        return
    if args.role == "_rx":
        asyncio.run(rx_main(args))
        return
    if args.role == "_tx":
        asyncio.run(tx_main(args))
        return
    args.shaped = [(1000, 0, DEFAULT_NUM_CONNECTIONS), (200, 0, DEFAULT_NUM_CONNECTIONS),
                   (1000, 50, DEFAULT_NUM_CONNECTIONS), (1000, 50, 1)]  # fmt: skip
    result = bench(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
