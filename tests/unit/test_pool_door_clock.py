"""The front door's clock (``pool.service.build``): modelled seconds by a deployment gateway's
rule, wall over ``units.time_scale`` for timed groups and wall seconds for torch ones (real
engines compute in real time whatever ``time_scale`` says); a pool mixing the two at another
scale than 1 is refused naming ``units.time_scale``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from prfaas.errors import UsageError
from prfaas.perf import cost_model_for_hardware
from prfaas.pool.driver import PlacementDriver
from prfaas.pool.resolved import KEY_NAME, POOL_NAME
from prfaas.pool_sections import PoolFileConfig

pytestmark = pytest.mark.timeout(60)


def _pool(kinds: tuple[str, ...], time_scale: float = 0.1) -> PoolFileConfig:
    groups = [
        {"name": f"g{i}", "model": "paper-1t" if i == 0 else "qwen3-next-80b-a3b", "kind": kind,
         "model_path": None if kind == "timed" else "/models/m", "num_nodes": 1}
        for i, kind in enumerate(kinds)
    ]  # fmt: skip
    return PoolFileConfig.model_validate({
        "units": {"time_scale": time_scale},
        "front_door": {"port": 0, "control_port": 0},
        "egress_gbps": 100, "lease_s": 3.0, "groups": groups,
        "tenants": [{"name": "a", "keys": [{"id": "a-1", "file": "a.key"}],
                     "cap": {"max_rate_rps": 2}}],
    })  # fmt: skip


def _built(
    tmp_path: Path, pool: PoolFileConfig, monkeypatch: pytest.MonkeyPatch
) -> PlacementDriver:
    from prfaas.pool import service

    # A torch group is priced and fingerprinted from its model folder: none is needed here.
    cost = cost_model_for_hardware("paper-1t", "h200")
    monkeypatch.setattr(service, "group_costs", lambda g: cost)
    monkeypatch.setattr(service, "fingerprints", lambda p: {g.model: {} for g in p.groups})
    (tmp_path / POOL_NAME).write_text(yaml.safe_dump(pool.model_dump(mode="json")))
    (tmp_path / KEY_NAME).write_text("k" * 48 + "\n")
    (tmp_path / "a.key").write_text("a" * 32 + "\n")
    _, _, driver, _, _ = service.build(tmp_path)
    return driver


@pytest.mark.parametrize(("kind", "wall_per_modelled"), [("timed", 0.1), ("torch", 1.0)])
def test_the_door_runs_in_the_groups_modelled_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, wall_per_modelled: float
) -> None:
    """At time_scale 0.1 a timed pool's door counts ten modelled seconds per wall second; a torch
    pool's counts wall seconds, as a torch deployment's gateway does, so its torch nodes' real
    seconds, its leases, decays and rate caps are on one clock."""
    pool = _pool((kind,))
    driver = _built(tmp_path, pool, monkeypatch)
    assert driver.clock() == pytest.approx(time.monotonic() / wall_per_modelled, abs=1.0)
    assert driver.door.lease_s == pytest.approx(3.0 / wall_per_modelled)  # 3 s of wall time
    assert pool.wall_s_per_modelled_s == wall_per_modelled


def test_a_mix_of_timed_and_torch_groups_needs_time_scale_1(tmp_path: Path) -> None:
    from prfaas.pool.launcher import PoolLauncher

    mixed = _pool(("timed", "torch"))
    why = mixed.clock_conflict()
    assert why is not None and why.startswith("units.time_scale: 0.1 with timed and torch groups")
    with pytest.raises(UsageError, match=r"pool\.yaml: units\.time_scale: 0\.1 with timed and"):
        PoolLauncher(mixed, tmp_path / "pool.yaml", tmp_path / "wd")
    at_one = _pool(("timed", "torch"), time_scale=1.0)
    assert at_one.clock_conflict() is None and at_one.wall_s_per_modelled_s == 1.0
    assert _pool(("torch", "torch")).clock_conflict() is None
    assert _pool(("timed", "timed")).clock_conflict() is None
