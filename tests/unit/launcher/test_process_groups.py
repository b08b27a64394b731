"""Which node processes the launcher starts: decided per site (one process per site, per node at
torch sites or with ``--process-per-node``). A torch site beside a vLLM site used to split the
vLLM site into a process (so a vLLM server) per node: two servers on the site's one core, and
its local route no longer co-located. No process is started here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prfaas.config import DeploymentConfig
from prfaas.serve.launcher import Launcher

pytestmark = pytest.mark.timeout(30)


def _mixed(prfaas_engine: dict[str, Any], pd_engine: dict[str, Any]) -> DeploymentConfig:
    return DeploymentConfig.model_validate(
        {
            "engine": {"kind": "vllm", "model": "tiny", "model_path": "/nonexistent/tiny"},
            "sites": [
                {"name": "pf", "kind": "prfaas", "hardware": "h200",
                 "nodes": [{"name": "pf0", "role": "prefill"}, {"name": "pf1", "role": "prefill"}],
                 "engine": prfaas_engine},
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
                 "engine": pd_engine},
            ],
            "links": [{"src": "pf", "dst": "pd", "gbps": 1}],
            "psk": "process-groups-test-key-0123",
        }
    )  # fmt: skip


def test_a_vllm_site_stays_one_process_beside_a_torch_site(tmp_path: Path) -> None:
    d = _mixed({"vllm": {"cpu_bind": "1"}}, {"kind": "torch", "cpus": "0"})
    assert Launcher(d, tmp_path).groups() == [
        ("pf", ["pf0", "pf1"]),
        ("p0", ["p0"]),
        ("d0", ["d0"]),
    ]


def test_the_reverse_keeps_the_vllm_pd_site_co_located(tmp_path: Path) -> None:
    d = _mixed({"kind": "torch", "cpus": "1"}, {"vllm": {"cpu_bind": "0"}})
    assert Launcher(d, tmp_path).groups() == [
        ("pf0", ["pf0"]),
        ("pf1", ["pf1"]),
        ("pd", ["p0", "d0"]),
    ]


def test_process_per_node_splits_every_site(tmp_path: Path) -> None:
    d = _mixed({"vllm": {"cpu_bind": "1"}}, {"kind": "torch", "cpus": "0"})
    names = [name for name, _ in Launcher(d, tmp_path, process_per_node=True).groups()]
    assert names == ["pf0", "pf1", "p0", "d0"]
