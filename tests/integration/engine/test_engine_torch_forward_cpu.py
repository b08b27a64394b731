"""engine.torch's ``forward_cpu_s``: the engine thread's CPU in the model's forward passes alone,
what a node reports so that ``prfaas profile`` reads the rest of its CPU beyond the passes on the
same requests: it grows with prefills and decode steps, stays within the thread's slices
(``engine_cpu_s``), and leaves out the layer hand-out hooks that run inside a pass."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from engine_helpers import prompt

from prfaas.engine import LayerOutput, PrefillRequest, SamplingParams
from prfaas.engine.torch import LoadedModel, TorchEngine
from prfaas.engine.torch.forward_clock import ForwardClock
from prfaas.engine.torch.prefill import PrefillJob

Loaded = Callable[[str, str], LoadedModel]
HOOK_CPU_S = 0.05


@pytest.mark.timeout(60)
def test_forward_cpu_grows_with_passes_within_the_slices(loaded: Loaded) -> None:
    engine = TorchEngine(loaded("qwen3_next", "fp32"))
    try:
        assert engine.forward_cpu_s == 0.0
        sampling = SamplingParams(max_new_tokens=6, ignore_eos=True)
        engine.start(engine.prefill(PrefillRequest("a", prompt(1, 200), sampling)), sampling)
        after_prefill = engine.forward_cpu_s
        assert after_prefill > 0.0
        while engine.num_running:
            engine.step()
        assert engine.forward_cpu_s > after_prefill  # the decode steps' passes
        # Sampling, cache copies and the step's gather are slices' work beyond the passes.
        assert engine.forward_cpu_s <= engine.engine_cpu_s
    finally:
        engine.close()


def _burning_hook(out: LayerOutput) -> None:
    start = time.thread_time()
    while time.thread_time() - start < HOOK_CPU_S:
        pass


@pytest.mark.timeout(60)
def test_the_layer_hand_out_is_left_out_of_the_pass(loaded: Loaded) -> None:
    model = loaded("qwen3_next", "fp32")
    totals = {}
    for name, hook in (("quiet", lambda out: None), ("burning", _burning_hook)):
        clock = ForwardClock()
        req = PrefillRequest(name, prompt(2, 128), SamplingParams(max_new_tokens=1))
        job = PrefillJob(model, req, 4096, None, hook, clock)
        while not job.done:
            job.run_chunk()
        totals[name] = clock.total_s
    num_layers = len(model.cmap.model_layers)
    # Counted, the burning hooks would add num_layers x HOOK_CPU_S (0.2 s and more).
    assert totals["burning"] < totals["quiet"] + 0.5 * num_layers * HOOK_CPU_S, totals
