"""Where a ``netns: true`` deployment's processes run: the PrfaaS site in its own namespace.

``namespaced(d)`` sets up the two-site testbed (``prfaas.netlab``) for the deployment's one
PrfaaS site and returns it with the deployment whose gateway listens on this side's veth
address; ``namespaced_argv`` turns a worker's command line into one run inside its site's
namespace, listening on that namespace's address. The launcher tears the testbed down when it
stops. Not pure: ``ip``/``tc`` and a delay-line helper (root only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prfaas.config import DeploymentConfig
from prfaas.serve.launch_errors import LaunchError

if TYPE_CHECKING:
    from prfaas.netlab import TwoSiteTestbed


def namespaced(d: DeploymentConfig) -> tuple[TwoSiteTestbed, DeploymentConfig]:
    """Put the PrfaaS site in its own network namespace, joined to this one (the PD site and
    the gateway) by a veth whose PrfaaS -> PD direction is tbf-shaped to the link's emulated
    rate, with the link's RTT from a userspace delay line (``prfaas.netlab``). The gateway
    and PD workers then listen on this side's veth address."""
    from prfaas.netlab import TwoSiteTestbed, unavailable_reason

    remote = [s for s in d.sites if s.kind == "prfaas"]
    if len(remote) != 1:
        raise LaunchError("netns: true places exactly one PrfaaS site in a namespace")
    reason = unavailable_reason()
    if reason is not None:
        raise LaunchError(f"netns: true: {reason}")
    rate_mbit, one_way_delay_s = shaped_link(d, remote[0].name)
    testbed = TwoSiteTestbed(
        rate_mbit=rate_mbit,
        one_way_delay_s=one_way_delay_s,
        tcp_mem_max_bytes=64 << 20,
        b_in_root=True,
    )
    testbed.setup()
    gateway = d.gateway.model_copy(update={"host": testbed.ip_b})
    return testbed, d.model_copy(update={"gateway": gateway})


def namespaced_argv(
    testbed: TwoSiteTestbed, d: DeploymentConfig, cmd: list[str], args: list[str]
) -> tuple[list[str], list[str]]:
    """A worker's command and arguments (``--node NAME`` among them) run in its site's
    namespace: a PrfaaS site's in the testbed's namespace, the PD site's in this one."""
    site = d.site_of(args[args.index("--node") + 1])
    ns = "a" if site.kind == "prfaas" else "b"
    args = [*args, "--host", testbed.ip_a if ns == "a" else testbed.ip_b]
    return testbed.netns_argv(ns, cmd), args


def shaped_link(d: DeploymentConfig, remote_site: str) -> tuple[float, float]:
    """The tbf rate (Mbit/s) and one-way delay (s) of ``remote_site``'s veth: the modelled link
    in wall payload bytes. Only the timed engine scales time and bytes; a torch link runs at the
    file's rate (this once applied ``byte_divisor`` to real bytes too, as the node's pacer did)."""
    link = d.link_to_home(remote_site)
    assert link is not None
    eng = d.engine
    scale = eng.real_bytes_per_payload_byte * eng.wall_s_per_modelled_s
    return link.gbps * 1000 / scale, link.rtt_ms / 2000 * eng.wall_s_per_modelled_s
