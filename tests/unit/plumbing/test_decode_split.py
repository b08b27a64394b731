"""The decode node's per-token CPU measured at batch 1 split into a per-step and a per-token term
(``perf.plumbing.split_decode_overhead``), and the simulator charging the per-step term once per
decode step, not per request of its batch."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from test_plumbing_terms import _profile

from prfaas.perf import profile_costs
from prfaas.perf.plumbing import (
    DecodeClass,
    PlumbingCosts,
    context_cost,
    line_fit,
    split_decode_live,
    split_decode_overhead,
)
from prfaas.perf.profile_costs import cost_model_from_profile_file
from prfaas.perf.profile_write import dump_profile_file
from prfaas.sim import SimScenario, SimSite, Simulator
from prfaas.workload import SimRequestSpec

pytestmark = pytest.mark.timeout(60)


def test_two_batch_sizes_give_the_step_and_the_token() -> None:
    step, per_request, batch1 = 0.003, 0.0004, 0.005
    split = split_decode_overhead({1: step + per_request, 8: step + 8 * per_request}, batch1)
    assert split.per_step_s == pytest.approx(step)
    assert split.engine_per_request_s == pytest.approx(per_request)
    assert split.per_output_token_s == pytest.approx(batch1 - step)
    assert split.clipped == ()
    # At batch 1 the two terms add up to what was measured there; at 8 the step is paid once.
    assert split.per_step_s + split.per_output_token_s == pytest.approx(batch1)
    assert split.per_step_s + 8 * split.per_output_token_s < 8 * batch1


def test_more_than_two_sizes_are_a_least_squares_line() -> None:
    split = split_decode_overhead({1: 0.0031, 4: 0.0045, 8: 0.0064}, 0.01)
    assert split.engine_per_request_s == pytest.approx(0.000471, rel=0.01)
    assert split.per_step_s == pytest.approx(0.0026, rel=0.02)


def test_noise_is_clipped_and_said() -> None:
    # The engine's per-step overhead above what the live node paid per token at batch 1: the
    # per-step is capped so that a token still costs the engine's own per-request share.
    split = split_decode_overhead({1: 0.0059, 8: 0.0123}, 0.0049)
    assert split.engine_per_request_s == pytest.approx(0.0064 / 7)
    assert split.per_output_token_s == pytest.approx(split.engine_per_request_s)
    assert split.per_step_s == pytest.approx(0.0049 - 0.0064 / 7)
    assert any("capped" in c for c in split.clipped)
    falling = split_decode_overhead({1: 0.004, 8: 0.003}, 0.01)  # overhead falling with batch
    assert falling.engine_per_request_s == 0.0 and falling.per_step_s == pytest.approx(0.0035)
    assert any("slope" in c for c in falling.clipped)
    nothing = split_decode_overhead({1: -0.001, 8: -0.001}, 0.002)
    assert nothing.per_step_s == 0.0 and nothing.per_output_token_s == pytest.approx(0.002)


def _cls(steps: int, tokens: int, a: float, c: float, forward_s: float = 1.0) -> DecodeClass:
    return DecodeClass(steps, tokens, steps * a + tokens * c, forward_s)


def test_the_live_classes_give_the_step_and_the_token() -> None:
    """S steps made N tokens and cost S a + N c beyond the forward passes; one request at a time
    a token cost a + c: both terms come back exactly from one batch-1 and one batched class, and
    from three, and are held at 0 (and said) where the noise says impossible."""
    a, c = 0.004, 0.0008
    one = _cls(992, 992, a, c)
    split = split_decode_live([one, _cls(70, 496, a, c)], 0.03, 0.01)
    assert split.per_step_s == pytest.approx(a) and split.per_output_token_s == pytest.approx(c)
    assert split.clipped == ()
    three = split_decode_live([one, _cls(70, 496, a, c), _cls(40, 1984, a, c)], 0.03, 0.01)
    assert three.per_step_s == pytest.approx(a) and three.per_output_token_s == pytest.approx(c)
    # Batched CPU as if every token paid the whole batch-1 figure: nothing is per step.
    flat = split_decode_live([one, DecodeClass(70, 496, 496 * (a + c), 1.0)], 0.03, 0.01)
    assert flat.per_step_s == pytest.approx(0.0, abs=1e-9)
    assert flat.per_output_token_s == pytest.approx(a + c)
    # Everything faster than the passes: both held at 0, said.
    faster = split_decode_live(
        [DecodeClass(992, 992, -0.7, 10.0), DecodeClass(143, 992, -0.1, 3.0)], 0.03, 0.01
    )
    assert (faster.per_step_s, faster.per_output_token_s) == (0.0, 0.0)
    assert faster.clipped == ("per step held at 0 (noise)", "per token held at 0 (noise)")


def test_a_batch1_class_below_its_passes_no_longer_zeroes_the_terms() -> None:
    """The twenty-second round's PD profile (docs/fidelity.md): one request at a time the decode
    node spent 0.75 ms a token less than the profile's passes (992 tokens against 10.4 s of
    passes: 7%), while 8 at once it spent 0.73 s beyond its passes (143 steps, 992 tokens; about
    1.6 s of passes: its 2.674 CPU s less that and the requests' fixed costs). Solved exactly
    from the two, the batch-1 figure was floored and both terms stored 0; weighed by the noise
    of the passes each is read against, the batched class's cost stays in the terms."""
    batch1 = DecodeClass(992, 992, -0.0007529 * 992, 32 * 0.3262)
    batch8 = DecodeClass(143, 992, 0.7264, 1.6)
    split = split_decode_live([batch1, batch8], 0.03, 0.01)
    assert split.per_output_token_s > 0.0
    charged = split.per_step_s * 143 + split.per_output_token_s * 992
    assert charged == pytest.approx(0.7264, rel=0.15)


def test_classes_that_cannot_tell_a_step_from_a_token_are_refused() -> None:
    with pytest.raises(ValueError, match="do not tell a step from a token"):
        split_decode_live([_cls(992, 992, 0.004, 0.001), _cls(31, 31, 0.004, 0.001)], 0.03, 0.01)
    with pytest.raises(ValueError, match="at least a token a step"):
        split_decode_live([_cls(10, 5, 0.004, 0.001), _cls(31, 31, 0.004, 0.001)], 0.03, 0.01)


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="two or more batch sizes"):
        split_decode_overhead({1: 0.001}, 0.002)
    with pytest.raises(ValueError, match="batch sizes must be >= 1"):
        split_decode_overhead({0: 0.001, 4: 0.002}, 0.002)
    with pytest.raises(ValueError, match="per_token_at_batch1_s"):
        split_decode_overhead({1: 0.001, 4: 0.002}, float("nan"))


def test_a_profile_without_the_per_step_term_warns_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A profile of the previous round (five terms) loads; the warning names the new one."""
    path = tmp_path / "five.yaml"
    dump_profile_file(_profile(), path)
    data = yaml.safe_load(path.read_text())
    del data["plumbing"]["decode_per_step_s"]
    path.write_text(yaml.safe_dump(data))
    profile_costs._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="prfaas.perf"):
        cm = cost_model_from_profile_file(path)
    assert cm.plumbing.missing == ("decode_per_step_s",) and cm.plumbing.decode_per_step_s == 0.0
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "decode_per_step_s" in messages[0]
    assert "decode_per_output_token_s" not in messages[0]


def _finish_times(tmp_path: Path, plumbing: PlumbingCosts, num_requests: int) -> list[float]:
    """Finish times of ``num_requests`` short prompts sent at once to one PD site (they decode
    together in one batch)."""
    path = tmp_path / f"p{num_requests}-{plumbing.decode_per_step_s}.yaml"
    dump_profile_file(_profile(plumbing), path)
    sc = SimScenario(
        sites=(SimSite("pd", "pd", str(path), 1, 1),), model="tiny", policy="local_only",
        prefix_cache=False, duration_s=1e6, prefill_token_budget=1_000_000,
    )  # fmt: skip
    sim = Simulator(sc, iter([SimRequestSpec(i, 0.0, 64, 40) for i in range(num_requests)]))
    done: list[float] = []
    sim.on_finish = lambda r: done.append(r.finish_s)
    sim.run()
    return sorted(done)


def test_the_step_term_is_charged_once_per_step_not_per_request(tmp_path: Path) -> None:
    """Same batch-1 figure, charged as one per-token term (the previous round) or split: alone a
    request decodes in the same time; eight decoding together finish sooner with the split, by
    about 7 x the per-step term per step (the batch's step pays it once, not eight times)."""
    batch1, step = 0.005, 0.004
    whole = PlumbingCosts(decode_per_output_token_s=batch1, missing=())
    split = PlumbingCosts(decode_per_output_token_s=batch1 - step, decode_per_step_s=step,
                          missing=())  # fmt: skip
    assert _finish_times(tmp_path, whole, 1) == pytest.approx(_finish_times(tmp_path, split, 1))
    eight_whole, eight_split = _finish_times(tmp_path, whole, 8), _finish_times(tmp_path, split, 8)
    saved = eight_whole[-1] - eight_split[-1]
    # 40 output tokens: at most 40 steps of the full batch, each cheaper by 7 x step.
    assert 0.8 * 40 * 7 * step < saved <= 40 * 7 * step + 1e-9


def test_the_context_cost_is_the_overhead_s_growth_per_batch_context_token() -> None:
    k = 1.5e-6
    overheads = {(b, c): 0.001 + 0.0002 * b + k * b * c for b in (1, 8) for c in (64, 1024)}
    assert context_cost(overheads) == pytest.approx(k)
    # Noise that shrinks the overhead with context: stored as 0.
    assert context_cost({(8, 64): 0.002, (8, 1024): 0.001}) == 0.0
    with pytest.raises(ValueError, match="two or more contexts"):
        context_cost({(1, 64): 0.001, (8, 64): 0.002})


def test_the_prefill_nodes_terms_are_a_least_squares_line_over_its_classes() -> None:
    """Two sizes: their difference, as before; three: the line through them, weighted by each
    class's uncertainty (its profiled passes'), so the long class's noise moves the slope and
    not the per-request term; a negative slope is noise: 0, with the weighted mean."""
    two = line_fit({64: 0.005, 4096: 0.005 + 4032 * 2e-6})
    assert two == pytest.approx((0.005 - 64 * 2e-6, 2e-6))
    exact = {n: 0.004 + 1e-6 * n for n in (64, 1024, 4096)}
    assert line_fit(exact) == pytest.approx((0.004, 1e-6))
    sigma = {64: 0.001, 1024: 0.002, 4096: 0.01}
    assert line_fit(exact, sigma) == pytest.approx((0.004, 1e-6))
    # The long class 10 ms low (within its passes' noise): unweighted, the intercept follows it
    # up; weighted, it stays near the short class's figure.
    low = {**exact, 4096: exact[4096] - 0.01}
    assert abs(line_fit(low, sigma)[0] - 0.004) < abs(line_fit(low)[0] - 0.004)
    # A profile of 2026-12-05: 6.0, 1.6 and -8.4 ms beyond the passes at 64, 1,024, 4,096.
    measured = {64: 0.00596, 1024: 0.00157, 4096: -0.00835}
    intercept, slope = line_fit(measured, {64: 0.000625, 1024: 0.0019, 4096: 0.0098})
    assert slope == 0.0 and 0.004 < intercept < 0.006
    with pytest.raises(ValueError, match="two or more"):
        line_fit({64: 0.01})
