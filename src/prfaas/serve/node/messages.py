"""The internal API between the gateway and node processes (pydantic: serve/ only).

Gateway -> node: ``PrefillCommand`` (prefill these tokens, stream the KV to that decode node),
``DecodeCommand`` (expect this request's KV, then stream its tokens back as NDJSON
``DecodeEvent`` lines), aborts and role changes; a pool's front door asks for a prefill's
``PrefillStep`` lines instead (its node freed at ``computed``, its outcome later). Node ->
gateway: ``Registration`` once, then a ``Heartbeat`` with every node's ``NodeReport`` and the
process's ``core.SenderLinkReport`` per destination link every ``heartbeat_interval_s``, and the
process's prefix-store changes (``PrefixReportMsg``, answered by a ``PrefixAckMsg``:
``cache/mirror.py``); a PrfaaS pool node's heartbeat (to its front door) carries its store per
tenant namespace instead (``PrefixNamespaceMsg``).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from prfaas.cache.mirror import (
    MAX_CHANGES_PER_REPORT,
    ChangeKind,
    ReportAck,
    StoreChange,
    StoreReport,
)
from prfaas.core.link_report import SenderLinkReport

MAX_LINK_REPORTS = 1024
"""Link readings one heartbeat may carry: a PrfaaS pool's node has a route per tenant (a
two-site process has one); a host sends at most this many."""


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingMsg(_Msg):
    max_new_tokens: int = Field(ge=1)
    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    seed: int | None = None
    """The client's seed; None: it gave none (engine.torch and the timed engine then seed with
    0, as before; a vLLM server samples unseeded: vLLM 0.32.0's CPU backend kills its engine
    on a seeded sampled request whose prompt is prefilled in more than one chunk, "CPU Generator
    does not use offset", so a seed the client never asked for must not reach it)."""
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    top_k: int = Field(-1, ge=-1)
    """-1 or 0: no limit."""
    min_tokens: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0)


def pack_tokens(token_ids: Sequence[int]) -> str:
    """Token ids as base64 of little-endian int32: a 100K-token prompt parses in microseconds,
    where a JSON list of ints costs tens of milliseconds at each hop."""
    return base64.b64encode(np.asarray(token_ids, dtype="<i4").tobytes()).decode()


def unpack_tokens(packed: str) -> tuple[int, ...]:
    return tuple(np.frombuffer(base64.b64decode(packed), dtype="<i4").tolist())


class PrefillCommand(_Msg):
    request_id: str
    tokens: str
    """The prompt's token ids, ``pack_tokens``-encoded."""
    block_hashes: list[int] = []
    """Hashes of the prompt's full blocks: the prefix-cache keys."""
    use_cached_tokens: int = 0
    """Prefix tokens the gateway expects this site to hold (0: compute everything)."""
    store_prefix: bool = True
    """Keep block-aligned checkpoints of this prompt for later requests."""
    decode_node: str
    decode_host: str
    decode_transfer_port: int
    cross_site: bool
    """KV crosses the inter-site link: paced at the link's emulated rate."""
    receiver_cached_tokens: int = Field(0, ge=0)
    """Prefix tokens the decode node already holds (its site's store): only the rest crosses."""
    decode_recomputes_last_token: bool = False
    """The decode node runs the last prompt token itself (a vLLM server: its connector installs
    ``prompt_len - 1`` tokens of a model with linear-attention states, whose state cannot be
    rewound). A prefill node of such a model then sends the cache of all but the last token and
    no first token; a dense model's whole cache is sent as always."""
    sampling: SamplingMsg
    key_id: str = ""
    """The key the KV link to the decode node authenticates with: "" the deployment's ``psk``; a
    PrfaaS pool's node names the tenant's key id (``docs/pool.md``)."""
    tenant: str = Field("", max_length=128)
    """A PrfaaS pool's prefill: the tenant whose decode node receives the KV. Its cross-site KV
    then crosses that tenant's own link, its own route at the node (``"{site}->{tenant}"``,
    paced at ``tenant_link_gbps`` under the pool's egress cap), not the site's one link ("":
    the site's link, as in a two-site deployment)."""
    tenant_link_gbps: float | None = Field(None, gt=0, allow_inf_nan=False)
    """The tenant's own link rate (modelled Gbps, what it told the pool when it registered its
    receivers); None: not paced per tenant, only the node's egress cap applies."""
    keep_session_on_hand_back: bool = False
    """Another node will send this same session if this one hands the prefill back (a PrfaaS
    pool re-queues it: ``pool.driver``): a hand-back then aborts the KV session with
    ``AbortCode.HANDED_BACK``, on which the decode node frees what it allocated and keeps
    expecting the session. False (a gateway routes a handed-back request again as new, with a
    new decode stream): the session is cancelled as any other, and the decode stream fails."""


class PrefillOutcome(_Msg):
    request_id: str
    ok: bool
    first_token: int = -1
    num_cached_tokens: int = 0
    kv_bytes_sent: int = 0
    prefill_s: float = 0.0
    error: str = ""
    stored_prefixes: list[tuple[int, int]] = []
    """(last block hash, tokens) of the prefixes this prefill left in its process's store: the
    gateway counts on them until the store's reports reach ``store_seq``."""
    store_epoch: int = 0
    store_seq: int = 0
    """The store's journal position right after that insert (``cache.StoreJournal``)."""
    handed_back: bool = False
    """Not done here: the node got a spot notice and would not end it by the deadline; the
    gateway serves it on another node (not a failure of the request)."""


class PrefillStep(_Msg):
    """One NDJSON line of ``POST /nodes/{node}/prefill/stream`` (a pool's front door's call):
    ``computed`` first (the node computed the prefill and handed its last layer to the link:
    it may take its next prefill while this KV is still on its way and being verified), then
    ``outcome``, what ``/prefill`` answers (the KV verified at the receiver, or why not). A
    prefill that fails before its compute ends, or a host that cannot tell, sends the outcome
    alone; a stream cut before its outcome is a lost node."""

    kind: Literal["computed", "outcome"]
    outcome: PrefillOutcome | None = None


class NoticeCommand(_Msg):
    """A spot notice: the node ends ``deadline_s`` seconds from now (``POST /notice``)."""

    deadline_s: float = Field(ge=0)


class DecodeCommand(_Msg):
    request_id: str
    num_prompt_tokens: int
    block_hashes: list[int] = []
    prefix_tokens: int = Field(0, ge=0)
    """Prefix tokens the gateway believes this site stores; the node answers what it pinned."""
    sampling: SamplingMsg
    timeout_s: float = Field(60.0, gt=0, description="longest wait for the KV to arrive")
    prompt_tokens: str = ""
    """The prompt's token ids, ``pack_tokens``-encoded (the gateway always sends them): for
    ``sampling.repetition_penalty`` != 1 (HF semantics count the prompt) and for a vLLM decode
    node, whose server gets the prompt itself; "": the penalty sees the output only."""
    prefill_node: str = ""
    """The node prefilling this request: a vLLM decode node sharing its server with it decodes
    with a plain request (co-located, the server prefills itself)."""


class DecodeEvent(_Msg):
    """One NDJSON line of a decode stream."""

    kind: Literal["ready", "tokens", "error"]
    prefix_tokens: int = 0
    """``ready`` only: prefix tokens of the site's store this node will reuse."""
    token_ids: list[int] = []
    finish_reason: Literal["stop", "length"] | None = None
    error: str = ""
    kv_recomputed: bool = False
    """The finishing event only: this node was to decode from KV sent to it but could not use it
    and recomputed the prompt (a vLLM server whose connector load failed): the tokens are right,
    the remote route's KV was wasted."""


class NodeReport(_Msg):
    node: str
    site: str
    role: Literal["prefill", "decode"]
    queue_depth: int = 0
    queued_tokens: int = 0
    batch_size: int = 0
    kv_used_bytes: int = 0
    kv_capacity_bytes: int = 0
    draining: bool = False
    egress_bytes: int = 0
    """KV bytes this node has handed to its cross-site sender so far, credited piece by piece
    as the sender accepts each (prefill nodes; a vLLM sidecar: its server's, on one prefill
    node)."""
    egress_backlog_bytes: int = 0
    """KV bytes of this node's open cross-site transfers not yet accepted by the sender (a
    transfer counts whole from its first layer, as the simulator's link counts it); a vLLM
    sidecar reports its server's (its connector's open cross-site sends) on one prefill node."""
    fault: str = ""
    """Non-empty when the node cannot serve (its engine thread died, say): the gateway takes it
    out of rotation until a report without a fault."""
    handshake_failures: int = 0
    """KV-transfer handshakes this process's receiver refused since it started (wrong key...)."""
    decode_steps: int = 0
    """Decode steps this node has run that produced tokens, since it started."""
    prefilled_tokens: int = Field(0, ge=0)
    """Uncached prompt tokens this node has prefilled, since it started (prefill nodes)."""
    prefill_busy_s: float = Field(0.0, ge=0)
    """Wall seconds this node spent computing prefills, since it started (overlapping prefills
    count once): with ``prefilled_tokens``, its measured prefill speed (0: none measured; a vLLM
    sidecar does not report it)."""
    engine_cpu_s: float = Field(0.0, ge=0)
    """CPU seconds this node's engine thread has spent in forward passes since it started (torch
    engines; 0 for the timed engine, whose passes are sleeps, and a vLLM sidecar): beside the
    process's CPU, what its passes cost against everything else it does."""
    forward_cpu_s: float = Field(0.0, ge=0)
    """Of ``engine_cpu_s``, the model's forward passes alone (torch engines: what a profile's
    curves price; ``prfaas profile`` reads the rest of the process's CPU beyond them)."""


class NodeEndpoint(_Msg):
    node: str
    site: str
    role: Literal["prefill", "decode"]
    host: str
    http_port: int
    transfer_port: int = 0
    pool_transfer_port: int = 0
    """A tenant of a PrfaaS pool: the decode node's receiver for KV from the pool's nodes,
    authenticated with the tenant's pool key (0: none)."""


class Registration(_Msg):
    process: str
    nodes: list[NodeEndpoint]
    reports: list[NodeReport] = []
    """The nodes' first reports (none: a blank one each). A vLLM sidecar registers while its
    server starts: its nodes must be faulty from the start, not in rotation until a heartbeat."""


class PrefixChangeMsg(_Msg):
    kind: Literal["reset", "stored", "evicted"]
    block_hash: int = Field(0, ge=0)
    """The prefix's last block hash (chained: it names the whole prefix)."""
    num_tokens: int = Field(0, ge=0)
    """``stored``: the tokens the prefix covers."""


class PrefixReportMsg(_Msg):
    """A process's prefix-store changes the gateway has not acknowledged, oldest first."""

    epoch: int = Field(ge=0)
    first_seq: int = Field(ge=1)
    changes: list[PrefixChangeMsg] = Field(max_length=MAX_CHANGES_PER_REPORT)
    backlog: int = Field(0, ge=0)

    @classmethod
    def of(cls, report: StoreReport) -> PrefixReportMsg:
        return cls(
            epoch=report.epoch,
            first_seq=report.first_seq,
            changes=[
                PrefixChangeMsg(kind=c.kind.value, block_hash=c.block_hash, num_tokens=c.num_tokens)
                for c in report.changes
            ],
            backlog=report.backlog,
        )

    def to_report(self) -> StoreReport:
        changes = tuple(
            StoreChange(ChangeKind(c.kind), c.block_hash, c.num_tokens) for c in self.changes
        )
        return StoreReport(self.epoch, self.first_seq, changes, self.backlog)


class PrefixAckMsg(_Msg):
    """The gateway's answer to a ``PrefixReportMsg`` (in the heartbeat's response body)."""

    epoch: int
    applied_seq: int
    snapshot: bool = False

    @classmethod
    def of(cls, ack: ReportAck) -> PrefixAckMsg:
        return cls(epoch=ack.epoch, applied_seq=ack.applied_seq, snapshot=ack.snapshot)

    def to_ack(self) -> ReportAck:
        return ReportAck(self.epoch, self.applied_seq, self.snapshot)


class PrefixNamespaceMsg(_Msg):
    """What a PrfaaS pool node's prefix store holds in one tenant's namespace (``""``: the one
    all tenants share), in modelled bytes (``serve/node/prefix_store.py`` ``NamespaceUsage``)."""

    namespace: str
    num_entries: int = Field(ge=0)
    num_tokens: int = Field(ge=0)
    used_bytes: int = Field(ge=0)
    quota_bytes: int = Field(ge=0)
    hit_tokens: int = Field(ge=0)
    lookup_tokens: int = Field(ge=0)


class Heartbeat(_Msg):
    process: str
    reports: list[NodeReport]
    links: list[SenderLinkReport] = Field([], max_length=MAX_LINK_REPORTS)
    """What the process's senders know of each destination link its KV crosses (modelled
    units: real bytes, modelled seconds): one reading per link, not per node (a pool node: one
    per tenant it has sent to)."""
    prefix: PrefixReportMsg | None = None
    """The process's prefix-store changes since the last acknowledged report (None: none)."""
    namespaces: list[PrefixNamespaceMsg] = Field([], max_length=MAX_LINK_REPORTS)
    """A PrfaaS pool node's prefix store per tenant namespace (empty: a deployment's node)."""


class LinkRateCommand(_Msg):
    gbps: float = Field(gt=0, description="modelled capacity of the site's inter-site link")


class RoleCommand(_Msg):
    role: Literal["prefill", "decode"]


class PrefixPullCommand(_Msg):
    """Gateway -> a node process of the destination site: fetch this prefix from the source."""

    block_hashes: list[int]
    num_tokens: int = Field(gt=0)
    src_url: str
    """Base URL of a node process of the source site."""
    cross_site: bool = True
    timeout_s: float = Field(30.0, gt=0)


class PrefixPushCommand(_Msg):
    """Destination -> source: send the stored prefix to my transfer port under ``move_id``."""

    move_id: str
    block_hashes: list[int]
    num_tokens: int = Field(gt=0)
    dst_host: str
    dst_transfer_port: int
    cross_site: bool = True
