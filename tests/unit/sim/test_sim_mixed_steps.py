"""A vLLM site's prefill and decode node are one server whose steps carry both (``SharedCores``
with ``mixed_steps``): while both compute, a decode step takes the prefill's chunk plus what its
batch adds beyond the step's fixed part, and the prefill is slowed by that addition per chunk,
instead of the two time-sharing the core as two processes would."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prfaas.config import load_deployment
from prfaas.perf.profile_file import DecodePoint, PrefillPoint
from prfaas.scenarios import sim_scenario
from prfaas.sim import SimScenario, SimSite, Simulator
from prfaas.sim.processor import SharedCores
from prfaas.sim.scenario import ScenarioError
from prfaas.workload import SimRequestSpec
from profile_helpers import write_profile

pytestmark = pytest.mark.timeout(60)

BASE_S, PER_REQUEST_S = 0.008, 0.0005
"""The decode fit's fixed part per step and per request of the batch."""
BUDGET = 2048


def test_both_computing_a_decode_step_carries_the_chunk_and_a_prefill_the_batch() -> None:
    cores = SharedCores(1, mixed_steps=True)
    cores.chunk_s = 0.080
    cores.busy = 1  # the decode alone: its own speed, its addition recorded
    assert cores.decode_slowdown(0.012, 0.008) == 1.0
    assert cores.decode_extra_s == pytest.approx(0.004)
    cores.busy = 2  # both: one server, not two processes on one core
    assert cores.slowdown() == 1.0
    assert cores.decode_slowdown(0.012, 0.008) == pytest.approx((0.080 + 0.004) / 0.012)
    assert cores.prefill_slowdown() == pytest.approx(1 + 0.004 / 0.080)
    # A fixed part the fit puts below zero is none; a chunk shorter than the step slows nothing.
    assert cores.decode_slowdown(0.012, -0.001) == pytest.approx((0.080 + 0.012) / 0.012)
    cores.chunk_s = 0.0
    assert cores.decode_slowdown(0.012, 0.008) == 1.0
    # Time-shared, as before: both at half speed.
    plain = SharedCores(1)
    plain.busy = 2
    assert plain.prefill_slowdown() == plain.decode_slowdown(0.012, 0.008) == 2.0


def _profile(tmp_path: Path) -> Path:
    prefill = tuple(PrefillPoint(n, 0, 0.002 + 4e-5 * n) for n in (64, 512, 2048, 8192))
    decode = tuple(
        DecodePoint(b, ctx, BASE_S + PER_REQUEST_S * b) for b in (1, 4, 16) for ctx in (128, 4096)
    )
    return Path(
        write_profile(tmp_path / "cpu.yaml", prefill, decode, max_context_tokens=8192,
                      memory_bytes=8e9, source="endpoint")
    )  # fmt: skip


def _run(path: Path, mixed: bool, specs: list[SimRequestSpec]) -> dict[int, tuple[float, float]]:
    site = SimSite("pd", "pd", str(path), 1, 1, shared_cores=1, mixed_steps=mixed)
    sc = SimScenario(
        sites=(site,), model="tiny", policy="local_only", prefix_cache=False,
        local_fabric_gbps=1e9, duration_s=1e6, prefill_token_budget=BUDGET,
    )  # fmt: skip
    sim = Simulator(sc, iter(specs))
    done: dict[int, tuple[float, float]] = {}
    sim.on_finish = lambda req: done.__setitem__(req.index, (req.kv_ready_s, req.finish_s))
    sim.run()
    assert len(done) == len(specs)
    return done


def test_a_long_prefill_beside_a_decode_as_one_server_runs_them(tmp_path: Path) -> None:
    """A request decoding 200 tokens, and a 6,144-token prompt (3 chunks of 2,048) arriving as
    its decode starts: the decode's steps each wait for a chunk while the prefill lasts, the
    prefill pays only the decode's addition per chunk; time-shared, both ran at half speed."""
    path = _profile(tmp_path)
    first = SimRequestSpec(0, 0.0, 256, 200)
    alone = _run(path, False, [first])
    kv_ready_s = alone[0][0]
    long = SimRequestSpec(1, kv_ready_s, 6144, 1)
    long_alone_s = _run(path, False, [SimRequestSpec(0, 0.0, 6144, 1)])[0][0]
    mixed = _run(path, True, [first, long])
    shared = _run(path, False, [first, long])
    extra_s = PER_REQUEST_S  # a batch of one adds this to a step
    chunk_s = long_alone_s / 3
    # The prefill: its own work, each of its 3 chunks carrying the decode batch.
    assert mixed[1][0] - kv_ready_s == pytest.approx(long_alone_s + 3 * extra_s, rel=0.01)
    # The decode: three steps as long as a chunk (and its addition), the rest at its own speed;
    # the step in progress when the prefill ends finishes at the speed it began with (the
    # simulator re-times a decode at its step boundaries), so a fourth may be long too.
    step_s = BASE_S + PER_REQUEST_S
    longer_s = chunk_s + extra_s - step_s
    decode_s = mixed[0][1] - kv_ready_s
    decode_alone_s = alone[0][1] - kv_ready_s
    assert decode_alone_s + 3 * longer_s - 1e-6 <= decode_s <= decode_alone_s + 4 * longer_s + 1e-6
    # Time-shared, the server would have done the decode's whole steps and the prefill in turn.
    assert shared[1][0] > mixed[1][0] and shared[0][1] - kv_ready_s < decode_s


def test_a_vllm_file_with_one_prefill_and_one_decode_node_per_site_gets_mixed_steps(
    tmp_path: Path,
) -> None:
    root = Path(__file__).resolve().parents[3]
    d = load_deployment(root / "examples" / "vllm-tiny.yaml")
    sites = {s.name: s for s in sim_scenario(d).sites}
    pd = next(s for s in sites.values() if s.kind == "pd")
    assert pd.mixed_steps and pd.shared_cores is not None
    assert not any(s.mixed_steps for s in sites.values() if s.kind == "prfaas")
    with pytest.raises(ScenarioError, match="mixed_steps needs shared_cores"):
        SimScenario(
            sites=(SimSite("pd", "pd", "h20", 2, 1, shared_cores=1, mixed_steps=True),)
        ).validate()


def test_prefills_batched_into_one_step_pay_its_fixed_cost_once(tmp_path: Path) -> None:
    """Each profiled prefill paid an engine step's fixed cost (the decode fit's ``base_s``); a
    batch of several shares one step (vLLM puts them into one forward pass), so it pays that
    once, never below its longest member; a profile without a measured decode fit saves
    nothing. The simulator's batch takes exactly that long."""
    from prfaas.perf import cost_model_for
    from prfaas.perf.profile_costs import cost_model_from_profile_file

    cm = cost_model_from_profile_file(_profile(tmp_path))
    assert cm.decode_step_fixed_s() == pytest.approx(BASE_S)
    alone = [cm.prefill_s(n) for n in (64, 300, 700)]
    assert cm.batch_prefill_s([(64, 0), (300, 0), (700, 0)]) == pytest.approx(
        sum(alone) - 2 * BASE_S
    )
    assert cm.batched_prefill_s([0.009, 0.001]) == pytest.approx(0.009)  # its longest
    assert cm.batched_prefill_s([0.02]) == 0.02
    preset = cost_model_for("paper-1t", "h20")
    assert preset.batched_prefill_s([0.1, 0.2]) == pytest.approx(0.3)
    # Three short prompts arriving together: the first starts alone on the idle node, the
    # other two (1,000 tokens, within the budget) share the next step.
    site = SimSite("pd", "pd", str(_profile(tmp_path)), 1, 1)
    sc = SimScenario(
        sites=(site,), model="tiny", policy="local_only", prefix_cache=False,
        local_fabric_gbps=1e9, duration_s=1e6, prefill_token_budget=BUDGET,
    )  # fmt: skip
    specs = [SimRequestSpec(i, 0.0, n, 1) for i, n in enumerate((64, 300, 700))]
    sim = Simulator(sc, iter(specs))
    ends: dict[int, float] = {}
    sim.on_finish = lambda req: ends.__setitem__(req.index, req.prefill_end_s)
    sim.run()
    assert ends[0] == pytest.approx(alone[0])
    assert ends[1] == ends[2] == pytest.approx(sum(alone) - BASE_S)


def test_a_vllm_site_decodes_as_many_as_its_server_admits(tmp_path: Path) -> None:
    """A vLLM server admits up to its max_num_seqs whatever a step takes (128 by default on
    CPU); the simulator's decode batch follows the file's engine kind (the SLO's batch for the
    timed and torch kinds), ``simulation.decode_max_batch`` overriding, and ``plan`` says so."""
    from prfaas.capacity import left_out_by_eqs

    root = Path(__file__).resolve().parents[3]
    d = load_deployment(root / "examples" / "vllm-tiny.yaml")
    pd = next(s for s in sim_scenario(d).sites if s.kind == "pd")
    assert pd.decode_max_batch == 128 and pd.lookup_at_start
    assert any("decode batch: site" in line for line in left_out_by_eqs(d, sim_scenario(d)))
    raw = yaml.safe_load((root / "examples" / "vllm-tiny.yaml").read_text())
    raw.setdefault("simulation", {})["decode_max_batch"] = 256
    given = tmp_path / "given.yaml"
    given.write_text(yaml.safe_dump(raw))
    given_sites = sim_scenario(load_deployment(given)).sites
    assert next(s for s in given_sites if s.kind == "pd").decode_max_batch == 256
    timed = load_deployment(root / "examples" / "two-site.yaml")
    assert all(s.decode_max_batch is None and not s.lookup_at_start
               for s in sim_scenario(timed).sites)  # fmt: skip
    # 40 requests of 64 tokens decoding 30 tokens each: one wave at the server's cap, four at a
    # cap of 10 (the SLO's batch on a slower profile); memory for all of their KV.
    prefill = tuple(PrefillPoint(n, 0, 0.002 + 4e-5 * n) for n in (64, 512, 2048))
    decode = tuple(
        DecodePoint(b, ctx, BASE_S + PER_REQUEST_S * b) for b in (1, 4, 16) for ctx in (128, 4096)
    )
    path = write_profile(tmp_path / "big.yaml", prefill, decode, max_context_tokens=8192,
                         memory_bytes=1e13, source="endpoint")  # fmt: skip
    specs = [SimRequestSpec(i, 0.0, 64, 30) for i in range(40)]

    def drain_s(cap: int | None) -> float:
        site = SimSite("pd", "pd", path, 1, 1, decode_max_batch=cap)
        sc = SimScenario(
            sites=(site,), model="tiny", policy="local_only", prefix_cache=False,
            local_fabric_gbps=1e9, duration_s=1e6, prefill_token_budget=BUDGET,
        )  # fmt: skip
        sim = Simulator(sc, iter(specs))
        ends: list[float] = []
        sim.on_finish = lambda req: ends.append(req.finish_s)
        sim.run()
        assert len(ends) == len(specs)
        return max(ends)

    # One wave of ~29 steps of 40 (28 ms) against four of 10 (13 ms).
    assert drain_s(128) < 0.6 * drain_s(10)
    with pytest.raises(ScenarioError, match="decode_max_batch must be >= 1"):
        SimScenario(sites=(SimSite("pd", "pd", "h20", 1, 1, decode_max_batch=0),)).validate()
