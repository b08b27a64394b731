"""A pool group's node process: ``python -m prfaas.pool.node_main WORKDIR GROUP [HOST] [--node
NODE]`` (the pool's launcher starts it; a Kubernetes pod gives HOST, its own address; ``--node``:
that one node in a process of its own, ``nodes-GROUP+NODE.yaml``). A deployment's PrfaaS node's
``WorkerHost`` with a pool node's parts (``serve.node.pool_host.PoolNodeHost``) and the same node
API, from the group's node deployment file
(``pool.nodes_file``), holding every tenant's key besides the pool's internal one: its KV links to
a tenant's receivers authenticate with that tenant's key (``PrefillCommand.key_id``), and it
registers and heartbeats at the front door's node listener. Each tenant's KV is paced on a route
of its own at that tenant's link rate (``PrefillCommand.tenant``, ``tenant_link_gbps``), every
route under the pool's ``egress_gbps`` as the process's egress cap (``PoolNodeHost``'s
``pool_egress_gbps``); the heartbeat carries one link reading per tenant route. A group's nodes
share one process (like a deployment's timed site) unless it runs them per node
(``PoolGroup.per_node_processes``). A group with ``notice_s`` is preemptible: SIGTERM is a spot
notice of that many wall seconds (``serve.node.sigterm_notice``: prefills that end in time are
finished, the rest handed back, which the front door queues again for another node), and the
process ends once they are done or at the deadline; without it SIGTERM stops the process.
Its prefix store keeps each tenant's prefixes in a namespace of its own (salted chains, a quota
each: ``serve.node.prefix_namespaces``, from the pool file's ``share_prefixes`` and tenants'
shares; the salts' secret is drawn from the pool's internal key at start); SIGHUP reloads the
quotas with the keys. A group with ``cpus`` runs its process on those cores, every thread, as a
deployment's node process does (``serve.run.pin_process``, from its node file's ``engine.cpus``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from prfaas.config import DeploymentConfig, load_deployment
from prfaas.errors import UsageError
from prfaas.pool.resolved import load_resolved, nodes_name, tenant_keys
from prfaas.pool_sections import PoolFileConfig
from prfaas.serve.key_reload import reload_keys, ring_from_file
from prfaas.serve.listeners import UnverifiedConnections, bind, serve
from prfaas.serve.node.prefix_namespaces import PrefixNamespaces
from prfaas.serve.node.sigterm_notice import notice_on_sigterm
from prfaas.serve.run import pin_process
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


def prefix_namespaces(pool: PoolFileConfig, internal_key: str) -> PrefixNamespaces:
    """The tenants' prefix namespaces and quotas the pool file says (``docs/pool.md``)."""
    return PrefixNamespaces.from_internal_key(
        internal_key, pool.prefix_shares(), pool.share_prefixes
    )


def pin_to_group_cores(d: DeploymentConfig, pool: PoolFileConfig, group: str) -> None:
    """This process, every thread, on ``group``'s ``cpus`` (its node file's ``engine.cpus``), as
    a deployment's node process pins itself (``serve.run.run_worker``); a core this host lacks is
    a ``UsageError`` naming ``groups.I.cpus``. No ``cpus``: left where the OS puts it."""
    cores = d.cores_of_site(group)
    if cores is not None:
        i = next(i for i, g in enumerate(pool.groups) if g.name == group)
        pin_process(cores, f"groups.{i}.cpus")


def run(workdir: Path, group: str, host: str | None = None, node: str | None = None) -> None:
    """``host``: the address the nodes bind and advertise; default the front door's host (one
    machine). A pod's differs from its front door's (a Service): it passes its own IP.
    ``node``: run that node of the group alone (its own file)."""
    from prfaas.serve.node.app import create_node_app
    from prfaas.serve.node.pool_host import PoolNodeHost

    nodes_file = workdir / nodes_name(group, node)
    d = load_deployment(nodes_file)
    names = [n.name for s in d.sites if s.kind == "prfaas" for n in s.nodes]
    host = host or d.gateway.host
    pin_to_group_cores(d, load_resolved(workdir), group)  # before torch starts its threads

    async def main() -> None:
        keys, tls = link_keys(workdir)
        pool = load_resolved(workdir)
        egress_gbps = pool.egress_gbps  # not reloaded: a restart changes it
        notice_s = next((g.notice_s for g in pool.groups if g.name == group), None)
        # The salts' secret is read once: a changed one would orphan what the store holds.
        internal_key = d.psk
        worker = PoolNodeHost(d, names, d.control_url, egress_gbps, host=host, link_keys=keys,
                              link_tls=tls,
                              prefix_namespaces=prefix_namespaces(pool, internal_key))  # fmt: skip
        sock = bind(host, max(d.node(n).port for n in names))
        await worker.start(sock.getsockname()[1])

        async def reload_tenants() -> None:
            try:
                keys, tls = link_keys(workdir)
                namespaces = prefix_namespaces(load_resolved(workdir), internal_key)
            except Exception as exc:  # a bad edit must not take the node down
                log.error("tenant keys not reloaded: %s", exc)
                return
            worker.set_prefix_namespaces(namespaces)
            closed = await worker.set_link_keys(keys, tls)
            log.warning("tenant keys reloaded: %s; %d KV links closed", sorted(keys), closed)

        def on_hup() -> None:
            # The launcher rewrote the resolved files: the internal key (signing) and the
            # tenants' keys (KV links: a revoked tenant's open links are closed).
            reload_keys(worker.auth.keys, lambda: ring_from_file(nodes_file))
            task = asyncio.ensure_future(reload_tenants())
            pending.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(pending.discard)

        pending: set[asyncio.Task[None]] = set()

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hup)
        app = create_node_app(worker)
        on_sigterm = None if notice_s is None else notice_on_sigterm(app, notice_s)
        await serve(app, [sock], unverified=UnverifiedConnections(), on_sigterm=on_sigterm)

    asyncio.run(main())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m prfaas.pool.node_main")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("group")
    parser.add_argument("host", nargs="?", default=None)
    parser.add_argument("--node", default=None, help="run this node of the group alone")
    args = parser.parse_args(argv)
    try:
        run(args.workdir, args.group, args.host, args.node)
    except UsageError as exc:  # one line in the process's log, as `prfaas serve` says it
        print(f"prfaas pool node {args.group}: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
