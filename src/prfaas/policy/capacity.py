"""The paper's Eqs. 3-7 evaluated on a *sample* of recent uncached prompt lengths.

The online policies cannot assume the workload's distribution: they re-search the threshold ``t``
and the prefill/decode split on what they have observed, with the same cost model the planner uses
and the *exact-service* form of the equations (mean of ``T(l)`` over the requests, not ``T`` of the
mean length; what a queueing system actually serves). Lengths are sorted once and prefix sums make
every candidate threshold O(1), so a full search over ``t`` is O(sample) and a search over splits is
O(nodes x sample). Pure.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CapacityPoint:
    threshold_tokens: int
    fraction_offloaded: float
    theta_prfaas_rps: float
    theta_pdp_rps: float
    theta_pdd_rps: float
    lambda_rps: float
    num_prefill: int
    num_decode: int


class SampleCapacity:
    """Capacity of a deployment for one sample of lengths (tokens each request must prefill)."""

    def __init__(
        self,
        lengths: Sequence[int],
        remote_prefill_s: Callable[[int], float] | None,
        local_prefill_s: Callable[[int], float] | None,
        transfer_bytes: Callable[[int], int],
    ) -> None:
        if not lengths:
            raise ValueError("capacity needs at least one observed length")
        self.lengths = sorted(lengths)
        n = len(self.lengths)
        self._remote = [0.0] * (n + 1)
        self._local = [0.0] * (n + 1)
        self._bytes = [0.0] * (n + 1)
        for i, length in enumerate(self.lengths):
            r = remote_prefill_s(length) if remote_prefill_s else 0.0
            loc = local_prefill_s(length) if local_prefill_s else 0.0
            self._remote[i + 1] = self._remote[i] + r
            self._local[i + 1] = self._local[i] + loc
            self._bytes[i + 1] = self._bytes[i] + transfer_bytes(length)

    def point(
        self,
        num_short: int,
        num_prfaas: int,
        num_prefill: int,
        num_decode: int,
        decode_rps_per_node: float,
        link_bytes_per_s: float,
    ) -> CapacityPoint:
        """Eqs. 3-6 when the ``num_short`` shortest sampled requests stay local."""
        theta_prfaas, theta_pdp, theta_pdd, lam = self._thetas(
            num_short, num_prfaas, num_prefill, num_decode, decode_rps_per_node, link_bytes_per_s
        )
        n = len(self.lengths)
        t = self.lengths[num_short - 1] if num_short else 0
        return CapacityPoint(
            t, (n - num_short) / n, theta_prfaas, theta_pdp, theta_pdd, lam, num_prefill,
            num_decode,
        )  # fmt: skip

    def _thetas(
        self,
        k: int,
        num_prfaas: int,
        num_prefill: int,
        num_decode: int,
        decode_rps_per_node: float,
        link_bytes_per_s: float,
    ) -> tuple[float, float, float, float]:
        """(Theta_prfaas, Theta_pdp, Theta_pdd, lambda) when the ``k`` shortest stay local: the
        threshold search evaluates every ``k`` with this and builds a ``CapacityPoint`` only for
        the best one."""
        n = len(self.lengths)
        inf = float("inf")
        num_long = n - k
        if num_long:
            mean_t = (self._remote[n] - self._remote[k]) / num_long
            mean_b = (self._bytes[n] - self._bytes[k]) / num_long
            compute = num_prfaas / mean_t if mean_t > 0 else inf
            link = link_bytes_per_s / mean_b if mean_b > 0 else inf
            theta_prfaas = min(compute, link)
            a = theta_prfaas * n / num_long
        else:
            theta_prfaas, a = 0.0, inf
        if k:
            mean_l = self._local[k] / k
            theta_pdp = num_prefill / mean_l if mean_l > 0 else inf
            b = theta_pdp * n / k
        else:
            theta_pdp, b = 0.0, inf
        theta_pdd = num_decode * decode_rps_per_node
        return theta_prfaas, theta_pdp, theta_pdd, min(a, b, theta_pdd)

    def best_threshold(
        self,
        num_prfaas: int,
        num_prefill: int,
        num_decode: int,
        decode_rps_per_node: float,
        link_bytes_per_s: float,
    ) -> CapacityPoint:
        """Eq. 7 by exhaustive search over the sample's split points."""
        n = len(self.lengths)
        lo = 0 if num_prfaas > 0 and link_bytes_per_s > 0 else n
        hi = n if num_prefill > 0 else 0
        if lo > hi:
            raise ValueError("no prefill capacity at all: no PrfaaS and no local prefill node")
        best_k = -1
        best_lambda = 0.0
        lengths = self.lengths
        args = (num_prfaas, num_prefill, num_decode, decode_rps_per_node, link_bytes_per_s)
        for k in range(lo, hi + 1):
            if 0 < k < n and lengths[k - 1] == lengths[k]:
                continue  # a threshold cannot split equal lengths
            lam = self._thetas(k, *args)[3]
            if best_k < 0 or lam > best_lambda * (1 + 1e-12):
                best_k, best_lambda = k, lam
        return self.point(best_k, *args)

    def best_split(
        self,
        num_prfaas: int,
        num_local: int,
        decode_rps_per_node: float,
        link_bytes_per_s: float,
    ) -> CapacityPoint:
        """Eq. 8 by exhaustive search over N_p + N_d = ``num_local`` (each with its best ``t``)."""
        best: CapacityPoint | None = None
        for num_prefill in range(0, num_local):
            if num_prefill == 0 and num_prfaas == 0:
                continue
            p = self.best_threshold(
                num_prfaas, num_prefill, num_local - num_prefill, decode_rps_per_node,
                link_bytes_per_s,
            )  # fmt: skip
            if best is None or p.lambda_rps > best.lambda_rps * (1 + 1e-9):
                best = p
        if best is None:
            raise ValueError("no split has both prefill and decode capacity")
        return best

    def fraction_above(self, threshold_tokens: int) -> float:
        n = len(self.lengths)
        return (n - bisect.bisect_right(self.lengths, threshold_tokens)) / n
