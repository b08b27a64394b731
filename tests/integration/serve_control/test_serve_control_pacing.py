"""The rate a node process paces its cross-site KV at: the deployment file's link rate converted
to wall payload bytes per second. Only the emulated (``timed``) engine scales time and bytes; a
torch node sends real bytes in real time, so its link is paced at the file's rate. (A torch
deployment's 10 Gbps link used to be paced at 10 Mbit/s, ``byte_divisor`` applied to real bytes:
the fidelity bench's live capacity was a quarter of the simulated one because of it.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from control_helpers import deployment_dict

from prfaas.config import DeploymentConfig
from prfaas.serve.node.host import WorkerHost

pytestmark = pytest.mark.timeout(120)


def _host(raw: dict[str, Any], node: str = "pf0") -> WorkerHost:
    return WorkerHost(DeploymentConfig.model_validate(raw), [node], "http://127.0.0.1:9")


def test_a_timed_node_paces_the_modelled_link_scaled_to_its_payloads() -> None:
    raw = deployment_dict()  # 100 Gbps, time_scale 0.05, byte_divisor 1000
    host = _host(raw)
    assert host.link_rate_bytes_per_s() == pytest.approx(100e9 / 8 / 1000 / 0.05)


def test_a_torch_node_paces_at_the_files_rate(tmp_path: Path) -> None:
    from prfaas.engine.torch.tiny import make_tiny

    model = make_tiny("llama", tmp_path / "tiny")
    raw = deployment_dict()
    # byte_divisor and time_scale stay at values a timed file would have: a torch engine
    # must ignore them.
    raw["engine"] = {"kind": "torch", "model": "tiny", "model_path": str(model),
                     "time_scale": 0.05, "byte_divisor": 1000}  # fmt: skip
    raw["links"][0]["gbps"] = 10
    host = _host(raw)
    try:
        assert host.link_rate_bytes_per_s() == pytest.approx(10e9 / 8)
        asyncio.run(host.set_link_gbps(2.5))
        assert host.link_rate_bytes_per_s() == pytest.approx(2.5e9 / 8)
    finally:
        for node in host.nodes.values():
            node.close()


def test_the_netns_testbed_shapes_the_same_rate_as_the_pacer() -> None:
    """``netns: true`` shapes the veth with tbf instead of pacing: the same conversion (a torch
    veth used to be shaped at 1/byte_divisor of the file's rate, like the pacer)."""
    from prfaas.serve.launch_netns import shaped_link

    raw = deployment_dict()  # timed: 100 Gbps, 10 ms, time_scale 0.05, byte_divisor 1000
    rate_mbit, delay_s = shaped_link(DeploymentConfig.model_validate(raw), "prfaas")
    assert rate_mbit == pytest.approx(100e3 / 1000 / 0.05) and delay_s == pytest.approx(0.00025)
    raw["engine"] = {"kind": "torch", "model": "tiny", "model_path": "/nonexistent",
                     "time_scale": 0.05, "byte_divisor": 1000}  # fmt: skip
    rate_mbit, delay_s = shaped_link(DeploymentConfig.model_validate(raw), "prfaas")
    assert rate_mbit == pytest.approx(100e3) and delay_s == pytest.approx(0.005)


def test_link_rate_is_refused_under_netns_where_tbf_shapes_the_link() -> None:
    """Nothing in the process paces a namespaced deployment's link: ``/link/rate`` used to change
    only the rate its reports and estimator claimed."""
    from prfaas.serve.node.hosting import LinkRateRefused

    raw = deployment_dict()
    raw["netns"] = True
    host = _host(raw)
    assert host.link_rate_bytes_per_s() is None  # unpaced
    with pytest.raises(LinkRateRefused, match="tbf shapes the link"):
        asyncio.run(host.set_link_gbps(2.5))
    assert host.link_gbps == 100.0  # what the file says, still
