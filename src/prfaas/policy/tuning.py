"""Online re-optimisation: ``ThresholdTuner`` (short timescale, the threshold ``t``) and
``Rebalancer`` (long timescale, converting home PD nodes between prefill and decode roles).

Both evaluate the paper's Eqs. 3-8 on the observed window of lengths (``SampleCapacity``) with the
cost model, the link capacity and the node counts they read from the ``ClusterView``:
- the tuner re-searches ``t`` when a PrfaaS link's capacity moved by more than
  ``capacity_change`` since the last search, when the node counts changed, or every ``period_s``.
  It keeps the planned threshold (the one in force at its first call) while every prefill stage
  and the link stay under ``target_utilisation`` at the observed arrival rate; otherwise it takes
  the smallest larger ``t`` that brings the PrfaaS side (compute and link) under the target while
  the local side stays under it too, and, if none does, the capacity-maximising ``t`` (Eq. 7).
  Balancing utilisation alone would move long prompts to the slower local hardware even when
  nothing is short of capacity, which costs TTFT; this rule moves them only when it must.
- the rebalancer acts when ``Theta_prfaas + Theta_pdp`` and ``Theta_pdd`` differ by more than
  ``imbalance`` (Eq. 8 far off) *and* the best split beats the current one by ``min_gain``; it
  returns every role change at once (the driver drains each node before converting it), then waits
  ``cooldown_s`` and for all conversions to finish before planning again.
Pure: ``now`` passed in; imports ``perf`` for timing, never the simulator.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass

from prfaas.core.ids import SiteId
from prfaas.core.topology import NodeRole
from prfaas.core.views import ClusterView
from prfaas.perf import CostModel
from prfaas.policy.capacity import CapacityPoint, SampleCapacity
from prfaas.policy.decisions import RebalancePlan, RoleChange, ThresholdUpdate
from prfaas.policy.window import LengthWindow


@dataclass(frozen=True, slots=True)
class TuningConfig:
    min_samples: int = 100
    """Do nothing until the window holds this many requests."""
    period_s: float = 30.0
    capacity_change: float = 0.10
    imbalance: float = 0.25
    min_gain: float = 0.05
    cooldown_s: float = 60.0
    target_utilisation: float = 0.9
    rebalance_check_s: float = 10.0
    """The rebalancer evaluates Eq. 8 at most this often (a search costs O(nodes x window))."""


class _Costs:
    def __init__(
        self, home_site: SiteId, prfaas_sites: Sequence[SiteId], remote: CostModel | None,
        local: CostModel,
    ) -> None:  # fmt: skip
        self.home_site = home_site
        self.prfaas_sites = tuple(prfaas_sites)
        self.remote = remote
        self.local = local
        # A search re-reads a window that mostly holds the lengths of the last one: per-length
        # prefill times are memoised (bounded) instead of asking the cost model ~4,000 times.
        self._remote_prefill_s = (
            functools.lru_cache(maxsize=1 << 14)(remote.prefill_s) if remote is not None else None
        )
        self._local_prefill_s = functools.lru_cache(maxsize=1 << 14)(local.prefill_s)
        # S_kv is affine in length beyond the SWA windows: fixed states + per-token full KV.
        cache = local.model.cache
        self._kv_fixed = local.kv_bytes(1) - cache.full_attention_bytes_per_token
        self._kv_per_token = cache.full_attention_bytes_per_token

    def _kv_bytes(self, num_tokens: int) -> int:
        return self._kv_fixed + self._kv_per_token * num_tokens

    def sample(self, window: LengthWindow) -> SampleCapacity:
        return SampleCapacity(
            window.prompt_lengths(), self._remote_prefill_s, self._local_prefill_s, self._kv_bytes
        )

    def decode_rps_per_node(self, window: LengthWindow) -> float:
        bs = self.local.max_decode_batch
        out = max(1.0, window.mean_output_tokens())
        ctx = bs * (sum(window.prompt_lengths()) / max(1, len(window)) + out / 2)
        return bs / (self.local.decode_step_s(bs, int(ctx)) * out)

    def link_bytes_per_s(self, cluster: ClusterView) -> float:
        total = 0.0
        for site in self.prfaas_sites:
            link = cluster.link(site, self.home_site)
            total += link.capacity_bytes_per_s if link is not None else float("inf")
        return total

    def counts(self, cluster: ClusterView) -> tuple[int, int, int, bool]:
        num_prfaas = sum(
            1 for s in self.prfaas_sites for n in cluster.nodes(s, NodeRole.PREFILL) if n.accepting
        )
        pre = cluster.nodes(self.home_site, NodeRole.PREFILL)
        dec = cluster.nodes(self.home_site, NodeRole.DECODE)
        draining = any(n.draining for n in pre) or any(n.draining for n in dec)
        num_p = sum(1 for n in pre if n.accepting)
        num_d = sum(1 for n in dec if n.accepting)
        return num_prfaas, num_p, num_d, draining


class ThresholdTuner:
    def __init__(
        self, home_site: SiteId, prfaas_sites: Sequence[SiteId], remote: CostModel | None,
        local: CostModel, config: TuningConfig | None = None,
    ) -> None:  # fmt: skip
        self._costs = _Costs(home_site, prfaas_sites, remote, local)
        self.config = config or TuningConfig()
        self._last_s = float("-inf")
        self._last_bytes_per_s = -1.0
        self._last_counts: tuple[int, int, int, bool] | None = None
        self._base_t: int | None = None

    def maybe_retune(
        self, cluster: ClusterView, now: float, window: LengthWindow
    ) -> ThresholdUpdate | None:
        cfg = self.config
        if self._base_t is None:
            self._base_t = cluster.threshold_tokens
        if len(window) < cfg.min_samples or not self._costs.prfaas_sites:
            return None
        bw = self._costs.link_bytes_per_s(cluster)
        counts = self._costs.counts(cluster)
        moved = abs(bw - self._last_bytes_per_s) > cfg.capacity_change * max(
            self._last_bytes_per_s, 1.0
        )
        reason = (
            "link capacity changed" if moved
            else "node counts changed" if counts != self._last_counts
            else "periodic" if now - self._last_s >= cfg.period_s
            else ""
        )  # fmt: skip
        if not reason:
            return None
        self._last_s, self._last_bytes_per_s, self._last_counts = now, bw, counts
        num_prfaas, num_p, num_d, _ = counts
        if num_d == 0 or (num_p == 0 and num_prfaas == 0):
            return None
        sample = self._costs.sample(window)
        decode_rps = self._costs.decode_rps_per_node(window)
        best = sample.best_threshold(num_prfaas, num_p, num_d, decode_rps, bw)
        chosen_t, lam = best.threshold_tokens, best.lambda_rps
        rate = window.rate_rps()
        if rate > 0 and num_p > 0:
            raised = self._least_raise(sample, rate, num_prfaas, num_p, num_d, decode_rps, bw)
            if raised is not None:
                chosen_t, lam = raised
        if chosen_t == cluster.threshold_tokens:
            return None
        return ThresholdUpdate(chosen_t, lam, reason)

    def _least_raise(
        self, sample: SampleCapacity, rate: float, num_prfaas: int, num_p: int, num_d: int,
        decode_rps: float, bw: float,
    ) -> tuple[int, float] | None:  # fmt: skip
        """None when the local pool is over target at the planned ``t`` (then the caller takes the
        capacity-maximising ``t``, which lowers it); else the planned ``t`` if every stage fits
        under the target at ``rate``; else the smallest larger ``t`` that brings the PrfaaS side
        (compute, link) under it; but never a ``t`` that pushes the local prefill pool over it
        (short requests have nowhere else to go, and a backlog on the link drains far faster once
        the link recovers than one on the pool)."""
        assert self._base_t is not None
        target = self.config.target_utilisation
        lengths = sample.lengths
        n = len(lengths)
        k0 = bisect.bisect_right(lengths, self._base_t)
        last_ok: tuple[int, float] | None = None
        for k in range(k0, n + 1):
            if k0 < k < n and lengths[k - 1] == lengths[k]:
                continue
            p = sample.point(k, num_prfaas, num_p, num_d, decode_rps, bw)
            off = p.fraction_offloaded
            u_remote = rate * off / p.theta_prfaas_rps if off > 0 else 0.0
            u_local = rate * (1 - off) / p.theta_pdp_rps if off < 1 else 0.0
            if u_local > target:
                if k == k0:
                    return None  # the local pool is over target already: capacity-optimal t
                break
            last_ok = (self._base_t if k == k0 else p.threshold_tokens, p.lambda_rps)
            if u_remote <= target:
                break
        if last_ok is None:
            return self._base_t, 0.0
        return last_ok


class Rebalancer:
    def __init__(
        self, home_site: SiteId, prfaas_sites: Sequence[SiteId], remote: CostModel | None,
        local: CostModel, config: TuningConfig | None = None,
    ) -> None:  # fmt: skip
        self._costs = _Costs(home_site, prfaas_sites, remote, local)
        self.config = config or TuningConfig()
        self._last_s = float("-inf")
        self._checked_s = float("-inf")

    def evaluate(
        self, cluster: ClusterView, window: LengthWindow
    ) -> tuple[CapacityPoint, CapacityPoint]:
        """(current split at its best ``t``, best split) on the observed window."""
        c = self._costs
        num_prfaas, num_p, num_d, _ = c.counts(cluster)
        sample = c.sample(window)
        rate = c.decode_rps_per_node(window)
        bw = c.link_bytes_per_s(cluster)
        current = sample.best_threshold(num_prfaas, num_p, num_d, rate, bw)
        best = sample.best_split(num_prfaas, num_p + num_d, rate, bw)
        return current, best

    def plan(self, cluster: ClusterView, now: float, window: LengthWindow) -> RebalancePlan | None:
        cfg = self.config
        if len(window) < cfg.min_samples or now - self._last_s < cfg.cooldown_s:
            return None
        if now - self._checked_s < cfg.rebalance_check_s:
            return None
        self._checked_s = now
        c = self._costs
        _, num_p, num_d, draining = c.counts(cluster)
        if draining or num_p + num_d < 2:
            return None
        current, best = self.evaluate(cluster, window)
        prefill = current.theta_prfaas_rps + current.theta_pdp_rps
        ratio = prefill / current.theta_pdd_rps if current.theta_pdd_rps > 0 else float("inf")
        if 1 / (1 + cfg.imbalance) <= ratio <= 1 + cfg.imbalance:
            return None
        if best.lambda_rps < current.lambda_rps * (1 + cfg.min_gain):
            return None
        self._last_s = now
        changes: list[RoleChange] = []
        home = c.home_site
        if best.num_prefill < num_p:
            nodes = sorted(
                (n for n in cluster.nodes(home, NodeRole.PREFILL) if n.accepting),
                key=lambda n: (n.queued_tokens, n.node_id),
            )
            for n in nodes[: num_p - best.num_prefill]:
                changes.append(RoleChange(n.node_id, NodeRole.PREFILL, NodeRole.DECODE))
        elif best.num_prefill > num_p:
            nodes = sorted(
                (n for n in cluster.nodes(home, NodeRole.DECODE) if n.accepting),
                key=lambda n: (n.batch_size + n.queue_depth, n.node_id),
            )
            for n in nodes[: best.num_prefill - num_p]:
                changes.append(RoleChange(n.node_id, NodeRole.DECODE, NodeRole.PREFILL))
        why = (
            f"Theta_prefill {prefill:.2f} vs Theta_pdd {current.theta_pdd_rps:.2f} req/s; "
            f"{num_p}/{num_d} -> {best.num_prefill}/{best.num_decode} "
            f"(lambda {current.lambda_rps:.2f} -> {best.lambda_rps:.2f})"
        )
        return RebalancePlan(
            tuple(changes), best.num_prefill, best.num_decode, best.threshold_tokens,
            best.lambda_rps, why,
        )  # fmt: skip
