"""``Autoscaler``: how many prefill nodes a group behind one admission queue should have.

The group is today's PrfaaS site behind the gateway, or one node group of the shared pool; the
inputs are the same (``GroupObservation``):

- the queued uncached tokens (work admitted and not started);
- the offered uncached tokens per second: what the group served, plus what it turned away or what
  went local for lack of its capacity (demand it would have taken with room);
- the measured prefill tokens per second of one node;
- the nodes serving, those starting (each with its remaining start-up) and those draining;
- the link the group's KV leaves by (``core.LinkState``) and the KV bytes per uncached token;
- the TTFT target.

The rule (llm-d's token-aware sizing, Dynamo's one-step-at-a-time loop, with the start-up and the
link that neither counts):

- *need* = (offered tokens/s + queued tokens / horizon) / per-node tokens/s, where the queue must
  drain within ``horizon`` = max(TTFT target, start-up): a node asked for now helps only once it
  has started, so a queue that clears sooner is no reason to add one;
- scale up to ceil(need / ``up_utilisation``) counting the nodes already starting as capacity on
  its way; scale down only when the load fits the smaller group under
  ``down_utilisation`` (< ``up_utilisation``: the gap is the hysteresis that keeps a steady load
  near a node boundary from flapping) and the queue is short, to the smallest such size at once;
- bounds (``min_nodes`` may be 0: demand wakes the group), a cooldown after each kind of action,
  and one decision in flight: until the group's counts show the last decision (or
  ``in_flight_timeout_s`` passed: the provider failed), nothing else is decided;
- with ``season_s``, the offered load one season ago over the next start-up is a forecast the
  group is sized for too (seasonal-naive), so a recurring burst finds its nodes started;
- a link-bound group is not scaled up: with the link congested or nearly full, or already carrying
  as many tokens/s as the nodes it has can prefill, more prefill would only queue on the link.

Every call returns a ``ScaleDecision`` with a reason (``hold`` included), and the desired size the
driver exports (``prfaas_autoscale_desired_nodes{group}``, for KEDA).

``wait_for_starting`` is the waiting room's rule for a request that finds only starting nodes.

Pure: ``now_s`` passed in; imports only ``core`` and ``policy.waiting_room``. The simulator and
the live provider drive the same object; it keeps only its own bookkeeping (last actions, the
decision in flight).
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

from prfaas.core.views import LinkState
from prfaas.policy.waiting_room import WaitDecision, WaitingRoom


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    min_nodes: int = 0
    """Never fewer (0: the group may sleep; demand wakes it)."""
    max_nodes: int = 8
    """Never more."""
    ttft_target_s: float = 2.0
    """The TTFT the queue must drain within (llm-d's budget: 1.5 s)."""
    startup_s: float = 180.0
    """Modelled start-up of a node: a queue that clears sooner is no reason to add one."""
    up_utilisation: float = 0.8
    """Scale up so that the offered load keeps each node at most this busy."""
    down_utilisation: float = 0.6
    """Drain a node only when the rest would be at most this busy."""
    up_cooldown_s: float = 30.0
    """After an add, wait this long before the next add."""
    down_cooldown_s: float = 300.0
    """After any action, wait this long before a drain (Dynamo's throughput loop: 180 s)."""
    down_stabilisation_s: float = 180.0
    """A drain goes only to the largest size the load asked to keep over this window (the
    Kubernetes HPA's scale-down stabilisation): a dip in a noisy rate drains nothing."""
    in_flight_timeout_s: float = 600.0
    """A decision the group's counts never show is given up after this long."""
    link_bound_utilisation: float = 0.9
    """The link at or over this utilisation (or congested) makes the group link-bound."""
    prior_tokens_per_s: float = 10_000.0
    """Per-node prefill speed assumed until one is measured (a group at zero nodes)."""
    season_s: float | None = None
    """The load's period, when it has one (a daily cycle, periodic bursts): the group is also
    sized for the offered load seen one season ago over the next ``startup_s`` (a seasonal-naive
    forecast), so nodes are ready when a recurring burst starts. None: reactive only."""
    history_bucket_s: float = 10.0
    """The offered load is remembered per bucket of this many seconds (for ``season_s``)."""
    forecast_lead_s: float = 60.0
    """The forecast looks this far past the start-up too: the offered rate is measured over a
    window, so a burst shows in the history that much after it began."""

    def __post_init__(self) -> None:
        if self.min_nodes < 0:
            raise ValueError(f"min_nodes must be >= 0, got {self.min_nodes}")
        if self.max_nodes < max(self.min_nodes, 1):
            raise ValueError(
                f"max_nodes ({self.max_nodes}) must be >= min_nodes ({self.min_nodes}) and >= 1"
            )
        if self.season_s is not None and not self.season_s > self.startup_s:
            raise ValueError(f"season_s ({self.season_s}) must be > startup_s ({self.startup_s})")
        for name in ("ttft_target_s", "prior_tokens_per_s", "history_bucket_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("startup_s", "up_cooldown_s", "down_cooldown_s", "in_flight_timeout_s",
                     "forecast_lead_s", "down_stabilisation_s"):  # fmt: skip
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 < self.down_utilisation < self.up_utilisation <= 1:
            raise ValueError(
                f"need 0 < down_utilisation ({self.down_utilisation}) < up_utilisation "
                f"({self.up_utilisation}) <= 1"
            )


@dataclass(frozen=True, slots=True)
class GroupObservation:
    group: str
    num_serving: int
    """Nodes in rotation (taking prefills)."""
    starting_remaining_s: tuple[float, ...] = ()
    """One entry per starting node: its remaining start-up (capacity on its way)."""
    num_draining: int = 0
    """Nodes finishing their work before they go (not capacity)."""
    queued_uncached_tokens: int = 0
    offered_tokens_per_s: float = 0.0
    """Served plus turned away or sent local for lack of this group's capacity."""
    prefill_tokens_per_s_per_node: float | None = None
    """Measured; None until one is (the config's prior is used)."""
    link: LinkState | None = None
    kv_bytes_per_token: float = 0.0
    """Mean KV bytes per uncached token crossing the link (0: no link bound known)."""
    num_lost: int = 0
    """Nodes lost so far (preempted, killed): a decision in flight is shown by the counts net of
    the nodes lost since it was made."""

    @property
    def num_starting(self) -> int:
        return len(self.starting_remaining_s)

    @property
    def num_nodes(self) -> int:
        """Capacity serving or on its way."""
        return self.num_serving + self.num_starting


class ScaleAction(enum.Enum):
    ADD = "add"
    DRAIN = "drain"
    HOLD = "hold"


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    group: str
    action: ScaleAction
    num_nodes: int
    """Nodes to add or drain (0 for hold)."""
    desired_nodes: int
    """The size the group should have (serving + starting), within the bounds."""
    reason: str
    at_s: float
    code: str = "steady"
    """The reason as a bounded label (for metrics): one of ``REASON_CODES``."""


REASON_CODES = ("in_flight", "below_min", "above_max", "link_bound", "up_cooldown", "load_up",
                "down_cooldown", "load_down", "steady")  # fmt: skip


class Autoscaler:
    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self._last_add_s = -math.inf
        self._last_action_s = -math.inf
        self._in_flight: tuple[ScaleAction, int, float, int] | None = None
        """(action, the group size it leads to, when decided, nodes lost by then)."""
        self._keeps: deque[tuple[float, int]] = deque()
        """(when, the size the load asked to keep then) over ``down_stabilisation_s``."""
        self._history: dict[int, float] = {}
        """Bucket -> the highest offered tokens/s seen in it (one season kept)."""

    def remember(self, offered_tokens_per_s: float, now_s: float) -> None:
        """Record the offered load (``decide`` does; for the seasonal forecast)."""
        c = self.config
        if c.season_s is None:
            return
        bucket = int(now_s // c.history_bucket_s)
        self._history[bucket] = max(self._history.get(bucket, 0.0), offered_tokens_per_s)
        keep = int(c.season_s // c.history_bucket_s) + 1
        if len(self._history) > 2 * keep:
            oldest = bucket - keep - int(c.startup_s // c.history_bucket_s) - 2
            self._history = {b: v for b, v in self._history.items() if b >= oldest}

    def forecast_tokens_per_s(self, now_s: float) -> float:
        """The highest offered load one season ago over the next ``startup_s`` and
        ``forecast_lead_s`` (0: no season, or no history yet)."""
        c = self.config
        if c.season_s is None:
            return 0.0
        start = int((now_s - c.season_s) // c.history_bucket_s)
        stop = int((now_s - c.season_s + c.startup_s + c.forecast_lead_s) // c.history_bucket_s)
        return max((self._history.get(b, 0.0) for b in range(start, stop + 1)), default=0.0)

    def desired_nodes(self, obs: GroupObservation, obs_now_s: float = 0.0) -> tuple[int, float]:
        """(the size the load asks for within the bounds, the need in nodes)."""
        c = self.config
        speed = obs.prefill_tokens_per_s_per_node or c.prior_tokens_per_s
        horizon_s = max(c.ttft_target_s, c.startup_s)
        offered = max(obs.offered_tokens_per_s, self.forecast_tokens_per_s(obs_now_s))
        need = (offered + obs.queued_uncached_tokens / horizon_s) / speed
        want = math.ceil(need / c.up_utilisation - 1e-9)
        if want == 0 and (obs.queued_uncached_tokens > 0 or offered > 0):
            want = 1  # any demand wakes a sleeping group
        return min(max(want, c.min_nodes), c.max_nodes), need

    def link_bound(self, obs: GroupObservation) -> str | None:
        """Why more nodes would only queue on the link, or None."""
        link = obs.link
        if link is None:
            return None
        if link.congested:
            return "the link is congested"
        if link.utilisation >= self.config.link_bound_utilisation:
            return f"the link is {link.utilisation:.0%} busy"
        if obs.kv_bytes_per_token > 0 and link.capacity_bytes_per_s > 0:
            link_tokens_per_s = link.capacity_bytes_per_s / obs.kv_bytes_per_token
            speed = obs.prefill_tokens_per_s_per_node or self.config.prior_tokens_per_s
            if obs.num_nodes * speed >= link_tokens_per_s:
                return (
                    f"{obs.num_nodes} nodes already prefill {obs.num_nodes * speed:.0f} tokens/s, "
                    f"the link carries {link_tokens_per_s:.0f}"
                )
        return None

    def decide(self, obs: GroupObservation, now_s: float) -> ScaleDecision:
        c = self.config
        self.remember(obs.offered_tokens_per_s, now_s)
        desired, need = self.desired_nodes(obs, now_s)

        def out(action: ScaleAction, num: int, reason: str, code: str) -> ScaleDecision:
            return ScaleDecision(obs.group, action, num, desired, reason, now_s, code)

        if self._in_flight is not None:
            action, target, since_s, lost = self._in_flight
            n = obs.num_nodes + max(0, obs.num_lost - lost)
            shown = n >= target if action is ScaleAction.ADD else n <= target
            if shown:
                self._in_flight = None
            elif now_s - since_s < c.in_flight_timeout_s:
                return out(
                    ScaleAction.HOLD, 0, f"the last {action.value} is in flight", "in_flight"
                )
            else:
                self._in_flight = None  # the provider did not carry it out: decide afresh
        have = obs.num_nodes
        load = f"need {need:.2f} nodes"
        if have < c.min_nodes:
            return self._act(obs, ScaleAction.ADD, desired - have, desired, now_s,
                             f"{load}; below min_nodes {c.min_nodes}", "below_min")  # fmt: skip
        if have > c.max_nodes:
            return self._act(obs, ScaleAction.DRAIN, have - c.max_nodes, desired, now_s,
                             f"{load}; above max_nodes {c.max_nodes}", "above_max")  # fmt: skip
        if desired > have:
            bound = self.link_bound(obs)
            if bound is not None:
                return out(
                    ScaleAction.HOLD,
                    0,
                    f"{load}, {have} on hand; link-bound: {bound}",
                    "link_bound",
                )
            if now_s - self._last_add_s < c.up_cooldown_s:
                return out(
                    ScaleAction.HOLD, 0, f"{load}, {have} on hand; up cooldown", "up_cooldown"
                )
            starting = f" ({obs.num_starting} starting)" if obs.num_starting else ""
            why = f"{load} at {c.up_utilisation:.0%}; {have} on hand{starting}"
            return self._act(obs, ScaleAction.ADD, desired - have, desired, now_s, why, "load_up")
        keep = self._stable_keep(self._keep_on_drain(obs, need, have), now_s)
        if keep < have:
            if now_s - self._last_action_s < c.down_cooldown_s:
                return out(
                    ScaleAction.HOLD, 0, f"{load}, {have} on hand; down cooldown", "down_cooldown"
                )
            return self._act(obs, ScaleAction.DRAIN, have - keep, desired, now_s,
                             f"{load}: {keep} nodes stay under "
                             f"{c.down_utilisation:.0%}", "load_down")  # fmt: skip
        return out(ScaleAction.HOLD, 0, f"{load}, {have} on hand", "steady")

    def _stable_keep(self, keep: int, now_s: float) -> int:
        keeps = self._keeps
        keeps.append((now_s, keep))
        while keeps and keeps[0][0] < now_s - self.config.down_stabilisation_s:
            keeps.popleft()
        return max(k for _, k in keeps)

    def _keep_on_drain(self, obs: GroupObservation, need: float, have: int) -> int:
        """The smallest group (>= min_nodes) the load fits under ``down_utilisation`` with a short
        queue; ``have`` when none smaller does. An oversized group shrinks in one step, so a
        steady load sees one event, not one per cooldown."""
        c = self.config
        idle = need == 0
        floor = c.min_nodes if idle else max(c.min_nodes, 1)
        keep = max(floor, math.ceil(need / c.down_utilisation - 1e-9))
        if keep >= have:
            return have
        if keep > 0:
            # The queue must be short too: drained nodes would leave it waiting on the rest.
            speed = obs.prefill_tokens_per_s_per_node or c.prior_tokens_per_s
            if obs.queued_uncached_tokens / (speed * keep) > c.ttft_target_s:
                return have
        return keep

    def _act(
        self, obs: GroupObservation, action: ScaleAction, num: int, desired: int, now_s: float,
        reason: str, code: str,
    ) -> ScaleDecision:  # fmt: skip
        if action is ScaleAction.ADD:
            self._last_add_s = now_s
            target = obs.num_nodes + num
        else:
            target = obs.num_nodes - num
        self._last_action_s = now_s
        self._in_flight = (action, target, now_s, obs.num_lost)
        return ScaleDecision(obs.group, action, num, desired, reason, now_s, code)


def wait_for_starting(
    room: WaitingRoom,
    obs: GroupObservation,
    *,
    arrived_s: float,
    now_s: float,
    num_uncached_tokens: int,
    local_prefill_s: float,
    prior_tokens_per_s: float,
) -> WaitDecision:
    """A request the group has no serving node for: wait for the first starting node only while
    its expected start (the remaining start-up, then the queue ahead, then its own prefill) beats a
    local prefill; otherwise local at once (the waiting room's rule)."""
    if obs.num_serving > 0:
        return room.decide(arrived_s=arrived_s, now_s=now_s, missing=None)
    if not obs.starting_remaining_s:
        return room.decide(arrived_s=arrived_s, now_s=now_s, missing="no node in the group",
                           alternative_s=local_prefill_s)  # fmt: skip
    speed = obs.prefill_tokens_per_s_per_node or prior_tokens_per_s
    first_s = min(obs.starting_remaining_s)
    expected_s = first_s + (obs.queued_uncached_tokens + num_uncached_tokens) / speed
    return room.decide(
        arrived_s=arrived_s, now_s=now_s, missing=f"a node starting ({first_s:.0f} s left)",
        expected_path_s=expected_s, alternative_s=local_prefill_s,
    )  # fmt: skip
