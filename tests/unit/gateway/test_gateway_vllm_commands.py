"""The prefill command says whether the decode node runs the last prompt token itself: set when the
decode node's site is a vLLM site (its connector installs all but that token of a hybrid model),
so a prfaas prefill node of another site sends what that server can install."""

from __future__ import annotations

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
