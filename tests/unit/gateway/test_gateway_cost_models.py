"""A torch (or vLLM) deployment is priced from its sites' profile files, so the gateway's tuner and
rebalancer run (and the planner's ``t`` applies) as for emulated nodes; without both profiles
nothing prices a real engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.config import DeploymentConfig
from prfaas.scenarios import deployment_cost_models as _cost_models

DATA = Path(__file__).resolve().parents[3] / "src" / "prfaas" / "perf" / "data"


def _deployment(tmp_path: Path, prfaas_hw: str, pd_hw: str) -> DeploymentConfig:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    return DeploymentConfig.model_validate(
        {
            "engine": {"kind": "torch", "model": "paper-1t", "model_path": str(folder)},
            "sites": [
                {"name": "prfaas", "kind": "prfaas", "hardware": prfaas_hw,
                 "nodes": [{"name": "pf0", "role": "prefill"}]},
                {"name": "pd", "kind": "pd", "hardware": pd_hw,
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
            ],
            "links": [{"src": "prfaas", "dst": "pd", "gbps": 10}],
        }
    )  # fmt: skip


def test_profile_files_price_a_torch_deployment(tmp_path: Path) -> None:
    d = _deployment(tmp_path, str(DATA / "paper-1t@h200.yaml"), str(DATA / "paper-1t@h20.yaml"))
    remote, local = _cost_models(d)
    assert remote is not None and local is not None
    assert remote.hardware.name == "h200" and local.hardware.name == "h20"
    assert remote.prefill_s(8192) < local.prefill_s(8192)


@pytest.mark.parametrize("profiled", ["prfaas", "pd", None])
def test_without_both_profiles_a_real_engine_is_not_priced(
    tmp_path: Path, profiled: str | None
) -> None:
    hw = {"prfaas": "h200", "pd": "h20"}
    if profiled is not None:
        hw[profiled] = str(DATA / f"paper-1t@{hw[profiled]}.yaml")
    assert _cost_models(_deployment(tmp_path, hw["prfaas"], hw["pd"])) == (None, None)


def test_planned_threshold_follows_the_profiles(tmp_path: Path) -> None:
    from prfaas.scenarios import DEFAULT_TORCH_THRESHOLD_TOKENS, planned_threshold

    priced = _deployment(
        tmp_path, str(DATA / "paper-1t@h200.yaml"), str(DATA / "paper-1t@h20.yaml")
    )
    assert planned_threshold(priced) != DEFAULT_TORCH_THRESHOLD_TOKENS
    assert planned_threshold(_deployment(tmp_path, "h200", "h20")) == DEFAULT_TORCH_THRESHOLD_TOKENS
