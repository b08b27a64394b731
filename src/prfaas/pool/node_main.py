"""A pool group's node process: ``python -m prfaas.pool.node_main WORKDIR GROUP`` (the pool's
launcher starts it). The same ``WorkerHost`` and node API as a deployment's PrfaaS node, from the
group's node deployment file (``pool.nodes_file``), holding every tenant's key besides the pool's
internal one: its KV links to a tenant's receivers authenticate with that tenant's key
(``PrefillCommand.key_id``), and it registers and heartbeats at the front door's node listener.
Timed groups share one process (like a deployment's timed site).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from prfaas.config import load_deployment
from prfaas.pool.resolved import load_resolved, nodes_name, tenant_keys
from prfaas.serve.key_reload import install_sighup_reload
from prfaas.serve.listeners import UnverifiedConnections, bind, serve


def run(workdir: Path, group: str) -> None:
    from prfaas.serve.node.app import create_node_app
    from prfaas.serve.node.host import WorkerHost

    d = load_deployment(workdir / nodes_name(group))
    pool = load_resolved(workdir)
    found = tenant_keys(pool, workdir, on_missing=lambda _: None)  # the front door warns
    keys = {kid: key for kid, (_, key) in found.items()}
    names = [n.name for s in d.sites if s.kind == "prfaas" for n in s.nodes]

    async def main() -> None:
        host = d.gateway.host
        worker = WorkerHost(d, names, d.control_url, host=host, link_keys=keys)
        sock = bind(host, max(d.node(n).port for n in names))
        await worker.start(sock.getsockname()[1])
        install_sighup_reload(worker.auth.keys, workdir / nodes_name(group))
        await serve(create_node_app(worker), [sock], unverified=UnverifiedConnections())

    asyncio.run(main())


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2])
