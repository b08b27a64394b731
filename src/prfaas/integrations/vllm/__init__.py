"""``prfaas.integrations.vllm``: ``PrfaasConnector``, a vLLM KV connector over prfaas.transfer.

vLLM loads it with ``"kv_connector": "PrfaasConnector", "kv_connector_module_path":
"prfaas.integrations.vllm.connector"`` (docs/vllm.md, /work/briefs/vllm_contract.md). Modules:
- ``settings``: the connector's extra config and per-request ``kv_transfer_params``, validated
  (pure, no torch, no vllm);
- ``layout``: which vLLM layers are which prfaas ``CacheSpec`` positions, and how a request's
  tokens sit in vLLM's paged KV tensors (torch, no vllm);
- ``transfer_thread``: one background thread per vLLM worker process running an asyncio loop with
  the prfaas.transfer links, the receiver and the agent socket (no torch, no vllm);
- ``staged_sessions``: the sessions that thread's receiver takes in, staged for the worker (no
  torch, no vllm); its sender links are a ``transfer.link_pool.LinkPool``;
- ``connector``: the class vLLM loads (imports vllm and torch).

Importing this package imports neither vllm nor torch; ``PrfaasConnector`` is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name == "PrfaasConnector":
        return importlib.import_module("prfaas.integrations.vllm.connector").PrfaasConnector
    raise AttributeError(f"module 'prfaas.integrations.vllm' has no attribute {name!r}")


__all__ = ["PrfaasConnector"]
