"""A decode engine that pads its batch (``SimSite.decode_pads_batch``: ``engine.torch`` left-pads
the batch's caches into one): each step's context terms are paid on ``batch x longest context``,
not on the contexts' sum. Where every member has the same context the two agree."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from prfaas.perf.profile_file import DecodePoint, PrefillPoint
from prfaas.sim import SimScenario, SimSite, Simulator
from prfaas.sim.nodes import DecodeNode
from prfaas.workload import SimRequestSpec
from profile_helpers import write_profile

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def hardware(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A profile whose decode step grows with its batch's context (the paper's H20 step is a
    constant 25 ms, blind to context)."""
    prefill = tuple(PrefillPoint(n, 0, 0.01 + 1e-5 * n) for n in (64, 1024, 32768))
    decode = tuple(DecodePoint(b, ctx, 0.002 + 0.0005 * b + 1e-8 * b * ctx)
                   for b in (1, 2, 4) for ctx in (128, 8192))  # fmt: skip
    return write_profile(tmp_path_factory.mktemp("padding") / "tiny.yaml", prefill, decode)


def _run(
    hardware: str, pads: bool, specs: list[SimRequestSpec], prefill_token_budget: int = 1
) -> tuple[Simulator, dict[int, float]]:
    site = SimSite("pd", "pd", hardware, 1, 1, decode_pads_batch=pads)
    sc = SimScenario(
        sites=(site,), model="tiny", policy="local_only", prefix_cache=False, local_fabric_gbps=1e9,
        duration_s=1e6, prefill_token_budget=prefill_token_budget,
    )  # fmt: skip
    sim = Simulator(sc, iter(specs))
    done: dict[int, float] = {}
    sim.on_finish = lambda req: done.__setitem__(req.index, req.finish_s)
    sim.run()
    assert len(done) == len(specs)
    return sim, done


def _decode_node(sim: Simulator) -> DecodeNode:
    return next(n for n in sim.world.nodes if isinstance(n, DecodeNode))


def test_equal_contexts_cost_the_same_padded_or_not(hardware: str) -> None:
    """Prefilled in one batch, the members join at one step: their contexts stay equal."""
    specs = [SimRequestSpec(i, 0.0, 3000, 20 + 5 * i) for i in range(8)]
    padded, summed = (_run(hardware, pads, specs, 32768)[1] for pads in (True, False))
    assert padded == pytest.approx(summed, rel=1e-12)
    # Joining one after another, the earlier ones have generated more: padded costs more.
    one_by_one = _run(hardware, True, specs)[1]
    assert one_by_one[7] > _run(hardware, False, specs)[1][7]


def test_one_request_at_a_time_is_never_padded(hardware: str) -> None:
    specs = [SimRequestSpec(i, 100.0 * i, 500 + 2000 * (i % 3), 20) for i in range(6)]
    padded, summed = (_run(hardware, pads, specs)[1] for pads in (True, False))
    assert padded == pytest.approx(summed, rel=1e-12)


def test_a_mixed_batch_steps_at_its_longest_context(hardware: str) -> None:
    """Short prompts decoding beside a long one take longer padded; the decode node's busy
    time is what its steps cost at batch x the longest context."""
    specs = [SimRequestSpec(0, 0.0, 30000, 200)]
    specs += [SimRequestSpec(i, 0.0, 200, 100) for i in range(1, 9)]
    sim_sum, by_sum = _run(hardware, False, specs)
    sim_pad, by_pad = _run(hardware, True, specs)
    assert all(by_pad[i] > by_sum[i] for i in range(1, 9))
    dec_sum, dec_pad = (_decode_node(s) for s in (sim_sum, sim_pad))
    assert dec_pad.step == dec_sum.step  # the same steps, each dearer
    assert dec_pad.busy_s > dec_sum.busy_s


def test_finished_members_do_not_pile_up_in_the_longest_context_heap(hardware: str) -> None:
    specs = [SimRequestSpec(i, 0.02 * i, 100 + 97 * (i % 50), 5 + i % 30) for i in range(3000)]
    sim, done = _run(hardware, True, specs)
    dec = _decode_node(sim)
    assert len(dec.ctx_tops) <= 4 * dec.max_batch + 65
    # and the order of finishes is a run's own: the padded run differs from the summed one
    assert done != _run(hardware, False, [replace(s) for s in specs])[1]


@pytest.mark.parametrize(
    ("kind", "override", "pads"),
    [("torch", None, True), ("timed", None, False), ("torch", False, False), ("timed", True, True)],
)
def test_the_engine_kind_decides_unless_the_file_does(
    tmp_path: Path, kind: str, override: bool | None, pads: bool
) -> None:
    from prfaas.capacity import left_out_by_eqs
    from prfaas.config import DeploymentConfig
    from prfaas.scenarios import sim_scenario

    engine: dict[str, object] = {"kind": kind, "model": "paper-1t"}
    if kind == "torch":
        engine["model_path"] = str(tmp_path)
    d = DeploymentConfig.model_validate({
        "engine": engine,
        "sites": [{"name": "pd", "kind": "pd", "hardware": "h20",
                   "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]}],
        "simulation": {} if override is None else {"decode_pads_batch": override},
    })  # fmt: skip
    sc = sim_scenario(d)
    assert sc.sites[0].decode_pads_batch is pads
    assert any(line.startswith("decode padding") for line in left_out_by_eqs(d, sc)) is pads
