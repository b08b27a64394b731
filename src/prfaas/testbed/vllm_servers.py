"""vLLM OpenAI servers on this machine, for the e2e tests and ``bench/vllm_pd.py``: the command
line and environment of one server (plain, or with ``PrfaasConnector`` or another connector),
started in its own process group with its output in a log file, waited for until it answers
``/health`` (or said dead, with its log's tail), its connector's agent socket asked, and the
whole group stopped (SIGTERM, then SIGKILL).

``running`` starts a set of servers, waits for all of them and stops every one it started
however the block ends. The sidecar's own supervised server is ``prfaas.serve.vllm.server``;
this is the unsupervised one a test or benchmark holds for its duration. Imports httpx and
``prfaas.serve`` (the connector's config, process groups); never vllm (the servers run in
``.venv-vllm``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx

from prfaas.deployment_sections import default_vllm_python
from prfaas.integrations.vllm.settings import ConnectorSettings
from prfaas.serve.process_group import ChildGroup, terminate
from prfaas.serve.vllm.server import (
    PRIVATE_FOLDER_PREFIX,
    PSK_ENV,
    kv_transfer_config,
    private_folder_env,
)

SERVED_MODEL = "tiny"
STOP_GRACE_S = 30.0
LOG_TAIL_CHARS = 4000


def cached_tiny(arch: str, overrides: Mapping[str, Any], dtype: str = "float32") -> Path:
    """A tiny random-weight model at a path that stays the same from run to run (under
    ``$XDG_CACHE_HOME/prfaas/tiny-models``, keyed by the arguments and ``engine/torch/tiny.py``'s
    source): vLLM keys its compile cache by the model's path, so a compiled server of a model
    made in a fresh temporary folder compiles afresh every run (about a minute of CPU per server
    here), one made here once. Made in a temporary folder and renamed into place, so two runs at
    once never read half of one."""
    import hashlib
    import tempfile

    from prfaas.engine.torch import tiny

    key = json.dumps([arch, dict(overrides), dtype], sort_keys=True).encode()
    key += Path(tiny.__file__).read_bytes()
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prfaas"
    out = root / "tiny-models" / f"{arch}-{hashlib.sha256(key).hexdigest()[:16]}"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=".making-", dir=out.parent))
    tiny.make_tiny(arch, made, overrides=overrides, dtype=dtype)
    try:
        made.rename(out)
    except OSError:  # made by another run meanwhile: use that one
        shutil.rmtree(made, ignore_errors=True)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_call(path: str, req: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
    """One request to a connector's agent socket (one JSON object a line each way)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            part = s.recv(65536)
            if not part:
                break
            buf += part
    out: dict[str, Any] = json.loads(buf)
    return out


def prfaas_connector(
    listen_host: str,
    kv_port: int,
    agent: str,
    *,
    kv_budget_mib: int = 64,
    pace_gbps: float | None = None,
    num_connections: int = 4,
) -> dict[str, Any]:
    """``--kv-transfer-config`` of a server running ``PrfaasConnector`` (the sidecar's)."""
    return kv_transfer_config(
        ConnectorSettings(
            listen_host=listen_host,
            listen_port=kv_port,
            agent_socket=agent,
            kv_budget_mib=kv_budget_mib,
            pace_gbps=pace_gbps,
            num_connections=num_connections,
        )
    )


def vllm_argv(
    model: Path,
    host: str,
    port: int,
    *,
    dtype: str = "float32",
    max_model_len: int = 2048,
    kv_config: Mapping[str, Any] | None = None,
    extra_args: Sequence[str] = (),
    python: str | None = None,
    served: str = SERVED_MODEL,
) -> list[str]:
    argv = [
        python or default_vllm_python(), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", served, "--dtype", dtype,
        "--max-model-len", str(max_model_len), "--host", host, "--port", str(port),
    ]  # fmt: skip
    if kv_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_config)]
    return [*argv, *extra_args]


def vllm_env(core: int, psk: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment plus a server's: its OpenMP threads on ``core``, 1 GiB of KV
    cache, unbuffered output, the connector's key (``PRFAAS_KV_PSK``) when given."""
    env = dict(os.environ)
    env.update(VLLM_CPU_OMP_THREADS_BIND=str(core), VLLM_CPU_KVCACHE_SPACE="1")
    env["PYTHONUNBUFFERED"] = "1"
    if psk is not None:
        env[PSK_ENV] = psk
    env.update(extra)
    return env


def rpc_folder() -> Path:
    """A private folder for one server's IPC sockets and temporary files
    (``private_folder_env``: vLLM leaves them behind in ``/tmp`` otherwise), removed by
    ``stop``. Under the temporary folder, not the log folder: a socket's path must stay under
    108 bytes."""
    return Path(tempfile.mkdtemp(prefix=f"{PRIVATE_FOLDER_PREFIX}rpc-"))


def launch(
    argv: Sequence[str], env: Mapping[str, str], log: Path, pin_core: int | None = None
) -> subprocess.Popen[bytes]:
    """Start a server in its own process group (EngineCore and Worker go with it), its output
    into ``log``; ``pin_core`` puts the whole process tree on that core (inherited by every
    process and thread it starts), not only vLLM's OpenMP threads."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            preexec_fn=None if pin_core is None else (lambda: os.sched_setaffinity(0, {pin_core})),
        )


@dataclass
class ServerProcess:
    name: str
    host: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    agent: str = ""
    """The connector's agent socket ("" without PrfaasConnector)."""
    kv_port: int = 0
    """The connector's receiver port."""
    rpc_dir: Path | None = None
    """Its ``rpc_folder`` (None: vLLM's default, ``/tmp``), removed by ``stop``."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def agent_call(self, req: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        return agent_call(self.agent, req, timeout_s)

    def stats(self) -> dict[str, Any]:
        return self.agent_call({"op": "stats"})

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:]


def start(
    name: str,
    model: Path,
    core: int,
    log_dir: Path,
    *,
    dtype: str = "float32",
    extra_args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    psk: str | None = None,
    pace_gbps: float | None = None,
    max_model_len: int = 2048,
    served: str = SERVED_MODEL,
    pin: bool = False,
) -> ServerProcess:
    """One server on 127.0.0.1 with its OpenMP threads on ``core`` (``pin``: its whole process
    tree, as a deployment's ``cpu_bind`` does); with ``psk`` it runs ``PrfaasConnector``
    (receiver on a free port, agent socket in ``log_dir``, cross-site sends paced at
    ``pace_gbps``)."""
    host, port = "127.0.0.1", free_port()
    agent, kv_port, kv_config = "", 0, None
    if psk is not None:
        agent, kv_port = str(log_dir / f"{name}.sock"), free_port()
        kv_config = prfaas_connector(host, kv_port, agent, pace_gbps=pace_gbps)
    argv = vllm_argv(
        model,
        host,
        port,
        dtype=dtype,
        max_model_len=max_model_len,
        kv_config=kv_config,
        extra_args=extra_args,
        served=served,
    )
    log = log_dir / f"{name}.log"
    rpc = rpc_folder()
    env = vllm_env(core, psk, **private_folder_env(rpc), **(extra_env or {}))
    try:
        proc = launch(argv, env, log, core if pin else None)
    except BaseException:
        shutil.rmtree(rpc, ignore_errors=True)
        raise
    return ServerProcess(name, host, port, proc, log, agent, kv_port, rpc)


class Running(Protocol):
    """What waiting for and stopping a server needs (``ServerProcess`` and its subclasses)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    rpc_dir: Path | None

    @property
    def url(self) -> str: ...


def stop(server: Running, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the server's group, SIGKILL what is left after ``grace_s``, reap it; remove its
    ``rpc_dir`` with the sockets vLLM left there."""
    terminate([ChildGroup(server.proc)], grace_s)
    if server.rpc_dir is not None:
        shutil.rmtree(server.rpc_dir, ignore_errors=True)


def wait_healthy(servers: Sequence[Running], timeout_s: float) -> None:
    """Until every server answers ``/health`` 200 within one deadline; raises RuntimeError with
    the log's tail when one exits or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    for s in servers:
        while True:
            if s.proc.poll() is not None:
                tail = s.log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
                raise RuntimeError(f"{s.name} exited ({s.proc.returncode}):\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(s.url + "/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                tail = s.log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
                raise RuntimeError(f"{s.name} not healthy in {timeout_s:g} s:\n{tail}")
            time.sleep(1)


S = TypeVar("S", bound=Running)


@contextlib.contextmanager
def running(
    starts: Sequence[Callable[[], S]],
    timeout_s: float,
    stop_one: Callable[[S], None] = stop,
) -> Iterator[list[S]]:
    """Start each server (in order), wait until all answer, yield them; every server started is
    stopped (``stop_one``) however the block ends, also when a later start or the wait fails."""
    servers: list[S] = []
    try:
        for start_one in starts:
            servers.append(start_one())
        wait_healthy(servers, timeout_s)
        yield servers
    finally:
        for s in servers:
            stop_one(s)
