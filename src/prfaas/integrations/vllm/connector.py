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
This module is only the class vLLM loads: it delegates each hook to ``scheduler_side``
(EngineCore's bookkeeping) or ``worker_side`` (the Worker's copies and sessions), whichever its
role makes; the step metadata between them is ``metadata``. Imports vllm at module level (vLLM
imports this module in its own venv); the parts without vllm live in ``settings``, ``layout``,
``staging``, ``faults``, ``trace`` and ``transfer_thread`` (with ``agent_server`` and
``staged_sessions``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)

from prfaas.integrations.vllm.faults import FAULT_ENV, FAULT_POINTS, InjectedFault
from prfaas.integrations.vllm.groups import HYBRID_ENV, CacheGroups
from prfaas.integrations.vllm.metadata import LoadJob, PrfaasMetadata, SendStep
from prfaas.integrations.vllm.scheduler_side import SchedulerSide
from prfaas.integrations.vllm.settings import ConnectorSettings
from prfaas.integrations.vllm.worker_side import WorkerSide

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = [
    "FAULT_ENV",
    "FAULT_POINTS",
    "HYBRID_ENV",
    "InjectedFault",
    "LoadJob",
    "PrfaasConnector",
    "PrfaasMetadata",
    "SendStep",
]


class PrfaasConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]  # vllm: untyped
    """Remote prefill / remote decode of vLLM requests over prfaas.transfer: vLLM makes one in
    EngineCore (role SCHEDULER) and one per Worker (role WORKER); each delegates to its side."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)  # type: ignore[arg-type]
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.settings = ConnectorSettings.from_extra_config(extra)
        groups = CacheGroups.of(vllm_config, kv_cache_config)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        if role is KVConnectorRole.WORKER:
            self._worker = WorkerSide(vllm_config, self.settings, groups)
        else:
            self._scheduler = SchedulerSide(groups.single_group, groups.backoff)

    @property
    def scheduler(self) -> SchedulerSide:
        assert self._scheduler is not None, "a scheduler-side hook called in a Worker"
        return self._scheduler

    @property
    def worker(self) -> WorkerSide:
        assert self._worker is not None, "a worker-side hook called in EngineCore"
        return self._worker

    # ================================ worker side ===========================================
    def _meta(self) -> PrfaasMetadata | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta if isinstance(meta, PrfaasMetadata) else None

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._meta()
        if meta is not None:
            self.worker.start_load_kv(meta)

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
        if meta is not None:
            self.worker.save_kv_layer(meta, layer_name)

    def wait_for_save(self) -> None:
        meta = self._meta()
        if meta is not None:
            self.worker.wait_for_save(meta)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        done, failed = self.worker.get_transfer_results()
        return KVConnectorTransferResults(finished_recving=done, failed_recving=failed)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()

    # ================================ scheduler side ========================================
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return self.scheduler.build_connector_meta(scheduler_output)

    def on_new_request(self, request: Request) -> None:
        self.scheduler.on_new_request(request)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.scheduler.update_connector_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.request_finished(request)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.scheduler.request_finished(request)
