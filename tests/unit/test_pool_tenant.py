"""A tenant gateway's side of the pool (``pool/tenant.py``), against a fake front door: the pool is
the gateway's PrfaaS site of one node; a prefill for it is a submit whose outcome is awaited; a
refusal, an unreachable or silent pool, a new epoch or a failed prefill raises (the dispatcher
then prefills locally), each fallback counted by reason."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prfaas.config import load_deployment
from prfaas.pool.client import Accepted, Feedback, PoolUnreachable, Refusal
from prfaas.pool.tenant import POOL_NODE, POOL_SITE, TenantPoolLink, with_pool_site
from prfaas.serve.gateway.node_client import NodeCallFailed
from prfaas.serve.node.messages import PrefillCommand, SamplingMsg, pack_tokens

pytestmark = pytest.mark.timeout(30)

TENANT = """
engine: {kind: timed, model: paper-1t}
sites:
  - name: pd-a
    kind: pd
    hardware: h20
    nodes: [{name: a-p0, role: prefill}, {name: a-d0, role: decode}]
pool:
  url: http://127.0.0.1:9
  tenant: tenant-a
  key: {id: a-1, env: PRFAAS_TEST_POOL_KEY}
  link: {gbps: 40, rtt_ms: 20}
"""


class FakeDoor:
    def __init__(self, submit: Any, outcomes: list[Any]) -> None:
        self._submit = submit
        self._outcomes = outcomes
        self.bodies: list[dict[str, Any]] = []
        self.aborted: list[str] = []

    async def submit(self, body: dict[str, Any]) -> Any:
        self.bodies.append(body)
        if isinstance(self._submit, Exception):
            raise self._submit
        return self._submit

    async def outcome(self, request_id: str) -> Any:
        out = self._outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return out

    async def abort(self, request_id: str) -> Any:
        self.aborted.append(request_id)
        return {"epoch": 7, "request_id": request_id, "state": "aborted"}

    async def aclose(self) -> None:
        pass


@pytest.fixture
def link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TenantPoolLink:
    monkeypatch.setenv("PRFAAS_TEST_POOL_KEY", "k" * 32)
    path = tmp_path / "tenant.yaml"
    path.write_text(TENANT)
    d = with_pool_site(load_deployment(path))
    out = TenantPoolLink(d, registry=None, metrics=CollectorRegistry())  # type: ignore[arg-type]
    out.session.heard(7, time.monotonic())
    return out


def _cmd() -> PrefillCommand:
    return PrefillCommand(
        request_id="r1", tokens=pack_tokens([3] * 700), decode_node="a-d0",
        decode_host="127.0.0.1", decode_transfer_port=1, cross_site=True,
        receiver_cached_tokens=200, sampling=SamplingMsg(max_new_tokens=2),
    )  # fmt: skip


def _counts(link: TenantPoolLink, name: str) -> dict[str, float]:
    counter = link.fallbacks if name == "fallbacks" else link.offloads
    return {s.labels[next(iter(s.labels))]: s.value for m in counter.collect()
            for s in m.samples if s.name.endswith("_total")}  # fmt: skip


def test_the_pool_is_a_prfaas_site_of_one_node(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("PRFAAS_TEST_POOL_KEY", "k" * 32)
    path = tmp_path / "tenant.yaml"
    path.write_text(TENANT)
    d = with_pool_site(load_deployment(path))
    site = d.sites[-1]
    assert (site.name, site.kind, [n.name for n in site.nodes]) == (
        POOL_SITE,
        "prfaas",
        [POOL_NODE],
    )
    link = d.links[-1]
    assert (link.src, link.dst, link.gbps, link.rtt_ms) == (POOL_SITE, "pd-a", 40, 20)


async def test_accepted_then_done(link: TenantPoolLink) -> None:
    door = FakeDoor(Accepted(7, "g", 0.0), [
        {"epoch": 7, "state": "queued"}, {"epoch": 7, "state": "running"},
        {"epoch": 7, "state": "done"},
    ])  # fmt: skip
    link.client = door  # type: ignore[assignment]
    out = await link.prefill(_cmd())
    assert out.ok and out.request_id == "r1"
    body = door.bodies[0]
    assert body["num_uncached_tokens"] == 500 and body["receiver"] == "a-d0"
    assert body["session"] == "r1" and body["tenant"] == "tenant-a"
    assert _counts(link, "offloads") == {"accepted": 1.0, "done": 1.0}
    assert _counts(link, "fallbacks") == {}


@pytest.mark.parametrize(
    ("submit", "outcomes", "reason", "kind"),
    [
        (Refusal(7, 429, "over_rate_cap", "too fast", 0.5), [], "refused:over_rate_cap",
         "rejected"),
        (PoolUnreachable("down"), [], "pool_unreachable", "unreachable"),
        (Accepted(7, "g", 0.0), [{"epoch": 8, "state": "queued"}], "epoch_changed", "rejected"),
        (Accepted(7, "g", 0.0), [Refusal(None, 404, "unknown_request", "", None)],
         "epoch_changed", "rejected"),
        (Accepted(7, "g", 0.0), [{"epoch": 7, "state": "failed", "reason": "node_lost"}],
         "failed:node_lost", "rejected"),
        (Accepted(7, "g", 0.0), [{"epoch": 7, "state": "aborted", "reason": "lease_expired"}],
         "failed:lease_expired", "rejected"),
    ],
)  # fmt: skip
async def test_fallbacks_are_counted_by_reason(
    link: TenantPoolLink, submit: Any, outcomes: list[Any], reason: str, kind: str
) -> None:
    link.client = FakeDoor(submit, outcomes)  # type: ignore[assignment]
    with pytest.raises(NodeCallFailed) as exc:
        await link.prefill(_cmd())
    assert exc.value.kind == kind and exc.value.node == POOL_NODE
    assert _counts(link, "fallbacks") == {reason: 1.0}


async def test_a_silent_pool_is_not_asked(link: TenantPoolLink) -> None:
    link.session.last_heard_s = time.monotonic() - 60
    door = FakeDoor(Accepted(7, "g", 0.0), [])
    link.client = door  # type: ignore[assignment]
    with pytest.raises(NodeCallFailed):
        await link.prefill(_cmd())
    assert door.bodies == [] and _counts(link, "fallbacks") == {"pool_silent": 1.0}


async def test_a_client_gone_aborts_its_prefill_at_the_pool(link: TenantPoolLink) -> None:
    import asyncio

    from prfaas.pool.tenant import PoolNodeClient
    from prfaas.serve.node.messages import NodeEndpoint

    door = FakeDoor(Accepted(7, "g", 0.0), [{"epoch": 7, "state": "queued"}] * 100)
    link.client = door  # type: ignore[assignment]
    nodes = PoolNodeClient(inner=None, link=link)  # type: ignore[arg-type]
    ep = NodeEndpoint(node=POOL_NODE, site=POOL_SITE, role="prefill", host="h", http_port=1)
    task = asyncio.create_task(nodes.prefill(ep, _cmd()))
    await asyncio.sleep(0.3)  # accepted, waiting for its outcome
    task.cancel()  # the dispatcher, when the request's client goes away...
    with pytest.raises(asyncio.CancelledError):
        await task
    await nodes.abort(ep, "r1")  # ...then aborts it where it runs
    assert door.aborted == ["r1"]
    assert _counts(link, "offloads") == {"accepted": 1.0, "aborted": 1.0}
    assert _counts(link, "fallbacks") == {}  # not a fallback: nobody waits for it


async def test_a_decode_node_newer_than_the_last_registration_is_registered_before_its_submit(
    link: TenantPoolLink,
) -> None:
    """Right after start-up the lease loop may have registered no receiver yet (the decode node
    registered here after its last beat): the prefill registers it first instead of being
    refused ``receiver_not_registered`` and going local (seen in CI)."""
    from types import SimpleNamespace

    calls: list[str] = []

    class Door(FakeDoor):
        async def register(self, receivers: list[dict[str, Any]], link: Any = None) -> Any:
            calls.append("register:" + ",".join(r["name"] for r in receivers))
            calls.append(f"link:{link}")  # the tenant file's own link, told with its receivers
            return {"epoch": 7, "registered": [r["name"] for r in receivers]}

        async def feedback(self) -> Any:
            return Feedback(7, "tenant-a", 0.0, 1.0, 1.0, 0, 0)

        async def submit(self, body: dict[str, Any]) -> Any:
            calls.append("submit")
            return await super().submit(body)

    endpoint = SimpleNamespace(node="a-d0", host="127.0.0.1", role="decode", pool_transfer_port=9)
    link.registry = SimpleNamespace(  # type: ignore[assignment]
        endpoints={"a-d0": endpoint}, heartbeat=lambda beat, now: True
    )
    link._registered, link._epoch_registered = (), 7  # the first beat found no decode node
    link.client = Door(Accepted(7, "g", 0.0), [{"epoch": 7, "state": "done"}])  # type: ignore[assignment]
    out = await link.prefill(_cmd())
    assert out.ok and calls == ["register:a-d0", "link:(40.0, 20.0)", "submit"]
    assert _counts(link, "fallbacks") == {}


def test_the_feedback_parses_with_its_link_and_from_an_older_door_without() -> None:
    base = {"epoch": 7, "tenant": "tenant-a", "expected_queueing_s": 0.5, "entitled_share": 0.5,
            "attainable_share": 0.75, "queued_tokens": 10, "running": 1}  # fmt: skip
    old = Feedback.from_json(base)
    assert old.link is None and old.link_backlog_s == 0.0 and old.running == 1
    reading = {"pace_gbps": 40.0, "capacity_gbps": 32.0, "basis": "measured", "backlog_bytes": 5,
               "rtt_s": 0.02, "retransmit_rate": 0.0, "num_senders": 1}  # fmt: skip
    new = Feedback.from_json({**base, "link_backlog_s": 0.25,
                              "link": {"gbps": 40, "rtt_ms": 20, "reading": reading}})  # fmt: skip
    assert new.link is not None and new.link.reading is not None
    assert (new.link.gbps, new.link.reading.capacity_gbps, new.link_backlog_s) == (40, 32, 0.25)
    with pytest.raises(ValueError, match="running"):
        Feedback.from_json({k: v for k, v in base.items() if k != "running"})


async def test_a_done_offload_carries_what_the_pools_node_found(link: TenantPoolLink) -> None:
    """The door's done outcome says the KV bytes its node sent and the prompt tokens it found in
    the tenant's prefixes there: both reach the gateway's outcome (its route log, the ``pool``
    site's hit rate), as a PrfaaS node's own outcome does."""
    link.client = FakeDoor(Accepted(7, "g", 0.0), [  # type: ignore[assignment]
        {"epoch": 7, "state": "done", "kv_bytes_sent": 4096, "cached_tokens": 512},
    ])  # fmt: skip
    out = await link.prefill(_cmd())
    assert out.ok and (out.kv_bytes_sent, out.num_cached_tokens) == (4096, 512)
