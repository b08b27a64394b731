"""A pool group's node process: ``python -m prfaas.pool.node_main WORKDIR GROUP [HOST]`` (the
pool's launcher starts it; a Kubernetes pod gives HOST, its own address). The same ``WorkerHost``
and node API as a deployment's PrfaaS node, from the group's node deployment file
(``pool.nodes_file``), holding every tenant's key besides the pool's internal one: its KV links to
a tenant's receivers authenticate with that tenant's key (``PrefillCommand.key_id``), and it
registers and heartbeats at the front door's node listener. Each tenant's KV is paced on a route
of its own at that tenant's link rate (``PrefillCommand.tenant``, ``tenant_link_gbps``), every
route under the pool's ``egress_gbps`` as the process's egress cap (``WorkerHost``'s
``pool_egress_gbps``); the heartbeat carries one link reading per tenant route. Timed groups
share one process (like a deployment's timed site).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from prfaas.config import load_deployment
from prfaas.pool.resolved import load_resolved, nodes_name, tenant_keys
from prfaas.serve.key_reload import reload_keys, ring_from_file
from prfaas.serve.listeners import UnverifiedConnections, bind, serve
from prfaas.transfer.link_pool import KeyTLS

log = logging.getLogger("prfaas.pool")


def link_keys(workdir: Path) -> tuple[dict[str, bytes], dict[str, KeyTLS]]:
    """Key id -> key of every tenant key that resolves now (the front door warns of the rest),
    and key id -> the TLS of its tenant's receivers (``receivers_tls``) where the file sets it."""
    pool = load_resolved(workdir)
    found = tenant_keys(pool, workdir, on_missing=lambda _: None)
    tls = {
        k.id: KeyTLS(t.receivers_tls.ca, t.receivers_tls.server_hostname)
        for t in pool.tenants if t.receivers_tls is not None for k in t.keys
    }  # fmt: skip
    return {kid: key for kid, (_, key) in found.items()}, tls


def run(workdir: Path, group: str, host: str | None = None) -> None:
    """``host``: the address the nodes bind and advertise; default the front door's host (one
    machine). A pod's differs from its front door's (a Service): it passes its own IP."""
    from prfaas.serve.node.app import create_node_app
    from prfaas.serve.node.host import WorkerHost

    d = load_deployment(workdir / nodes_name(group))
    names = [n.name for s in d.sites if s.kind == "prfaas" for n in s.nodes]
    host = host or d.gateway.host

    async def main() -> None:
        keys, tls = link_keys(workdir)
        egress_gbps = load_resolved(workdir).egress_gbps  # not reloaded: a restart changes it
        worker = WorkerHost(d, names, d.control_url, host=host, link_keys=keys, link_tls=tls,
                            pool_egress_gbps=egress_gbps)  # fmt: skip
        sock = bind(host, max(d.node(n).port for n in names))
        await worker.start(sock.getsockname()[1])

        async def reload_tenants() -> None:
            try:
                keys, tls = link_keys(workdir)
            except Exception as exc:  # a bad edit must not take the node down
                log.error("tenant keys not reloaded: %s", exc)
                return
            closed = await worker.set_link_keys(keys, tls)
            log.warning("tenant keys reloaded: %s; %d KV links closed", sorted(keys), closed)

        def on_hup() -> None:
            # The launcher rewrote the resolved files: the internal key (signing) and the
            # tenants' keys (KV links: a revoked tenant's open links are closed).
            reload_keys(worker.auth.keys, lambda: ring_from_file(workdir / nodes_name(group)))
            task = asyncio.ensure_future(reload_tenants())
            pending.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(pending.discard)

        pending: set[asyncio.Task[None]] = set()

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hup)
        await serve(create_node_app(worker), [sock], unverified=UnverifiedConnections())

    asyncio.run(main())


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
