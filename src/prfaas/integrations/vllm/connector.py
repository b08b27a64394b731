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
- Without a ``prfaas`` entry a request is left alone.
Imports vllm and torch at module level (vLLM imports this module in its own venv); the pure
parts live in ``settings``, ``layout`` and ``transfer_thread``.
"""

from __future__ import annotations

import logging
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
from prfaas.integrations.vllm.transfer_thread import TransferThread
from prfaas.spec import CacheSpec
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


# -- scheduler -> worker metadata (pickled across processes: plain dataclasses) ---------------
@dataclass(frozen=True, slots=True)
class SendStep:
    """One scheduled step of a prefill request: tokens ``[start, end)`` complete in it."""

    req_id: str
    params: SendParams
    prompt_len: int
    block_ids: tuple[int, ...]
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
    start: int
    block_ids: tuple[int, ...]
    single_group: bool


@dataclass
class PrfaasMetadata(KVConnectorMetadata):  # type: ignore[misc]  # vllm is untyped here
    sends: list[SendStep] = field(default_factory=list)
    loads: list[LoadJob] = field(default_factory=list)
    abort_sends: list[str] = field(default_factory=list)
    """Transfer ids of prefill requests that ended before their prompt was complete."""
    cancel_loads: list[str] = field(default_factory=list)
    """Request ids of decode requests aborted while their KV was awaited."""


@dataclass(slots=True)
class _SendState:
    params: SendParams
    prompt_len: int
    block_ids: list[int] = field(default_factory=list)
    sent_upto: int = 0
    opened: bool = False
    done: bool = False


def _safe(parse: Any, params: Any, req_id: str) -> Any:
    """A malformed ``prfaas`` entry makes the request a plain one (and says so), never an
    exception inside vLLM's scheduler loop."""
    try:
        return parse(params)
    except SettingsError as exc:
        log.warning("request %s: ignoring kv_transfer_params: %s", req_id, exc)
        return None


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
        # scheduler side
        self._send_reqs: dict[str, _SendState] = {}
        self._loading: dict[str, str] = {}  # req id -> transfer id, until finished receiving
        self._new_loads: list[LoadJob] = []
        self._abort_sends: list[str] = []
        self._cancel_loads: list[str] = []
        # worker side
        self._thread: TransferThread | None = None
        self._spec: CacheSpec | None = None
        self._geometry: L.KVGeometry | None = None
        self._unsupported = ""
        self._model_layers: tuple[int, ...] = ()
        self._positions: dict[str, int] = {}
        self._paged: dict[str, L.PagedKV] = {}
        self._loads: dict[str, LoadJob] = {}
        self._cancelled: set[str] = set()
        self._error_blocks: set[int] = set()
        self._prepared_for: int | None = None
        self._segments: dict[str, tuple[int, int]] = {}  # transfer id -> (first token, rows)
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
        self._thread = TransferThread(self.settings, self.settings.psk(), name=model.model)
        self._thread.start()
        log.info(
            "PrfaasConnector worker: receiver %s, agent socket %s",
            self._thread.listen_address,
            self.settings.agent_socket,
        )

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        if self._geometry is None:
            return
        g = self._geometry
        self._positions = L.spec_positions(list(kv_caches), self._model_layers)
        self._paged = {
            name: L.paged_kv(kv_caches[name], g.num_kv_heads, g.head_dim)
            for name in self._positions
        }
        sizes = {p.block_size for p in self._paged.values()}
        want = self._vllm_config.cache_config.block_size
        if sizes != {want}:
            self._unsupported = f"kernel block sizes {sizes} differ from the allocator's {want}"
            log.error("PrfaasConnector: KV transfer disabled: %s", self._unsupported)
        first = next(iter(kv_caches.values()))
        log.info(
            "PrfaasConnector: %d attention layers, KV tensor %s %s, block size %d",
            len(self._paged),
            tuple(first.shape),
            first.dtype,
            want,
        )

    def _meta(self) -> PrfaasMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, PrfaasMetadata) else None

    def _prepare(self, meta: PrfaasMetadata) -> None:
        """Once per step (first hook that sees this step's metadata): open new sessions,
        register new loads, abort what the scheduler dropped."""
        if self._prepared_for == id(meta):
            return
        self._prepared_for = id(meta)
        assert self._thread is not None
        for tid in meta.abort_sends:
            self._thread.abort(tid, "the prefill request ended before its prompt was complete")
        for rid in meta.cancel_loads:
            self._cancelled.add(rid)
        for job in meta.loads:
            self._loads[job.req_id] = job
            self._thread.claim(job.params.transfer_id, job.params.timeout_s)
        for step in meta.sends:
            if step.opens:
                self._open(step)

    def _open(self, step: SendStep) -> None:
        assert self._thread is not None
        p = step.params
        if self._spec is None or self._unsupported:
            log.error("request %s: not sent (%s)", step.req_id, self._unsupported)
            return
        skip = min(p.skip_tokens, step.prompt_len - 1)  # at least one row: vLLM recomputes it
        manifest = Manifest.from_layout(p.transfer_id, self._spec.layout(step.prompt_len, skip))
        seg = manifest.layers[0]
        self._segments[p.transfer_id] = (seg.first_token, seg.num_token_rows)
        self._thread.open_send(p.transfer_id, p.host, p.port, p.cross_site, manifest)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is not None:
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
        assert self._thread is not None
        paged = self._paged[layer_name]
        for step in meta.sends:
            seg = self._segments.get(step.params.transfer_id)
            start = max(step.start, seg[0]) if seg is not None else step.end
            if seg is None or step.end <= start:
                continue
            k, v = L.gather(paged, step.block_ids, start, step.end)
            k_off, v_off = L.byte_ranges(self._geometry, seg[0], seg[1], start, step.end)
            tid = step.params.transfer_id
            self._thread.send(tid, pos, k_off, L.as_bytes(k), k)
            self._thread.send(tid, pos, v_off, L.as_bytes(v), v)

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is None:
            return
        self._prepare(meta)
        assert self._thread is not None
        for step in meta.sends:
            if step.last and step.params.transfer_id in self._segments:
                # Queued after this step's bytes: END goes once they are all in the session.
                self._thread.finish_send(step.params.transfer_id)
                del self._segments[step.params.transfer_id]

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        done: set[str] = set()
        failed: set[str] = set()
        if self._thread is None:
            return KVConnectorTransferResults()
        for rid, job in list(self._loads.items()):
            tid = job.params.transfer_id
            if rid in self._cancelled:
                self._cancelled.discard(rid)
                ok, why = False, "request aborted"
                self._thread.release(tid)
            else:
                outcome = self._thread.poll(tid)
                if outcome is None:
                    continue
                ok, why = False, outcome.error
                if outcome.delivery is not None:
                    try:
                        self._install(job, outcome.delivery.manifest, outcome.delivery.buffers)
                        ok = True
                    except L.LayoutError as exc:
                        why = f"does not fit the request: {exc}"
                self._thread.release(tid, ok=ok)
            del self._loads[rid]
            done.add(rid)
            if not ok:
                log.warning("request %s: KV load failed, recomputing: %s", rid, why)
                failed.add(rid)
                if job.single_group:
                    bs = self._vllm_config.cache_config.block_size
                    self._error_blocks.update(job.block_ids[job.start // bs :])
        self._cancelled &= set(self._loads)
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

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
        if job.start >= job.prompt_len:
            return
        rows = manifest.num_tokens - manifest.num_cached_tokens
        r0 = job.start - manifest.num_cached_tokens
        for name, pos in self._positions.items():
            k, v = L.rows_of(buffers[pos], g, rows)
            L.scatter(self._paged[name], job.block_ids, job.start, k[r0:], v[r0:])

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._error_blocks = self._error_blocks, set()
        return out

    def shutdown(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    # ================================ scheduler side ========================================
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        params = _safe(load_params, request.kv_transfer_params, request.request_id)
        if params is None or request.request_id in self._loading:
            return 0, False
        count = request.num_prompt_tokens - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        rid = request.request_id
        sp = _safe(send_params, request.kv_transfer_params, rid)
        if sp is not None and rid not in self._send_reqs:
            skip = min(sp.skip_tokens, request.num_prompt_tokens - 1)
            self._send_reqs[rid] = _SendState(sp, request.num_prompt_tokens, sent_upto=skip)
            return
        lp = _safe(load_params, request.kv_transfer_params, rid)
        if lp is None or num_external_tokens <= 0 or rid in self._loading:
            return
        group_ids = blocks.get_block_ids()
        self._new_loads.append(
            LoadJob(
                req_id=rid,
                params=lp,
                prompt_len=request.num_prompt_tokens,
                start=request.num_prompt_tokens - num_external_tokens,
                block_ids=tuple(group_ids[0]),
                single_group=self._single_group,
            )
        )
        self._loading[rid] = lp.transfer_id
        # One load per request: after a failed load vLLM asks again (from 0 computed tokens);
        # the answer must then be "recompute", not another wait for the same session.
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
                st.block_ids = list(new.block_ids[0])
                self._step(meta, new.req_id, st, new.num_computed_tokens, scheduled[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self._send_reqs.get(rid)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:  # after preemption: the whole block list anew
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            self._step(meta, rid, st, cached.num_computed_tokens[i], scheduled.get(rid, 0))
        return meta

    @staticmethod
    def _step(
        meta: PrfaasMetadata, rid: str, st: _SendState, num_computed: int, num_scheduled: int
    ) -> None:
        if st.done:
            return
        end = min(num_computed + num_scheduled, st.prompt_len)
        # Tokens the local prefix cache held are in the blocks already: send them with the first
        # step (start is where we left off, not where this step's computation starts).
        start = min(st.sent_upto, end)
        last = end >= st.prompt_len
        meta.sends.append(
            SendStep(
                rid, st.params, st.prompt_len, tuple(st.block_ids), start, end, not st.opened, last
            )
        )
        st.opened, st.sent_upto, st.done = True, max(st.sent_upto, end), last

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
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
        if rid in self._loading:  # aborted while its KV was awaited: the worker lets it go
            self._cancel_loads.append(rid)
        if st is None:
            return False, None
        if not st.done:
            if st.opened:
                self._abort_sends.append(st.params.transfer_id)
            return False, None
        # The KV was copied out at save time: vLLM may free the blocks now.
        return False, {"prfaas": {"transfer_id": st.params.transfer_id}}
