"""``CongestionRule``: the one rule that says an inter-site link is congested.

Every producer of a ``LinkState`` sets its ``congested`` flag by calling
``CongestionRule.congested`` with what that producer measures; policies only read the flag
(``policy/router.py`` adds its own, earlier *scarcity* thresholds with the same rule type). The
producers and their inputs:

- the simulator (``sim/link.py``): ``utilisation`` = EWMA goodput / capacity of its fluid link
  model, ``drain_s`` = backlog / capacity (infinite with no capacity); no loss, no queue beyond the
  backlog (retransmit rate and queueing are 0).
- the live gateway (``serve/gateway/registry.py``): ``utilisation`` = smoothed egress goodput /
  the senders' paced capacity, ``drain_s`` = egress backlog / capacity, ``retransmit_rate`` = the
  worst rate the PrfaaS nodes report from their transfer monitors; no queueing (wall-clock RTT on a
  busy emulation host is inflated without any network cause).
- the transfer monitor (``transfer/monitor.py``): all four from the sender's counters and
  ``TCP_INFO`` (goodput / capacity, backlog / capacity, retransmitted / sent segments,
  srtt - min_rtt).

A measure *over* its threshold (strictly) marks the link congested; one exactly at it does not.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CongestionRule:
    """Thresholds over which a link is congested (any one suffices)."""

    max_utilisation: float = 0.9
    """Goodput over capacity: the link is nearly full, new KV will queue."""
    max_drain_s: float = 1.0
    """Backlog over capacity, seconds: how long new KV would wait behind what is queued."""
    max_retransmit_rate: float = 0.02
    """Retransmitted over sent segments in the sampling interval: segments lost on the path."""
    max_queueing_s: float = 0.02
    """Smoothed RTT above the minimum RTT, seconds: absolute floor of the queueing threshold."""
    queueing_fraction: float = 0.5
    """... or this fraction of the minimum RTT, whichever is larger (long links jitter more)."""

    def congested(
        self,
        utilisation: float,
        drain_s: float,
        retransmit_rate: float = 0.0,
        queueing_s: float = 0.0,
        min_rtt_s: float = 0.0,
    ) -> bool:
        """Whether a link with these measures is congested. A producer that cannot measure one
        passes 0 for it (0 is never over a threshold)."""
        return (
            utilisation > self.max_utilisation
            or drain_s > self.max_drain_s
            or retransmit_rate > self.max_retransmit_rate
            or queueing_s > max(self.max_queueing_s, self.queueing_fraction * min_rtt_s)
        )
