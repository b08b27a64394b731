"""``LiveObserver``: the autoscaler's ``GroupObservation`` of a live PrfaaS site, from what the
gateway's control listener lists (``/internal/nodes`` rows, ``/internal/routes`` records) and the
provider's nodes.

- serving: the provider's serving nodes plus the file's own nodes of the site in rotation;
  starting: the provider's starting nodes with their remaining ``startup_s``;
- queued uncached tokens: the prefills waiting at the site's nodes (each row's queue depth, the
  gateway's count of prefills dispatched there and not done, less the batch the node reports
  running: the simulator's queue holds no running prefill) times the mean uncached length
  offered (the rows carry depths, not tokens);
- offered uncached tokens/s: the uncached tokens of the long prompts (over the threshold) routed
  since the last look, wherever they went (a long prompt prefilled locally is demand the pool
  did not take), over ``autoscale.rate_window_s`` (``policy.OfferedRate``: the elastic
  simulator's measure, so the same arrivals read the same rate);
- per-node speed: uncached tokens prefilled over seconds spent computing them, summed over every
  node of the site ever seen (each row's cumulative ``prefilled_tokens`` and ``prefill_busy_s``;
  a node that left, or restarted and counts from zero, keeps what it had counted), as the elastic
  simulator measures its pool; None (the configured prior) until some node has reported a
  prefill (a vLLM sidecar reports none).
No clock: ``now_s`` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prfaas.policy.autoscaler import GroupObservation
from prfaas.policy.offered_rate import OfferedRate
from prfaas.serve.elastic.provider import NodePhase, ProvidedNode


class LiveObserver:
    def __init__(
        self, site: str, threshold_tokens: int, startup_s: Mapping[str, float],
        rate_window_s: float, tick_s: float, group: str = "pool",
    ) -> None:  # fmt: skip
        self.site = site
        self.threshold_tokens = threshold_tokens
        self.startup_s = dict(startup_s)
        self.group = group
        self.rate_window_s = rate_window_s
        self.tick_s = tick_s
        self._seen: set[str] = set()
        self._offered: OfferedRate | None = None
        """Made at the first look, its origin one tick before (the loop's start)."""
        self._mean_tokens = float(threshold_tokens)
        self.num_lost = 0
        self._speed_now: dict[str, tuple[int, float]] = {}
        """Each node's latest (prefilled tokens, busy seconds)."""
        self._speed_past = (0, 0.0)
        """What nodes counted before they restarted (their counters went back)."""

    def observe(
        self,
        rows: Iterable[Mapping[str, Any]],
        routes: Iterable[Mapping[str, Any]],
        provided: Sequence[ProvidedNode],
        now_s: float,
    ) -> GroupObservation:
        mine = {p.name: p for p in provided}
        site_rows = [r for r in rows if r.get("site") == self.site and r.get("role") == "prefill"]
        serving = sum(
            1
            for r in site_rows
            if r.get("in_rotation")
            and (r["node"] not in mine or mine[r["node"]].phase is NodePhase.SERVING)
        )
        starting = tuple(
            max(0.0, self.startup_s.get(p.group, 0.0) - (now_s - p.started_s))
            for p in provided
            if p.phase is NodePhase.STARTING
        )
        draining = sum(1 for p in provided if p.phase is NodePhase.DRAINING)
        if self._offered is None:
            self._offered = OfferedRate(self.rate_window_s, self.tick_s, now_s - self.tick_s)
        offered_tokens, num_long = 0, 0
        listed: set[str] = set()
        for rec in routes:
            rid = str(rec.get("request_id"))
            listed.add(rid)
            if rid in self._seen:
                continue
            uncached = int(rec.get("num_prompt_tokens", 0)) - int(rec.get("num_cached_tokens", 0))
            if int(rec.get("num_prompt_tokens", 0)) > self.threshold_tokens:
                offered_tokens += uncached
                num_long += 1
        self._seen = listed  # the gateway's route log is a ring: remember what it still lists
        if num_long:
            self._mean_tokens = offered_tokens / num_long
        self._offered.add(now_s, offered_tokens)  # seen at this look (routed since the last)
        waiting = sum(
            max(0, int(r.get("queue_depth", 0)) - int(r.get("batch_size", 0))) for r in site_rows
        )  # a report lags the gateway's count by up to a heartbeat: never below 0
        queued = waiting * self._mean_tokens
        self._count_speed(site_rows)
        return GroupObservation(
            group=self.group,
            num_serving=serving,
            starting_remaining_s=starting,
            num_draining=draining,
            queued_uncached_tokens=int(queued),
            offered_tokens_per_s=self._offered.per_s(now_s),
            prefill_tokens_per_s_per_node=self.speed_tokens_per_s(),
            num_lost=self.num_lost,
        )

    def _count_speed(self, site_rows: Iterable[Mapping[str, Any]]) -> None:
        for r in site_rows:
            now = (int(r.get("prefilled_tokens", 0)), float(r.get("prefill_busy_s", 0.0)))
            before = self._speed_now.get(r["node"])
            if before is not None and (now[0] < before[0] or now[1] < before[1]):
                tokens, busy_s = self._speed_past
                self._speed_past = (tokens + before[0], busy_s + before[1])
            self._speed_now[r["node"]] = now

    def speed_tokens_per_s(self) -> float | None:
        """Measured prefill tokens per second per node (None: nothing measured yet)."""
        tokens, busy_s = self._speed_past
        for t, b in self._speed_now.values():
            tokens, busy_s = tokens + t, busy_s + b
        return tokens / busy_s if busy_s > 0 and tokens > 0 else None
