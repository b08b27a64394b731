"""A vLLM server looks its prefix cache up when it schedules a prompt, not when the gateway
routed it: a session's next turn queued behind its previous turn reuses the blocks that prefill
stored meanwhile (``SimSite.lookup_at_start``, ``Simulator._found_since_routed``). prfaas's own
nodes use what the gateway found when it routed (``use_cached_tokens``), and so does their
simulation. Routing sees what was cached at arrival either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from prfaas.perf.profile_costs import cost_model_from_profile_file
from prfaas.perf.profile_file import DecodePoint, PrefillPoint
from prfaas.sim import SimScenario, SimSite, Simulator
from prfaas.workload import SimRequestSpec
from profile_helpers import write_profile

pytestmark = pytest.mark.timeout(60)

BLOCK = 512  # the simulator's prefix-cache block (the trace's)


def _run(
    path: str, specs: list[SimRequestSpec], at_start: bool = True
) -> dict[int, tuple[float, float, int]]:
    site = SimSite("pd", "pd", path, 1, 1, lookup_at_start=at_start)
    sc = SimScenario(
        sites=(site,), model="tiny", policy="local_only", prefix_cache=True,
        local_fabric_gbps=1e9, duration_s=1e6, prefill_token_budget=1,
    )  # fmt: skip
    sim = Simulator(sc, iter(specs))
    done: dict[int, tuple[float, float, int]] = {}
    sim.on_finish = lambda r: done.__setitem__(
        r.index, (r.prefill_start_s, r.prefill_end_s, r.num_cached)
    )
    sim.run()
    assert len(done) == len(specs)
    return done


def test_a_turn_queued_behind_its_previous_turn_reuses_its_blocks(tmp_path: Path) -> None:
    prefill = tuple(PrefillPoint(n, 0, 0.002 + 4e-5 * n) for n in (64, 512, 2048, 8192))
    decode = tuple(DecodePoint(b, ctx, 0.004 + 2e-4 * b) for b in (1, 4) for ctx in (128, 4096))
    path = write_profile(tmp_path / "p.yaml", prefill, decode, max_context_tokens=16384)
    cm = cost_model_from_profile_file(Path(path))
    first = tuple(range(1, 5))  # 4 blocks: 2,048 tokens
    second = (*first, 5, 6)  # the next turn: the same 4 blocks and 2 more
    # Both arrive at once: when routed, nothing is cached; the second waits for the first.
    done = _run(path, [SimRequestSpec(0, 0.0, 4 * BLOCK, 1, first),
                       SimRequestSpec(1, 0.0, 6 * BLOCK, 1, second)])  # fmt: skip
    assert done[0][2] == 0 and done[1][2] == 4 * BLOCK
    assert done[1][0] == pytest.approx(done[0][1])  # it started when the first ended
    took = done[1][1] - done[1][0]
    assert took == pytest.approx(cm.prefill_s(2 * BLOCK, 4 * BLOCK))
    assert took < 0.5 * cm.prefill_s(6 * BLOCK)
    # A torch or timed site: what the gateway found, nothing more.
    routed = _run(path, [SimRequestSpec(0, 0.0, 4 * BLOCK, 1, first),
                         SimRequestSpec(1, 0.0, 6 * BLOCK, 1, second)], at_start=False)  # fmt: skip
    assert routed[1][2] == 0
    assert routed[1][1] - routed[1][0] == pytest.approx(cm.prefill_s(6 * BLOCK))
    # Unrelated prompts find nothing, queued or not.
    other = _run(path, [SimRequestSpec(0, 0.0, 4 * BLOCK, 1, first),
                        SimRequestSpec(1, 0.0, 6 * BLOCK, 1, (7, 8, 9, 10, 11, 12))])  # fmt: skip
    assert other[1][2] == 0
    assert other[1][1] - other[1][0] == pytest.approx(cm.prefill_s(6 * BLOCK))
