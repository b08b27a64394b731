"""The pool file's schema (``prfaas up pool.yaml``, ``prfaas sim pool.yaml tenant-*.yaml``) and
the tenant file's ``pool:`` section. pydantic models, no I/O (``pool_file.py`` reads the files and
resolves key references; ``config.py`` reads a tenant's deployment file).

A pool is node groups (one model each, one engine kind), the pool's total egress, the front door's
listeners and its tenants (weight, optional floor and caps, one or two active keys by reference).
A tenant file is today's deployment file with a ``pool:`` section (URL, tenant name, key reference,
its own link) instead of a ``prfaas`` site.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prfaas.cache.prefix_quotas import prefix_shares
from prfaas.deployment_sections import CPUS_PATTERN, PlumbingSwitches

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyRef(_Strict):
    """A key by reference, never inline: an environment variable or a file (for rotation, a
    tenant lists two while both are active)."""

    id: str = Field(pattern=_NAME, description="key id: what a signed call names")
    env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> KeyRef:
        if (self.env is None) == (self.file is None):
            raise ValueError(f"key {self.id}: give exactly one of env or file")
        return self


class TenantCap(_Strict):
    max_queued_tokens: int | None = Field(None, ge=1, description="queued uncached tokens")
    max_rate_rps: float | None = Field(None, gt=0, description="accepted submits per second")


class ReceiversTLS(_Strict):
    """How the pool's nodes check a tenant's KV receivers: the tenant's own CA, per tenant (a
    tenant's deployment ``tls:`` makes its receivers present a certificate under it)."""

    ca: str = Field(description="PEM CA bundle the tenant's receiver certificates chain to")
    server_hostname: str = Field("localhost", description="the name they are issued to")


class PoolTLS(_Strict):
    """The front door's tenant API over HTTPS: the certificate it presents."""

    cert: str = Field(description="PEM certificate chain")
    key: str = Field(description="PEM private key of that certificate")


class PoolTenant(_Strict):
    name: str = Field(pattern=_NAME)
    weight: float = 1.0
    floor: dict[str, int] = Field(
        default_factory=dict, description="group -> nodes held for this tenant while it has work"
    )
    cap: TenantCap = TenantCap()
    keys: list[KeyRef] = Field(min_length=1, max_length=2, description="one or two active keys")
    receivers_tls: ReceiversTLS | None = Field(
        None, description="KV links to this tenant's receivers in TLS (None: in the clear)"
    )
    prefix_share: float | None = Field(
        None, ge=0, le=1, description="the share of each pool node's prefix store guaranteed "
        "to this tenant's prefixes (None: its weight's part of what the others' leave)",
    )  # fmt: skip

    @field_validator("weight")
    @classmethod
    def _positive(cls, weight: float) -> float:
        if not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight}")
        return weight

    @field_validator("floor")
    @classmethod
    def _floors(cls, floor: dict[str, int]) -> dict[str, int]:
        for group, n in floor.items():
            if n < 0:
                raise ValueError(f"floor.{group} must be >= 0 nodes, got {n}")
        return floor


class PoolNode(_Strict):
    name: str = Field(pattern=_NAME)
    port: int = Field(0, ge=0, le=65535)


class PoolGroup(_Strict):
    """A node group: one model, one engine kind, on one hardware (preset or profile file)."""

    name: str = Field(pattern=_NAME)
    model: str = Field(description="what tenants name; for timed nodes a model preset")
    kind: Literal["timed", "torch", "vllm"] = "timed"
    model_path: str | None = None
    hardware: str = "h200"
    cpus: str | None = Field(
        None,
        pattern=CPUS_PATTERN,
        description="the cores every node process of the group runs on (e.g. '0', '0-3'), as a "
        "deployment site's engine.cpus; nodes on the same cores share them (the pool simulator "
        "does not model that). None: wherever the OS puts them",
    )
    nodes: list[PoolNode] = []
    num_nodes: int | None = Field(None, ge=1, description="instead of nodes: NAME-0, NAME-1, ...")
    notice_s: float | None = Field(
        None, description="preemptible (spot): a node process takes SIGTERM as a notice of this "
        "many wall seconds (finish what ends in time, hand the rest back to the queue); None: "
        "SIGTERM stops it",
    )  # fmt: skip
    processes: Literal["shared", "per_node"] | None = Field(
        None, description="shared: the group's nodes in one process; per_node: one process per "
        "node, so a notice to one leaves the others serving; None: per_node with notice_s, "
        "else shared",
    )  # fmt: skip

    @field_validator("notice_s")
    @classmethod
    def _notice(cls, notice_s: float | None) -> float | None:
        if notice_s is not None and not notice_s > 0:
            raise ValueError(f"notice_s must be > 0 seconds, got {notice_s}")
        return notice_s

    @property
    def per_node_processes(self) -> bool:
        """One process per node: asked for, or a preemptible group that did not say (a notice to
        a shared process drains every node of the group, and with one group per model no other
        node could take what it hands back)."""
        if self.processes is None:
            return self.notice_s is not None
        return self.processes == "per_node"

    @model_validator(mode="after")
    def _nodes(self) -> PoolGroup:
        if self.nodes and self.num_nodes is not None and self.num_nodes != len(self.nodes):
            raise ValueError(
                f"group {self.name}: num_nodes {self.num_nodes} but {len(self.nodes)} nodes"
            )
        if not self.nodes and self.num_nodes is None:
            raise ValueError(f"group {self.name}: give nodes or num_nodes")
        if self.kind in ("torch", "vllm") and not self.model_path:
            raise ValueError(f"group {self.name}: kind {self.kind!r} needs model_path")
        return self

    @property
    def node_names(self) -> list[str]:
        if self.nodes:
            return [n.name for n in self.nodes]
        return [f"{self.name}-{i}" for i in range(self.num_nodes or 0)]


class PoolUnits(_Strict):
    """What fixes units and hashing pool-wide; a tenant file must agree (refused at start)."""

    time_scale: float = Field(0.1, gt=0)
    byte_divisor: int = Field(1000, ge=1)
    block_tokens: int = Field(512, ge=16)


class FrontDoor(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8100, ge=0, le=65535, description="the tenants' API (signed, versioned)")
    control_port: int = Field(8101, ge=0, le=65535, description="the operator's listener")
    tls: PoolTLS | None = Field(None, description="the tenant API over HTTPS (None: plain HTTP)")
    allow_plaintext: bool = Field(
        False,
        description="a front door beyond loopback may serve its tenant API in plain HTTP and "
        "send KV to tenants without receivers_tls (a trusted private network); without it "
        "`prfaas up` refuses, naming what is in the clear",
    )

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"


class PoolSimulation(_Strict):
    """What only the pool simulator reads (``prfaas sim POOL.yaml TENANT.yaml...``)."""

    plumbing: PlumbingSwitches = PlumbingSwitches()
    """Which of the group profiles' plumbing terms the simulated pool nodes are charged (the
    pool nodes pay ``prefill_per_request_s`` only); each tenant's own processes follow its
    tenant file's ``simulation.plumbing``. No section: all on."""


class PoolFileConfig(_Strict):
    version: Literal[1] = 1
    units: PoolUnits = PoolUnits()
    front_door: FrontDoor = FrontDoor()
    egress_gbps: float = Field(gt=0, description="the pool's total egress, shared by tenants")
    egress_window_s: float = Field(1.0, gt=0, description="unsent KV a prefill may start over")
    share_prefixes: bool = Field(
        False, description="one prefix namespace for every tenant (no quotas); false: each "
        "tenant's prefixes in its own namespace, salted, with its prefix_share as a quota",
    )  # fmt: skip
    heartbeat_interval_s: float = Field(0.5, gt=0)
    lease_s: float = Field(3.0, gt=0, description="a tenant silent this long loses its queue")
    groups: list[PoolGroup] = Field(min_length=1)
    tenants: list[PoolTenant] = Field(min_length=1)
    simulation: PoolSimulation = PoolSimulation()

    @model_validator(mode="after")
    def _consistent(self) -> PoolFileConfig:
        names = [t.name for t in self.tenants]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(f"tenants.{i}.name: duplicate tenant name {name!r}")
        groups = [g.name for g in self.groups]
        for i, g in enumerate(self.groups):
            if g.name in groups[:i]:
                raise ValueError(f"groups.{i}.name: duplicate group name {g.name!r}")
            if g.model in [o.model for o in self.groups[:i]]:
                raise ValueError(f"groups.{i}.model: {g.model!r} has a group already (one each)")
        nodes = [n for g in self.groups for n in g.node_names]
        if len(set(nodes)) != len(nodes):
            raise ValueError("groups: duplicate node names")
        for i, g in enumerate(self.groups):
            # A per-node process is named after its node, a shared one after its group: the
            # supervisor, its logs and processes.json need the names apart.
            clash = set(g.node_names) & set(groups) if g.per_node_processes else set()
            if clash:
                raise ValueError(
                    f"groups.{i}.nodes: node {sorted(clash)[0]!r} has a group's name (a node in "
                    "a process of its own is named after it)"
                )
        ids = [k.id for t in self.tenants for k in t.keys]
        for i, t in enumerate(self.tenants):
            for group in t.floor:
                if group not in groups:
                    raise ValueError(f"tenants.{i}.floor: unknown group {group!r}")
            for k in t.keys:
                if ids.count(k.id) > 1:
                    raise ValueError(f"tenants.{i}.keys: key id {k.id!r} is used twice")
        told = sum(t.prefix_share or 0.0 for t in self.tenants)
        if told > 1.0 + 1e-9:
            raise ValueError(f"tenants: prefix_share sums to {told:g}, over the whole store (1)")
        if self.front_door.port != 0 and self.front_door.port == self.front_door.control_port:
            raise ValueError("front_door.control_port: the operator's listener needs its own port")
        return self

    def tenant(self, name: str) -> PoolTenant | None:
        return next((t for t in self.tenants if t.name == name), None)

    def prefix_shares(self) -> dict[str, float]:
        """Tenant -> its guaranteed share of each pool node's prefix store: its ``prefix_share``,
        else its weight's part of what the tenants that set one leave."""
        # The rule is ``cache.prefix_quotas``' (the pool simulator's too).
        return prefix_shares([(t.name, t.weight, t.prefix_share) for t in self.tenants])

    def group_for_model(self, model: str) -> PoolGroup | None:
        return next((g for g in self.groups if g.model == model), None)

    # The front door's clock follows a deployment's rule (``EngineConfig.wall_s_per_modelled_s``):
    # only the emulated engine scales time; torch and vLLM nodes compute in real seconds whatever
    # ``time_scale`` says, so their costs, leases and caps are read in wall seconds.
    @property
    def wall_s_per_modelled_s(self) -> float:
        """Wall seconds per modelled second of the front door's clock: ``units.time_scale``
        when every group is timed, else 1 (``clock_conflict`` refuses a mix at another scale)."""
        return self.units.time_scale if all(g.kind == "timed" for g in self.groups) else 1.0

    def clock_conflict(self) -> str | None:
        """Why no one clock fits the front door (a live pool refuses it; the simulator has no
        wall clock): timed groups beside torch or vLLM ones at a ``time_scale`` other than 1.
        None: one clock fits."""
        kinds = {g.kind for g in self.groups}
        if self.units.time_scale == 1 or kinds <= {"timed"} or "timed" not in kinds:
            return None
        real = "/".join(sorted(kinds - {"timed"}))
        return (
            f"units.time_scale: {self.units.time_scale:g} with timed and {real} groups: the front "
            f"door has one clock, time_scale wall seconds per modelled second for timed groups "
            f"but real seconds for {real} ones; use time_scale 1, or one kind per pool"
        )


class TenantLink(_Strict):
    """The tenant's own link from the pool: its constraint, paced per tenant, never shared."""

    gbps: float = Field(gt=0)
    rtt_ms: float = Field(0.0, ge=0)


class PoolRef(_Strict):
    """A tenant file's ``pool:`` section: where its PrfaaS prefills go, instead of a site."""

    url: str = Field(pattern=r"^https?://[^/\s]+/?$", description="the front door's tenant API")
    tenant: str = Field(pattern=_NAME)
    key: KeyRef
    ca: str | None = Field(
        None, description="PEM CA bundle an https url's certificate is checked against (None: "
        "the system's)",
    )  # fmt: skip
    server_hostname: str | None = Field(
        None, description="the name the front door's certificate is issued to (None: url's host)"
    )
    link: TenantLink
    allow_plaintext: bool = Field(
        False,
        description="an http:// url beyond loopback (a trusted private network); without it "
        "`prfaas up` refuses to send the tenant's prompts to the pool in the clear",
    )

    @model_validator(mode="after")
    def _ca_exists(self) -> PoolRef:
        if self.ca is not None and not Path(self.ca).is_file():
            raise ValueError(f"pool.ca: file {self.ca!r} does not exist")
        return self

    ttft_target_s: float = Field(4.0, gt=0, description="what the tenant's tuner aims for")
    tuner: Literal["coordinated", "uncoordinated", "fixed"] = Field(
        "coordinated",
        description="coordinated: t from the pool's feedback (share, queueing); uncoordinated: "
        "as if the tenant owned the pool (today's tuner); fixed: policy.threshold_tokens",
    )
