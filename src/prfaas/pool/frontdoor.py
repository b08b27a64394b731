"""``FrontDoor``: the pool front door's state and rules, sans I/O (``docs/pool.md``, API v1).

The HTTP layer (``pool.service``) authenticates a call to a tenant (its key id names the tenant)
and hands this object the tenant and the body; this object decides. It owns what ``PoolAdmission``
(the shared admission and fair-share policy) does not: the epoch every answer carries, each
tenant's registered receivers, own link (the rate it told at registration) and lease, the model
fingerprints a submit must match, the outcomes a tenant may read, and isolation: a tenant submits
only as itself and only to receivers it registered, and reads only its own outcomes and
feedback. Placement on a free node goes through ``PoolAdmission.dispatch`` (which prefill), then
``policy.pool_placement`` (which of the group's free nodes: the one holding the longest prefix of
it for its tenant, when the caller gives ``PlacementHints``; its start is charged the compute that
node will do; at a done outcome whose node found more or less than expected, the charge is
trued up to what it really computed: ``policy.pool_placement.settle_cached``, the simulator's
end too); a lease that expires or a revoked tenant drops its queued prefills and aborts its
running ones with the reason. A placed prefill frees its node for the next placement once its
node has computed it (``computed``), and ends later (``finished``: its KV verified, or failed;
aborted; handed back): the outcome follows the end, never the compute. A prefill its node hands
back (a spot notice) is queued again at the front of its tenant's queue (``requeue``: its outcome
reads ``queued`` again, reason ``handed_back``), to the same receiver and session, up to
``MAX_HAND_BACKS`` times; once more and it fails (``handed_back``), so nothing circulates for
ever. Pure: ``now`` passed in; no I/O, no clock, no asyncio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prfaas.core.fingerprint import first_difference
from prfaas.policy.pool_admission import (
    Accepted,
    EgressState,
    PoolAdmission,
    PoolFeedback,
    PrefillJob,
    Refused,
)
from prfaas.policy.pool_placement import Placed, PlacementHints, dispatch_cached, settle_cached
from prfaas.policy.pool_shares import PoolShape, TenantShare
from prfaas.pool.tenant_links import TenantLink

API_VERSION = "v1"
MAX_HAND_BACKS = 3
"""Times one prefill may come back unfinished from a noticed node and be queued again; the next
fails it (the tenant prefills it locally): three nodes noticed under one prefill is a pool losing
its spot capacity, where waiting for a fourth would only add to the tenant's TTFT."""


@dataclass(frozen=True, slots=True)
class Receiver:
    """A tenant's decode receiver: where KV may be sent for it."""

    name: str
    host: str
    transfer_port: int


@dataclass(frozen=True, slots=True)
class Submit:
    """A tenant's submit (API v1 ``POST /v1/submit``), after the HTTP layer parsed it."""

    tenant: str
    """The tenant the body names; must be the caller's."""
    request_id: str
    model: str
    fingerprint: tuple[tuple[str, str], ...]
    num_uncached_tokens: int
    receiver: str
    session: str
    compute_s: float
    """The group's node profile's ``T_prefill`` for these tokens (the HTTP layer costs it)."""
    kv_bytes: int


@dataclass(frozen=True, slots=True)
class Answer:
    """What a submit gets: ``decision`` with the front door's ``epoch``; ``status`` the HTTP code
    it maps to (200 accepted, 429 over a cap, 403 isolation, 404 unknown, 409 fingerprint)."""

    epoch: int
    decision: Accepted | Refused
    status: int


@dataclass(frozen=True, slots=True)
class Outcome:
    epoch: int
    request_id: str
    state: str
    """``queued`` | ``running`` | ``done`` | ``failed`` | ``aborted``."""
    reason: str = ""
    """Why it failed or was aborted; ``handed_back`` on a prefill queued again after a noticed
    node gave it back (still pending)."""
    kv_bytes_sent: int = 0
    """A done prefill's KV payload bytes its node sent (what the tenant's route log counts)."""
    cached_tokens: int = 0
    """A done prefill's prompt tokens its node found in the tenant's prefixes there (not
    computed again)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Start ``job`` on ``node``; its KV goes to ``receiver`` for ``session``."""

    job: PrefillJob
    node: str
    receiver: Receiver
    session: str
    cached_tokens: int = 0
    """Prompt tokens ``node`` is expected to find in the tenant's prefixes (its reports)."""
    compute_s: float | None = None
    """The node-seconds its start was charged (None: the submitted ``job.compute_s``)."""


@dataclass(frozen=True, slots=True)
class Abort:
    tenant: str
    request_id: str
    reason: str
    """``lease_expired`` | ``revoked`` | ``client_gone`` (the tenant aborted it)."""
    node: str | None
    """The node to stop, or None (it was only queued)."""


@dataclass(frozen=True, slots=True)
class _Run:
    """A placed prefill until it ends: where, and how it was placed and charged (what its
    outcome's true-up prices with)."""

    job: PrefillJob
    node: str
    placed: Placed
    hints: PlacementHints | None


@dataclass(slots=True)
class _TenantState:
    receivers: dict[str, Receiver] = field(default_factory=dict)
    link: TenantLink | None = None
    """None: the tenant did not say (an older caller): its KV is paced by the egress alone."""
    lease_until_s: float = -1.0
    revoked: bool = False


_STATUS = {
    "unknown_tenant": 404,
    "unknown_model": 404,
    "over_queued_tokens_cap": 429,
    "over_rate_cap": 429,
    "wrong_tenant": 403,
    "receiver_not_registered": 403,
    "no_lease": 403,
    "revoked": 403,
    "fingerprint_mismatch": 409,
}


class FrontDoor:
    def __init__(
        self,
        shape: PoolShape,
        epoch: int,
        lease_s: float,
        fingerprints: Mapping[str, Mapping[str, str]],
    ) -> None:
        """``fingerprints``: per model served, its fields (``core.fingerprint``)."""
        self.shape = shape
        self.epoch = epoch
        self.lease_s = lease_s
        self.admission = PoolAdmission(shape)
        self._fingerprints = {m: dict(f) for m, f in fingerprints.items()}
        self._tenants = {t.name: _TenantState() for t in shape.tenants}
        self._outcomes: dict[tuple[str, str], Outcome] = {}
        self._targets: dict[tuple[str, str], tuple[Receiver, str]] = {}
        self._running: dict[tuple[str, str], _Run] = {}
        self._hand_backs: dict[tuple[str, str], int] = {}
        """(tenant, request id) -> times it was handed back and queued again, until it ends."""

    # -- tenants' calls (the caller is ``tenant``, authenticated by its key) -------------------
    def register(
        self,
        tenant: str,
        receivers: tuple[Receiver, ...],
        now: float,
        link: TenantLink | None = None,
    ) -> int:
        """Replace the tenant's receivers and its link (None: not said, unpaced by it); renews
        its lease. Returns the epoch."""
        st = self._tenants[tenant]
        st.receivers = {r.name: r for r in receivers}
        st.link = link
        st.lease_until_s = now + self.lease_s
        return self.epoch

    def heartbeat(self, tenant: str, now: float) -> int:
        self._tenants[tenant].lease_until_s = now + self.lease_s
        return self.epoch

    def submit(self, tenant: str, req: Submit, now: float) -> Answer:
        refusal = self._isolation(tenant, req, now)
        if refusal is not None:
            return Answer(self.epoch, refusal, _STATUS[refusal.reason])
        job = PrefillJob(tenant, req.request_id, req.model, req.num_uncached_tokens,
                         req.compute_s, req.kv_bytes)  # fmt: skip
        decision = self.admission.submit(job, now)
        if isinstance(decision, Refused):
            return Answer(self.epoch, decision, _STATUS[decision.reason])
        key = (tenant, req.request_id)
        if key not in self._outcomes:
            receiver = self._tenants[tenant].receivers[req.receiver]
            self._targets[key] = (receiver, req.session)
            self._outcomes[key] = Outcome(self.epoch, req.request_id, "queued")
        return Answer(self.epoch, decision, 200)

    def outcome(self, tenant: str, request_id: str) -> Outcome | None:
        """The tenant's own request only (another tenant's id reads as unknown)."""
        return self._outcomes.get((tenant, request_id))

    def feedback(self, tenant: str, now: float, egress: EgressState | None = None) -> PoolFeedback:
        """The tenant's own feedback; ``egress`` (the driver's, with the tenants' links) gives
        its link backlog."""
        return self.admission.feedback(tenant, now, egress)

    def link_of(self, tenant: str) -> TenantLink | None:
        """The link the tenant registered (None: unknown tenant, or it did not say)."""
        st = self._tenants.get(tenant)
        return None if st is None else st.link

    def tenant_links(self) -> tuple[tuple[str, float], ...]:
        """(tenant, modelled bytes/s) of every tenant that told its link: the admission's
        ``EgressState.tenant_link_bytes_per_s`` (a tenant whose own link is full starts no more
        prefills)."""
        return tuple(
            (name, st.link.bytes_per_s)
            for name, st in sorted(self._tenants.items())
            if st.link is not None
        )

    # -- the pool's side -----------------------------------------------------------------------
    def place(
        self,
        group: str,
        node: str,
        now: float,
        egress: EgressState,
        others: Sequence[str] = (),
        hints: PlacementHints | None = None,
    ) -> Placement | None:
        """What a free node of ``group`` should run now, or None: the admission picks the
        prefill (the fair-share rule); with ``hints``, it goes to the one of ``node`` and
        ``others`` (free nodes of the group, in the caller's order) whose store holds the longest
        prefix of its prompt for its tenant (ties: the first), and is charged the compute that
        node will do (``policy.pool_placement``). Without hints: ``node``, charged as submitted."""
        # The placement the pool simulator runs too (``policy.pool_placement``).
        placed = dispatch_cached(self.admission, group, (node, *others), now, egress, hints)
        if placed is None:
            return None
        job, pick = placed.job, placed.pick
        key = (job.tenant, job.request_id)
        receiver, session = self._targets[key]  # kept until it ends: a requeue places it again
        self._running[key] = _Run(job, pick.node, placed, hints)
        self._outcomes[key] = Outcome(self.epoch, job.request_id, "running")
        return Placement(job, pick.node, receiver, session, pick.cached_tokens, placed.compute_s)

    def computed(self, tenant: str, request_id: str, now: float) -> bool:
        """The node running this prefill has computed it (its last layer handed to the link):
        the node may take its next placement, while this one stays ``running`` (its KV on its
        way to be verified) until ``finished``, ``requeue`` or an abort ends it, exactly as
        before. False when it is not running (aborted meanwhile, or ended)."""
        ran = self._running.get((tenant, request_id))
        if ran is None:
            return False
        self.admission.computed(ran.job, now)
        return True

    def finished(
        self,
        tenant: str,
        request_id: str,
        now: float,
        error: str = "",
        kv_bytes_sent: int = 0,
        cached_tokens: int = 0,
    ) -> float:
        """A placed prefill ended: done (its node sent ``kv_bytes_sent`` payload bytes and found
        ``cached_tokens`` of the prompt in the tenant's prefixes), or failed with ``error`` (a
        lost node, a refused link). A done one whose node found other than its placement
        expected has its tenant's charge trued up to what the node really computed
        (``settle_cached``, with the hints it was placed with); a failed one keeps its charge.
        Returns the correction (``PoolAdmission.finish``: negative, refunded; positive,
        surcharged; 0.0: none, or not running: aborted already)."""
        key = (tenant, request_id)
        ran = self._running.pop(key, None)
        if ran is None:
            return 0.0  # aborted already
        found = None if error else cached_tokens
        delta = settle_cached(self.admission, ran.job, now, ran.placed, found, ran.hints)
        self._ended(key)
        state = "failed" if error else "done"
        self._outcomes[key] = Outcome(
            self.epoch, request_id, state, error, kv_bytes_sent, cached_tokens
        )
        return delta

    def requeue(self, tenant: str, request_id: str, now: float, why: str = "") -> Outcome | None:
        """The node running this prefill handed it back unfinished (a spot notice; ``why``, the
        node's words): it is queued again at the front of its tenant's queue for the same
        receiver and session (its outcome ``queued``, reason ``handed_back``), or, handed back
        more than ``MAX_HAND_BACKS`` times, it fails (reason ``handed_back: ...``). None when it
        was not running (aborted meanwhile)."""
        key = (tenant, request_id)
        ran = self._running.pop(key, None)
        if ran is None:
            return None
        job = ran.job
        times = self._hand_backs.get(key, 0) + 1
        if times > MAX_HAND_BACKS:
            self.admission.finish(job, now)
            self._ended(key)
            reason = f"handed_back: {times} times by noticed nodes; last: {why}"[:200]
            out = Outcome(self.epoch, request_id, "failed", reason)
        else:
            self._hand_backs[key] = times
            self.admission.requeue(job, now)
            out = Outcome(self.epoch, request_id, "queued", "handed_back")
        self._outcomes[key] = out
        return out

    def abort(self, tenant: str, request_id: str, now: float) -> Abort | None:
        """The tenant gave up on one prefill (its client went away): dropped if queued, to be
        stopped at its node if running (``client_gone``); None when it is neither (unknown,
        another tenant's, or ended)."""
        key = (tenant, request_id)
        node: str | None = None
        ran = self._running.pop(key, None)
        if ran is not None:
            job, node = ran.job, ran.node
            self.admission.finish(job, now)
        elif self.admission.cancel(tenant, request_id, now) is None:
            return None
        self._ended(key)
        self._outcomes[key] = Outcome(self.epoch, request_id, "aborted", "client_gone")
        return Abort(tenant, request_id, "client_gone", node)

    def expire(self, now: float) -> tuple[Abort, ...]:
        """Tenants whose lease ran out lose their queued prefills; running ones are aborted."""
        aborts: list[Abort] = []
        for name, st in self._tenants.items():
            if st.lease_until_s >= 0 and now > st.lease_until_s:
                st.lease_until_s = -1.0
                aborts.extend(self._drop(name, "lease_expired", now))
        return tuple(aborts)

    def revoke(self, tenant: str, now: float) -> tuple[Abort, ...]:
        """The tenant's keys were revoked: its work is dropped and aborted (``revoked``)."""
        st = self._tenants[tenant]
        st.revoked = True
        st.receivers.clear()
        st.link = None
        st.lease_until_s = -1.0
        return self._drop(tenant, "revoked", now)

    def set_tenants(self, shares: Sequence[TenantShare], now: float) -> tuple[Abort, ...]:
        """The pool's tenant list after a reload: each of ``shares`` is a tenant with an active
        key (added if new, its weight and caps applied, no longer revoked); a known tenant not
        among them has lost every key and is revoked (its queued prefills dropped, its running
        ones to be aborted: the returned aborts). A revoked tenant that comes back registers
        afresh (it has no lease and no receivers)."""
        for share in shares:
            self.admission.set_tenant(share, now)
            st = self._tenants.setdefault(share.name, _TenantState())
            st.revoked = False
        self.shape = self.admission.shape
        keep = {s.name for s in shares}
        aborts: list[Abort] = []
        for name, st in self._tenants.items():
            if name not in keep and not st.revoked:
                aborts.extend(self.revoke(name, now))
        return tuple(aborts)

    def revoked(self, tenant: str) -> bool:
        st = self._tenants.get(tenant)
        return st is not None and st.revoked

    # -- internals -----------------------------------------------------------------------------
    def _ended(self, key: tuple[str, str]) -> None:
        """The prefill will not be placed again: its target and hand-back count go."""
        self._targets.pop(key, None)
        self._hand_backs.pop(key, None)

    def _isolation(self, tenant: str, req: Submit, now: float) -> Refused | None:
        def no(reason: str, detail: str) -> Refused:
            return Refused(tenant, req.request_id, reason, detail, None)

        st = self._tenants.get(tenant)
        if st is None:
            return no("unknown_tenant", f"tenant {tenant!r} is not a tenant of this pool")
        if req.tenant != tenant:
            return no("wrong_tenant", f"a key of {tenant!r} cannot submit as {req.tenant!r}")
        if st.revoked:
            return no("revoked", f"tenant {tenant!r} has no active key")
        if now > st.lease_until_s:
            return no("no_lease", "register receivers (or heartbeat) first: no live lease")
        if req.receiver not in st.receivers:
            return no("receiver_not_registered",
                      f"receiver {req.receiver!r} is not registered by {tenant!r}")  # fmt: skip
        expected = self._fingerprints.get(req.model)
        diff = None if expected is None else first_difference(expected, dict(req.fingerprint))
        if diff is not None:
            name, given, want = diff
            detail = f"fingerprint.{name}: {given!r} != pool's {want!r} for {req.model}"
            return no("fingerprint_mismatch", detail)
        return None

    def _drop(self, tenant: str, reason: str, now: float) -> tuple[Abort, ...]:
        aborts = [
            Abort(tenant, job.request_id, reason, None)
            for job in self.admission.withdraw(tenant, now)
        ]
        for key, ran in list(self._running.items()):
            if key[0] == tenant:
                del self._running[key]
                self.admission.finish(ran.job, now)
                aborts.append(Abort(tenant, ran.job.request_id, reason, ran.node))
        for a in aborts:
            self._ended((tenant, a.request_id))
            self._outcomes[(tenant, a.request_id)] = Outcome(
                self.epoch, a.request_id, "aborted", reason
            )
        return tuple(aborts)
