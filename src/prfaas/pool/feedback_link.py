"""The tenant's own link to the pool, as its gateway's registry reads a PrfaaS site's link
(issue 21; ``docs/pool.md``, *The tenant's router reads its link*).

A tenant gateway sees the pool as the PrfaaS site ``pool`` whose ``pool`` node is kept alive by
``pool.tenant.TenantPoolLink`` from the pool's feedback. ``pool_node_rows`` turns that feedback
into what a two-site deployment's PrfaaS node process puts in its heartbeat for its link to the
home site: the node's ``NodeReport`` (its queue, and ``egress_backlog_bytes``: KV not yet handed
to the senders) and one ``SenderLinkReport`` for the ``pool -> home`` link (the pool's senders'
reading: capacity estimate and basis, pace, unacknowledged bytes, RTT, retransmit rate). The
registry then builds that link's ``LinkState`` with its one rule (``serve/gateway/registry.py``),
and the same bandwidth-aware router reads it, as it reads a PrfaaS site's link.

The backlog, as the two-site registry counts it (KV accepted for the link and not yet delivered,
a transfer counted whole from its first layer): the feedback's ``link_backlog_s`` at the rate the
tenant told (its running prefills' whole KV until their nodes answer) is the total; of it, the
reading's ``backlog_bytes`` is with the senders (sent, unacknowledged), the rest is reported as
the node's unsent bytes. The pool says no delivered bytes, so the link's goodput and utilisation
read 0 (a measure a producer cannot take is 0 for ``core.CongestionRule``): the link is scarce by
its backlog's drain time or its retransmit rate. Units: the feedback's are modelled (real bytes,
modelled seconds), the reading goes as is; the node's unsent bytes go in payload bytes (the
registry multiplies a node's byte counts by its site's ``byte_divisor``). No I/O.
"""

from __future__ import annotations

from typing import Literal

from prfaas.core.link_report import SenderLinkReport
from prfaas.pool.client import Feedback
from prfaas.serve.node.messages import NodeReport

GBPS_BYTES_PER_S = 1e9 / 8


def pool_node_rows(
    fb: Feedback | None,
    *,
    node: str,
    site: str,
    link_id: str,
    told_bytes_per_s: float,
    byte_divisor: int,
) -> tuple[NodeReport, list[SenderLinkReport]]:
    """The ``pool`` node's report and its link's reading from the pool's latest feedback
    (``fb`` None: an idle node, no reading). ``told_bytes_per_s``: the tenant's link rate as
    it told it (modelled bytes/s); ``byte_divisor``: real bytes per payload byte of ``site``."""
    if fb is None:
        return NodeReport(node=node, site=site, role="prefill"), []
    total = max(0.0, fb.link_backlog_s) * told_bytes_per_s
    reading = None if fb.link is None else fb.link.reading
    links: list[SenderLinkReport] = []
    unsent = total
    if reading is not None:
        basis: Literal["", "configured", "measured"] = ""
        if reading.basis == "measured":
            basis = "measured"
        elif reading.basis == "configured":
            basis = "configured"
        if basis:  # the registry counts this reading's bytes as the senders' part
            unsent = max(0.0, total - reading.backlog_bytes)
        else:  # not counted as senders' bytes there: the larger figure is the node's own
            unsent = max(total, float(reading.backlog_bytes))
        pace = reading.pace_gbps
        links.append(
            SenderLinkReport(
                link=link_id,
                configured_bytes_per_s=told_bytes_per_s,
                pace_bytes_per_s=None if pace is None else pace * GBPS_BYTES_PER_S,
                capacity_bytes_per_s=reading.capacity_gbps * GBPS_BYTES_PER_S,
                basis=basis,
                backlog_bytes=reading.backlog_bytes,
                rtt_s=reading.rtt_s,
                retransmit_rate=reading.retransmit_rate,
            )
        )
    report = NodeReport(
        node=node, site=site, role="prefill",
        queue_depth=fb.running, queued_tokens=fb.queued_tokens,
        egress_backlog_bytes=round(unsent / max(1, byte_divisor)),
    )  # fmt: skip
    return report, links
