"""Deployment files: the one place that reads YAML. Validated with pydantic, errors name the field.

A deployment is a gateway, sites (a PD site and PrfaaS sites) with their nodes, the links between
sites, the engine every node runs (``timed``: the cost model's time on an emulated instance;
``torch``: a real model folder; ``vllm``: a vLLM OpenAI server per node process, started and
supervised by a prfaas sidecar), the scales that let a laptop emulate a datacenter (time by ``s``,
bytes by ``b``: an R Gbps link is paced at R*b/s) and the inter-site key. ``prfaas up FILE`` runs
one on this machine; ``prfaas serve --role ... --config FILE --node NAME`` runs one node of it.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from prfaas.core.link_config import LinkConfig
from prfaas.deployment_autoscale import AutoscaleSection
from prfaas.deployment_gateway import GatewayConfig as GatewayConfig
from prfaas.deployment_sections import (
    CPUS_PATTERN,
    Prices,
    SimulationConfig,
    VllmOverride,
    VllmSettings,
    WorkloadConfig,
    cpu_set,
)
from prfaas.errors import UsageError
from prfaas.perf.profile_file import is_profile_file
from prfaas.pool_sections import PoolRef


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    role: Literal["prefill", "decode"]
    port: int = Field(0, ge=0, le=65535, description="HTTP control port (0: pick a free one)")
    transfer_port: int = Field(0, ge=0, le=65535, description="KV receive port (decode nodes)")
    pool_transfer_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="a pool tenant's decode nodes: KV receive port for the pool's KV, under the "
        "pool key (0: pick a free one)",
    )


class EngineOverride(_Strict):
    """A site's own engine settings, over the top-level ``engine`` (e.g. torch at one site, timed
    at another, or another model folder per host). What fixes units and hashing (``model``,
    ``time_scale``, ``byte_divisor``, ``block_tokens``) stays deployment-wide."""

    kind: Literal["timed", "torch", "vllm"] | None = None
    model_path: str | None = None
    dtype: Literal["float32", "bfloat16"] | None = None
    token_chunk: int | None = Field(None, ge=1)
    device: str | None = Field(None, pattern=r"^(cpu|cuda(:\d+)?)$")
    threads: int | None = Field(None, ge=1)
    kv_budget_mib: int | None = Field(None, ge=1)
    prefix_store_mib: int | None = Field(None, ge=0)
    prefill_chunk_tokens: int | None = Field(None, ge=16)
    cpus: str | None = Field(None, pattern=CPUS_PATTERN)
    vllm: VllmOverride | None = None
    """vLLM sites: the fields named here replace the top-level ``engine.vllm`` ones."""


class SiteConfig(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: Literal["pd", "prfaas"]
    hardware: str = Field(
        "h20", description="a hardware preset (h20, h200, ...) or a profile file (.yaml)"
    )
    nodes: list[NodeConfig] = []
    engine: EngineOverride | None = None

    @model_validator(mode="before")
    @classmethod
    def _counts_become_nodes(cls, raw: object) -> object:
        """``prefill_nodes: N`` / ``decode_nodes: M`` stand for N + M nodes named
        ``SITE-p0..`` / ``SITE-d0..`` (large deployments need not list every node)."""
        if not isinstance(raw, dict) or not ({"prefill_nodes", "decode_nodes"} & raw.keys()):
            return raw
        raw = dict(raw)
        name = raw.get("name", "site")
        nodes = list(raw.get("nodes", []))
        for key, role, tag in (("prefill_nodes", "prefill", "p"), ("decode_nodes", "decode", "d")):
            count = raw.pop(key, 0)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"site {name}: {key} must be a whole number >= 0, got {count!r}")
            nodes += [{"name": f"{name}-{tag}{i}", "role": role} for i in range(count)]
        raw["nodes"] = nodes
        return raw

    @field_validator("hardware")
    @classmethod
    def _profile_file_exists(cls, hardware: str, info: ValidationInfo) -> str:
        if not is_profile_file(hardware):
            return hardware
        base = (info.context or {}).get("base_dir")
        path = Path(hardware) if base is None else Path(base) / hardware
        if not path.is_file():
            raise ValueError(f"hardware profile file {str(path)!r} does not exist")
        return str(path.resolve())

    @model_validator(mode="after")
    def _roles_fit_the_kind(self) -> SiteConfig:
        roles = [n.role for n in self.nodes]
        if not roles:
            raise ValueError(f"site {self.name} has no nodes")
        if self.kind == "prfaas" and "decode" in roles:
            raise ValueError(f"site {self.name} is a PrfaaS site: prefill nodes only")
        if self.kind == "pd" and "decode" not in roles:
            raise ValueError(f"PD site {self.name} needs at least one decode node")
        return self


class EngineConfig(_Strict):
    kind: Literal["timed", "torch", "vllm"] = "timed"
    model: str = Field("paper-1t", description="model preset (timed) or served model name")
    model_path: str | None = Field(None, description="local Hugging Face folder (torch, vllm)")
    time_scale: float = Field(0.1, gt=0, description="wall seconds per modelled second")
    byte_divisor: int = Field(1000, ge=1, description="payloads are 1/byte_divisor of real size")
    token_chunk: int = Field(16, ge=1, description="tokens per decode delivery (timed)")
    block_tokens: int = Field(512, ge=16, description="prefix-cache block size")
    checkpoint_every_blocks: int = Field(
        16, ge=1, description="keep linear/SWA state checkpoints every this many blocks"
    )
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = Field(
        "cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="torch: cpu, cuda or cuda:N"
    )
    threads: int = Field(1, ge=1, description="torch: intra-op threads per node process")
    kv_budget_mib: int = Field(1024, ge=1, description="torch: KV cache a node may hold")
    prefix_store_mib: int = Field(256, ge=0, description="torch: prefix checkpoints per process")
    prefill_chunk_tokens: int = Field(
        512, ge=16, description="torch: longest prefill pass while streams decode"
    )
    cpus: str | None = Field(
        None,
        pattern=CPUS_PATTERN,
        description="torch/timed: the cores every node process of the site runs on (e.g. '0', "
        "'0-3'); nodes on the same cores share them, and the simulator models that "
        "(vLLM sites: vllm.cpu_bind). None: wherever the OS puts them",
    )
    vllm: VllmSettings = Field(
        default_factory=VllmSettings, description="vllm: how each node process's server starts"
    )

    @field_validator("model")
    @classmethod
    def _timed_model_is_a_preset(cls, model: str, info: ValidationInfo) -> str:
        # A timed node builds its cost model from the preset when it starts: an unknown name
        # must fail here, naming engine.model, not as a traceback in a child process.
        if info.data.get("kind", "timed") == "timed":
            from prfaas.spec import get_model

            try:
                get_model(model)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
        return model

    @model_validator(mode="after")
    def _torch_needs_a_folder(self) -> EngineConfig:
        if self.kind in ("torch", "vllm") and not self.model_path:
            raise ValueError(f"engine kind {self.kind!r} needs model_path")
        return self

    # Only the emulated engine scales time and bytes; a real engine (torch, vLLM) computes and
    # sends real bytes in real time, whatever ``time_scale`` / ``byte_divisor`` say. The node's
    # pacer and the gateway's registry convert with these two, so they cannot disagree.
    @property
    def wall_s_per_modelled_s(self) -> float:
        """Wall seconds per modelled second (``time_scale`` for timed engines, else 1)."""
        return self.time_scale if self.kind == "timed" else 1.0

    @property
    def real_bytes_per_payload_byte(self) -> int:
        """Real KV bytes one sent byte stands for (``byte_divisor`` for timed engines, else 1)."""
        return self.byte_divisor if self.kind == "timed" else 1


class TLSConfig(_Strict):
    """TLS around every inter-node KV connection (the PSK handshake still runs inside it), and,
    with ``control_plane``, around the control plane too (``serve/control_tls.py``)."""

    cert: str = Field(description="PEM certificate chain every worker presents")
    key: str = Field(description="PEM private key of that certificate")
    ca: str = Field(description="PEM CA bundle senders verify receivers against")
    server_hostname: str = Field("localhost", description="name the certificate is issued to")
    control_plane: bool = Field(
        False,
        description="also serve the gateway's control port and every worker API over HTTPS with "
        "this certificate (its clients verify it against ca, as server_hostname)",
    )

    @model_validator(mode="after")
    def _files_exist(self) -> TLSConfig:
        for name in ("cert", "key", "ca"):
            if not Path(getattr(self, name)).is_file():
                raise ValueError(f"tls.{name}: file {getattr(self, name)!r} does not exist")
        return self


class PolicyConfig(_Strict):
    router: Literal["local_only", "naive", "threshold", "prfaas"] = "prfaas"
    threshold_tokens: int | None = Field(None, ge=0, description="None: the planner's t")
    rebalance: bool = Field(False, description="convert PD nodes between prefill and decode")
    control_interval_s: float = Field(1.0, gt=0, description="modelled s between control ticks")
    tune_min_samples: int = Field(
        100, ge=1, description="requests observed before t is re-searched or nodes rebalanced"
    )


class DeploymentConfig(_Strict):
    engine: EngineConfig = EngineConfig()
    gateway: GatewayConfig = GatewayConfig()
    policy: PolicyConfig = PolicyConfig()
    sites: list[SiteConfig]
    links: list[LinkConfig] = []
    """Inter-site links: ``core.link_config.LinkConfig``, the simulator's type too."""
    psk: str = Field(default_factory=lambda: secrets.token_hex(16), min_length=16)
    accept_psks: list[Annotated[str, Field(min_length=16)]] = Field(
        [], description="keys also accepted on the control plane (a rotation; SIGHUP reloads)"
    )
    tls: TLSConfig | None = None
    netns: bool = Field(False, description="place the sites in network namespaces (root)")
    heartbeat_interval_s: float = Field(0.5, gt=0)
    workload: WorkloadConfig = WorkloadConfig()
    """What ``prfaas sim`` and ``prfaas plan`` feed the deployment (``prfaas up`` ignores it)."""
    simulation: SimulationConfig = SimulationConfig()
    prices: Prices = Field({}, description="USD per instance-hour by site hardware")
    autoscale: AutoscaleSection | None = Field(
        None, description="an elastic PrfaaS pool: node groups, bounds, cooldowns (docs/elastic.md)"
    )
    pool: PoolRef | None = None
    """A tenant of a shared PrfaaS pool (``docs/pool.md``): offloads go there, not to a site."""

    @field_validator("prices")
    @classmethod
    def _positive_prices(cls, prices: Prices) -> Prices:
        for hardware, usd in prices.items():
            if not usd > 0:
                raise ValueError(f"prices.{hardware} must be > 0 USD per instance-hour, got {usd}")
        return prices

    @field_validator("sites")
    @classmethod
    def _timed_hardware_is_a_preset(
        cls, sites: list[SiteConfig], info: ValidationInfo
    ) -> list[SiteConfig]:
        # Like engine.model: a timed node's cost model needs its site's hardware preset, and an
        # unknown name must fail here, not as a traceback when the process starts.
        engine = info.data.get("engine")
        if engine is not None and engine.kind == "timed":
            from prfaas.perf import ProfileFileError, cost_model_for_hardware
            from prfaas.spec import get_hardware

            for site in sites:
                if is_profile_file(site.hardware):
                    try:  # readable, the right version, measured for this model
                        cost_model_for_hardware(engine.model, site.hardware)
                    except ProfileFileError as exc:
                        raise ValueError(f"site {site.name}: hardware: {exc}") from None
                    continue
                try:
                    get_hardware(site.hardware)
                except KeyError as exc:
                    raise ValueError(f"site {site.name}: hardware: {exc.args[0]}") from None
        return sites

    @field_validator("links")
    @classmethod
    def _links_have_capacity(cls, links: list[LinkConfig]) -> list[LinkConfig]:
        for i, link in enumerate(links):  # a simulated scenario may hold a 0 Gbps link; a file not
            if not link.gbps > 0:
                raise ValueError(f"links.{i}.gbps: must be > 0 Gbit/s, got {link.gbps:g}")
        return links

    @model_validator(mode="after")
    def _consistent(self) -> DeploymentConfig:
        names = [s.name for s in self.sites]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate site names in {names}")
        nodes = [n.name for s in self.sites for n in s.nodes]
        if len(set(nodes)) != len(nodes):
            raise ValueError("duplicate node names")
        if not self.pd_sites:
            raise ValueError("a deployment needs a PD site (kind: pd; the first is the gateway's)")
        for link in self.links:
            for end in (link.src, link.dst):
                if end not in names:
                    raise ValueError(f"link {link.src}->{link.dst} names unknown site {end!r}")
        if self.pool is not None and len(self.pd_sites) != len(self.sites):
            raise ValueError("pool: a tenant file names the pool instead of a prfaas site")
        pd_names = {s.name for s in self.pd_sites}
        for site in self.sites:
            if site.kind == "prfaas" and not any(
                lk.src == site.name and lk.dst in pd_names for lk in self.links
            ):
                targets = " or ".join(s.name for s in self.pd_sites)
                raise ValueError(f"PrfaaS site {site.name} has no link to {targets}")
        for site in self.sites:
            engine = self.engine_for(site.name)  # the merged settings must be valid too
            if engine.kind in ("torch", "vllm") and not engine.model_path:
                raise ValueError(f"site {site.name}: engine kind {engine.kind!r} needs model_path")
        return self

    @property
    def pd_sites(self) -> list[SiteConfig]:
        return [s for s in self.sites if s.kind == "pd"]

    def engine_for(self, site_name: str) -> EngineConfig:
        """The engine settings of ``site_name``: the top-level ``engine`` with the site's own
        ``engine`` over it."""
        site = next(s for s in self.sites if s.name == site_name)
        if site.engine is None:
            return self.engine
        changes: dict[str, object] = {
            k: v for k, v in site.engine.model_dump().items() if v is not None and k != "vllm"
        }
        if site.engine.vllm is not None:  # field by field: a site may change cpu_bind alone
            changes["vllm"] = site.engine.vllm.over(self.engine.vllm)
        return self.engine.model_copy(update=changes)

    def cores_of_site(self, site_name: str) -> frozenset[int] | None:
        """The cores ``site_name``'s node processes are pinned to (``engine.cpus``, or a vLLM
        site's ``engine.vllm.cpu_bind``); None: not pinned."""
        eng = self.engine_for(site_name)
        if eng.kind == "vllm":
            return cpu_set(eng.vllm.cpu_bind)
        return None if eng.cpus is None else cpu_set(eng.cpus)

    def gateway_cores(self) -> frozenset[int] | None:
        """The cores the gateway process is pinned to (``gateway.cpus``); None: not pinned."""
        return None if self.gateway.cpus is None else cpu_set(self.gateway.cpus)

    def require_one_pd_site(self) -> None:
        """The live system serves one PD site per gateway; files with more are for the
        simulator and the planner."""
        if len(self.pd_sites) != 1:
            names = ", ".join(s.name for s in self.pd_sites)
            raise UsageError(
                f"sites: {len(self.pd_sites)} PD sites ({names}): the live system runs one PD "
                "site per gateway; simulate this file with `prfaas sim` or give each PD site its "
                "own deployment file"
            )

    @property
    def home_site(self) -> SiteConfig:
        """The gateway's site: the first PD site."""
        return self.pd_sites[0]

    def site_of(self, node_name: str) -> SiteConfig:
        for site in self.sites:
            if any(n.name == node_name for n in site.nodes):
                return site
        raise UsageError(f"no node named {node_name!r} in the deployment")

    def node(self, node_name: str) -> NodeConfig:
        site = self.site_of(node_name)
        return next(n for n in site.nodes if n.name == node_name)

    @property
    def control_scheme(self) -> str:
        """``https`` when ``tls.control_plane`` is on, else ``http``: the control listener's and
        every worker API's."""
        return "https" if self.tls is not None and self.tls.control_plane else "http"

    @property
    def control_url(self) -> str:
        """The gateway's control listener (``gateway.control_port``), in ``control_scheme``."""
        g = self.gateway
        return f"{self.control_scheme}://{g.host}:{g.control_port}"

    def link_to_home(self, site_name: str) -> LinkConfig | None:
        home = self.home_site.name
        return next((lk for lk in self.links if lk.src == site_name and lk.dst == home), None)


def load_yaml_mapping(path: Path, what: str = "file") -> dict[str, Any]:
    """A YAML file whose top level is a mapping (every YAML the project reads comes through
    here); a ``UsageError`` names the file and what is wrong with it."""
    if not path.is_file():
        raise UsageError(f"{what} {path} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:  # the reason, not the bytes: they may be anything
        raise UsageError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"{path}: expected a mapping at the top level")
    return raw


def load_deployment(path: Path, require_psk: bool = False) -> DeploymentConfig:
    """Read and validate a deployment YAML; a ``UsageError`` names the file and the bad field.

    ``require_psk``: the file must name the key (processes started separately, ``prfaas serve``:
    a key drawn at random per process would fail every handshake and signed call between them).
    """
    raw = load_yaml_mapping(path, what="deployment file")
    if require_psk and "psk" not in raw:
        raise UsageError(
            f"{path}: psk: missing. Processes started one by one (prfaas serve) must share the "
            "deployment's key: add `psk: <a secret of at least 16 characters>` to the file "
            "(prfaas up draws one for its own children)"
        )
    try:
        return DeploymentConfig.model_validate(raw, context={"base_dir": path.parent})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UsageError(f"{path}: {where}: {first['msg']}") from None
