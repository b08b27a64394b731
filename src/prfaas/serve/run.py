"""Run one process of a deployment: the gateway, or a worker hosting nodes of one site.

Used by ``prfaas serve`` (one process per host in production) and by the launcher. Ports may be 0:
the socket is bound first and its real port is what the node registers. The gateway listens twice,
in one uvicorn server (``serve.listeners``): the client port (OpenAI API) and the control port
(signed ``/internal/*``, what nodes register and heartbeat to). With ``tls.control_plane`` the
control port and every worker API are served over HTTPS (``serve.control_tls``); the client port
stays plain HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from prfaas.config import DeploymentConfig
from prfaas.errors import UsageError
from prfaas.serve.backend import ModelInfo
from prfaas.serve.control_tls import control_tls
from prfaas.serve.key_reload import install_sighup_reload
from prfaas.serve.listeners import MAX_UNVERIFIED, PortRouter, UnverifiedConnections, bind, serve
from prfaas.serve.node.sigterm_notice import notice_on_sigterm

log = logging.getLogger("prfaas.serve")


def gateway_tokenizer_and_model(d: DeploymentConfig) -> tuple[Any, ModelInfo]:
    home = d.engine_for(d.home_site.name)
    if home.kind == "vllm":  # token ids go to vLLM: the model folder's own tokenizer
        from prfaas.serve.vllm.server import model_max_len

        tokenizer, model = _hf_tokenizer_and_model(home.model_path, d.engine.model)
        limit = model_max_len(home)
        if limit is not None:  # vLLM refuses longer prompts: the gateway must first (a 400)
            model = ModelInfo(model.name, min(model.max_context_tokens, limit))
        return tokenizer, model
    if d.engine.kind == "timed":
        from prfaas.perf import cost_model_for_hardware
        from prfaas.serve.api import ByteTokenizer

        limit = cost_model_for_hardware(
            d.engine.model, d.home_site.hardware
        ).model.max_context_tokens
        return ByteTokenizer(), ModelInfo(d.engine.model, limit)
    return _hf_tokenizer_and_model(d.engine.model_path, d.engine.model)


def _hf_tokenizer_and_model(model_path: str | None, name: str) -> tuple[Any, ModelInfo]:
    from transformers import AutoConfig, AutoTokenizer

    assert model_path is not None
    tok = AutoTokenizer.from_pretrained(model_path)
    cfg = AutoConfig.from_pretrained(model_path)
    limit = int(getattr(cfg, "max_position_embeddings", 4096))
    return _HFTokenizer(tok), ModelInfo(name, limit)


class _HFTokenizer:
    def __init__(self, tok: Any) -> None:
        self._tok = tok
        self.eos_token_id = tok.eos_token_id
        self.vocab_size = len(tok)
        self.chat_template = getattr(tok, "chat_template", None)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tok.decode(token_ids, skip_special_tokens=True))

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        return self._tok.apply_chat_template(messages, **kwargs)


def run_gateway(d: DeploymentConfig, config_path: Path | None = None) -> None:
    """``config_path``: the file SIGHUP re-reads the keys from (``serve.key_reload``)."""
    from prfaas.serve.gateway.app import create_cluster_gateway

    gateway_cores = d.gateway_cores()
    if gateway_cores is not None:
        pin_process(gateway_cores, "gateway.cpus")
    tokenizer, model = gateway_tokenizer_and_model(d)
    apps = create_cluster_gateway(d, tokenizer, model)
    g = d.gateway
    client_sock = bind(g.host, g.port)
    control_sock = bind(g.host, g.control_port)
    control_port = control_sock.getsockname()[1]
    if g.control_port == 0:  # nobody can guess it: say it (the launcher picks ports itself)
        log.warning("control listener on %s:%d", g.host, control_port)
    router = PortRouter(apps.client, {control_port: apps.control})
    # Only the control port's callers sign: the client port's are not held to the quota.
    unverified = UnverifiedConnections(ports=[control_port])
    tls = control_tls(d)
    secure = {} if tls is None else {control_port: tls.server}

    async def main() -> None:
        install_sighup_reload(apps.keys, config_path)
        await serve(router, [client_sock, control_sock], unverified=unverified, tls=secure)

    asyncio.run(main())


def run_worker(
    d: DeploymentConfig,
    node_names: list[str],
    host: str = "127.0.0.1",
    config_path: Path | None = None,
) -> None:
    """A node process: prfaas engines (``WorkerHost``), or, at a vLLM site, the sidecar of one
    vLLM server (``VllmHost``); both speak the same node API."""
    from prfaas.serve.node.app import create_node_app
    from prfaas.serve.node.hosting import NodeHost

    site = d.site_of(node_names[0]).name
    cores = d.cores_of_site(site)
    if cores is not None:
        # A vLLM sidecar runs on its server's cores (``cpu_bind``; the server pins its own tree),
        # as a torch node does on ``engine.cpus``: the simulator charges the sidecar's terms to
        # the site's cores, and an unpinned sidecar went wherever the kernel put it (measured:
        # 41% of its CPU on its server's core, 59% on the other, docs/fidelity.md).
        vllm = d.engine_for(site).kind == "vllm"
        pin_process(cores, f"sites[{site}].engine." + ("vllm.cpu_bind" if vllm else "cpus"))

    async def main() -> None:
        worker: NodeHost
        if d.engine_for(site).kind == "vllm":
            from prfaas.serve.vllm.host import VllmHost

            worker = VllmHost(d, node_names, d.control_url, host=host)
        else:
            from prfaas.serve.node.host import WorkerHost

            worker = WorkerHost(d, node_names, d.control_url, host=host)
        port = max(d.node(n).port for n in node_names)
        sock = bind(host, port)
        port = sock.getsockname()[1]
        await worker.start(port)
        install_sighup_reload(worker.auth.keys, config_path)
        tls = control_tls(d)
        secure = {} if tls is None else {port: tls.server}
        app = create_node_app(worker)
        notice_s = _spot_notice_s(d, site, node_names)
        on_sigterm = None if notice_s is None else notice_on_sigterm(app, notice_s)
        await serve(
            app, [sock], unverified=UnverifiedConnections(node_connection_quota(d)), tls=secure,
            on_sigterm=on_sigterm,
        )  # fmt: skip

    asyncio.run(main())


def _spot_notice_s(d: DeploymentConfig, site: str, node_names: list[str]) -> float | None:
    """The notice of the spot group these nodes were added to (``autoscale:``), if any."""
    if d.autoscale is None or d.engine_for(site).kind == "vllm":
        return None
    found = [d.autoscale.spot_notice_s(site, n) for n in node_names]
    return min((x for x in found if x is not None), default=None)


def pin_process(cores: frozenset[int], field: str) -> None:
    """Run this process on ``cores``: every thread it has (the affinity is per thread on Linux:
    threads started during imports keep their own) and, from the main thread, every thread it
    starts later (torch's and the engine's among them)."""
    try:
        os.sched_setaffinity(0, cores)
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cores)
    except (OSError, ValueError) as exc:  # a core this host does not have
        have = sorted(os.sched_getaffinity(0))
        raise UsageError(
            f"{field}: cannot run on cores {sorted(cores)} (this host allows {have}): {exc}"
        ) from None


GATEWAY_CONNECTIONS_PER_REQUEST = 2
"""Connections one request the gateway holds may have open to one node at once (its decode
stream and a prefill or cache-move call)."""


def node_connection_quota(d: DeploymentConfig) -> int:
    """A node's quota of connections not yet verified (``serve.listeners``): the flood margin
    plus every connection its own gateway may open at once. A burst reaches a busy node as that
    many new connections before its event loop has read one head: with the bare 64, 180 requests
    at once on a torch decode node had 128 of its gateway's connections cut (ReadErrors, 116
    retried attempts; the fidelity bench, 2026-12-05)."""
    return MAX_UNVERIFIED + GATEWAY_CONNECTIONS_PER_REQUEST * d.gateway.max_inflight
