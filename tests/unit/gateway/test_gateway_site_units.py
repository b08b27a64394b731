"""The registry converts each site's figures with that site's own engine: a vLLM site under a
top-level ``timed`` engine sends real bytes in real time, so its egress counts are not multiplied
by the timed engine's ``byte_divisor`` (they were: its link read 1000 times busier than it was)."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_fakes import DEPLOYMENT, link_report

from prfaas.config import DeploymentConfig
from prfaas.core import MutableClusterView, SiteId, SiteKind
from prfaas.serve.gateway.registry import NodeRegistry
from prfaas.serve.node.messages import Heartbeat, NodeEndpoint, NodeReport, Registration

pytestmark = pytest.mark.timeout(30)


def _registry(remote_engine: dict[str, Any] | None) -> NodeRegistry:
    raw = DEPLOYMENT.model_dump(exclude_defaults=True)
    raw["engine"]["byte_divisor"] = 1000
    if remote_engine is not None:
        raw["sites"][0]["engine"] = remote_engine
    d = DeploymentConfig.model_validate(raw)
    view = MutableClusterView({SiteId(s.name): SiteKind(s.kind) for s in d.sites}, 64)
    registry = NodeRegistry(d, view)
    ep = NodeEndpoint(node="pf0", site="remote", role="prefill", host="mem", http_port=1)
    registry.register(Registration(process="pf0", nodes=[ep]), 0.0)
    return registry


def _backlog_after(registry: NodeRegistry, unsent_bytes: int) -> float:
    report = NodeReport(
        node="pf0", site="remote", role="prefill", egress_backlog_bytes=unsent_bytes
    )
    link = link_report(configured_bytes_per_s=100e9 / 8)
    assert registry.heartbeat(Heartbeat(process="pf0", reports=[report], links=[link]), 0.1)
    (state,) = registry.link_states()
    return state.backlog_bytes


def test_a_vllm_site_under_a_timed_engine_counts_real_bytes(tmp_path: Any) -> None:
    vllm = _registry({"kind": "vllm", "model_path": str(tmp_path)})
    assert vllm.byte_divisors == {"remote": 1, "pd": 1000}
    assert _backlog_after(vllm, 1_000_000) == 1_000_000  # real bytes: not scaled
    timed = _registry(None)
    assert _backlog_after(timed, 1_000) == 1_000_000  # payload bytes x byte_divisor
