"""A prefill handed back by a node under a spot notice is routed again as new: counted as
``retries_total{reason="prefill_handed_back"}``, not as one of the request's real failures (so a
real failure after it is still retried), and the node is skipped until its next report."""

from __future__ import annotations

import pytest
from gateway_fakes import FakeNodes, Script, make_dispatcher, request

pytestmark = pytest.mark.timeout(30)


async def test_a_handed_back_prefill_is_no_failure_of_the_request() -> None:
    # pf0 hands it back; the next try (p0, local: pf0 is skipped) fails for real; one real
    # failure is retried (on p1), so the request still completes.
    nodes = FakeNodes({"pf0": Script(prefill="hand_back"), "p0": Script(prefill="fail")})
    d, reg = make_dispatcher(nodes)
    events = [e async for e in d.generate(request("r", 100))]
    assert events[-1].finish_reason == "length"
    prefills = [c[0] for c in nodes.calls if c[1] == "prefill"]
    assert prefills == ["pf0", "p0", "p1"]
    text = d.metrics.render().decode()
    assert 'prfaas_retries_total{reason="prefill_handed_back"} 1.0' in text
    assert reg.rotation("pf0")[0] is False  # skipped until its next report
