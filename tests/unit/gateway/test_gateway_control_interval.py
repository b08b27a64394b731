"""The gateway's control loop runs the policy every ``control_interval_s`` of modelled time (the
simulator's interval: ``control_interval_s * time_scale`` wall seconds with timed engines), while
expiring silent nodes at every call; late wake-ups do not make ticks burst."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from gateway_fakes import make_registry

from prfaas.policy import TuningConfig
from prfaas.serve.gateway import control as control_module
from prfaas.serve.gateway.control import ControlLoop

pytestmark = pytest.mark.timeout(30)


async def test_policy_ticks_on_the_modelled_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = make_registry()
    assert registry.time_scale == pytest.approx(0.1)  # 1 modelled s = 0.1 wall s
    wall = [100.0]
    monkeypatch.setattr(control_module.time, "monotonic", lambda: wall[0])
    expired: list[float] = []
    real_expire = registry.expire

    def expire(now_wall_s: float) -> list[str]:
        expired.append(now_wall_s)
        return real_expire(now_wall_s)

    monkeypatch.setattr(registry, "expire", expire)
    loop = ControlLoop(
        registry, None, None, tune=False, rebalance=False, tuning=TuningConfig(), interval_s=2.0
    )
    client: Any = httpx.AsyncClient()
    try:
        assert loop.wait_s(wall[0]) == pytest.approx(0.2)  # 2 modelled s, in wall seconds
        ticks = []
        for _ in range(40):  # called every 0.025 wall s (4x the gateway's expiry period)
            wall[0] += 0.025
            await loop.tick(client)
            ticks.append(loop.num_ticks)
        # 1.0 wall s = 10 modelled s: one policy tick per 2 modelled s (0.2 wall s), five.
        assert loop.num_ticks == 5 and len(expired) == 40
        assert [i for i in range(1, 40) if ticks[i] > ticks[i - 1]] == [7, 15, 23, 31, 39]
        wall[0] += 3.0  # a long stall (15 intervals): one tick, then back on the interval
        await loop.tick(client)
        assert loop.num_ticks == 6
        await loop.tick(client)
        assert loop.num_ticks == 6 and loop.wait_s(wall[0]) == pytest.approx(0.2)
    finally:
        await client.aclose()
    with pytest.raises(ValueError, match="interval"):
        ControlLoop(registry, None, None, False, False, TuningConfig(), interval_s=0)
