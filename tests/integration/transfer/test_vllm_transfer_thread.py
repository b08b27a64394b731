"""The vLLM connector's ``TransferThread`` without vLLM (it imports neither torch nor vllm): two
threads over loopback, the sender's sends paced cross-site, asked through its agent socket with
the sidecar's own ``AgentClient``. The capacity estimate of its cross-site links goes from
"configured" to "measured" near the pace while a transfer keeps the pacer busy; ``set_pace``
changes the rate the next transfer is measured at (and starts the estimate afresh); the backlog
figures count a session whole from its opening; bad agent requests are answered, not fatal."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prfaas.core.link_report import SenderLinkReport
from prfaas.integrations.vllm.settings import DEFAULT_LINK, ConnectorSettings
from prfaas.integrations.vllm.transfer_thread import TransferThread
from prfaas.serve.vllm.agent import AgentClient, AgentError, AgentStats
from prfaas.spec import CacheSpec, DType, LayerCache
from prfaas.transfer import Manifest

pytestmark = pytest.mark.timeout(120)

PSK = b"thread-test-key-0123456789"
PACE_GBPS = 0.008
"""1 MB/s: a 2.6 MB session keeps the pacer busy for about 2.6 s (the estimator's spans are
0.5 s, sampled every 0.25 s)."""
SPEC = CacheSpec(tuple(LayerCache.gqa(2, 64, DType.FP32) for _ in range(4)))
"""1 KiB per token per layer."""
PIECE = 64 << 10


@pytest.fixture
def threads(tmp_path: Path) -> Iterator[tuple[TransferThread, TransferThread, AgentClient]]:
    rx = TransferThread(
        ConnectorSettings.from_extra_config({"listen_port": 0, "kv_budget_mib": 64}), PSK, "rx"
    )
    agent = str(tmp_path / "agent.sock")
    tx = TransferThread(
        ConnectorSettings.from_extra_config({"agent_socket": agent, "pace_gbps": PACE_GBPS}),
        PSK,
        "tx",
    )
    started = []
    try:
        for t in (rx, tx):
            t.start()
            started.append(t)
        yield rx, tx, AgentClient(agent)
    finally:
        for t in started:
            t.close()


def _send(tx: TransferThread, rx: TransferThread, tid: str, num_tokens: int) -> int:
    """Open a cross-site session to ``rx`` and hand it every byte at once (as a prefill's layers
    come faster than the pace); returns its bytes."""
    assert rx.listen_address is not None
    host, port = rx.listen_address
    manifest = Manifest.from_layout(tid, SPEC.layout(num_tokens, 0))
    rx.staged.claim(tid, 60.0)
    tx.open_send(tid, host, port, True, manifest)
    for i, layer in enumerate(manifest.layers):
        data = memoryview(bytearray(layer.num_bytes))
        for off in range(0, layer.num_bytes, PIECE):
            tx.send(tid, i, off, data[off : off + PIECE], data)
    tx.finish_send(tid)
    return manifest.num_bytes


async def _stats_until_sent(agent: AgentClient, tid: str, rx: TransferThread) -> list[AgentStats]:
    """The agent's stats every 0.1 s until ``tid`` is verified at both ends."""
    seen = []
    sent = asyncio.create_task(agent.wait_sent(tid, 60.0))
    while not sent.done():
        seen.append(await agent.stats())
        await asyncio.sleep(0.1)
    assert (await sent).state == "verified"
    deadline = time.monotonic() + 30
    while (outcome := rx.staged.poll(tid)) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert outcome is not None and outcome.delivery is not None, outcome
    rx.staged.release(tid, ok=True)
    seen.append(await agent.stats())
    return seen


async def test_paced_transfers_are_measured_and_set_pace_changes_the_next_ones_rate(
    threads: tuple[TransferThread, TransferThread, AgentClient],
) -> None:
    rx, tx, agent = threads
    pace = PACE_GBPS * 1e9 / 8
    first = (await agent.stats()).link(DEFAULT_LINK)
    assert first is not None and first.basis == "configured"
    assert first.capacity_bytes_per_s == pytest.approx(pace)
    assert first.pace_bytes_per_s == pytest.approx(pace)
    size = _send(tx, rx, "t1", 640)
    seen = await _stats_until_sent(agent, "t1", rx)
    # While it crossed, the session counted whole from its opening: what the sender had not
    # accepted yet, plus what it had accepted and the receiver not yet acknowledged.
    assert max(s.cross_site_unsent_bytes + _link(s).backlog_bytes for s in seen) > size / 2
    last = seen[-1]
    assert last.cross_site_bytes == size and last.cross_site_unsent_bytes == 0
    assert _link(last).backlog_bytes == 0
    measured = [_link(s) for s in seen if _link(s).basis == "measured"]
    assert measured, [_link(s).basis for s in seen]
    estimate = measured[-1].capacity_bytes_per_s
    assert 0.7 * pace <= estimate <= pace  # never above the pace, at most 30% below it
    # Four times the pace: the estimate starts afresh from the new rate, then measures it.
    assert await agent.set_pace(4 * PACE_GBPS) == pytest.approx(4 * PACE_GBPS)
    reset = _link(await agent.stats())
    assert reset.basis == "configured" and reset.pace_bytes_per_s == pytest.approx(4 * pace)
    assert reset.capacity_bytes_per_s == pytest.approx(4 * pace)
    _send(tx, rx, "t2", 4 * 640)
    seen = await _stats_until_sent(agent, "t2", rx)
    measured = [_link(s) for s in seen if _link(s).basis == "measured"]
    assert measured, [_link(s).basis for s in seen]
    faster = measured[-1].capacity_bytes_per_s
    assert 0.7 * 4 * pace <= faster <= 4 * pace and faster > 2 * estimate


def _link(stats: AgentStats) -> SenderLinkReport:
    reading = stats.link(DEFAULT_LINK)
    assert reading is not None, stats
    return reading


async def test_one_receiver_reached_across_sites_and_within_gets_two_connections(
    threads: tuple[TransferThread, TransferThread, AgentClient],
) -> None:
    """The pool keys links by route: a receiver reached cross-site and in-site gets a paced and
    an unpaced connection, and the in-site send does not flip the cross-site one's pacing (it
    used to: one link per (host, port), paced as its latest use said)."""
    rx, tx, agent = threads
    assert rx.listen_address is not None
    host, port = rx.listen_address
    manifest = Manifest.from_layout("in", SPEC.layout(64, 0))
    rx.staged.claim("in", 60.0)
    tx.open_send("in", host, port, False, manifest)
    for i, layer in enumerate(manifest.layers):
        data = memoryview(bytearray(layer.num_bytes))
        tx.send("in", i, 0, data, data)
    tx.finish_send("in")
    assert (await agent.wait_sent("in", 30.0)).state == "verified"
    _send(tx, rx, "cross", 64)
    assert (await agent.wait_sent("cross", 30.0)).state == "verified"
    pool = tx._pool
    cross, local = pool.links(DEFAULT_LINK), pool.links(None)
    assert len(cross) == 1 and len(local) == 1 and cross[0] is not local[0]
    assert cross[0].rate_bytes_per_s == pytest.approx(PACE_GBPS * 1e9 / 8)
    assert local[0].rate_bytes_per_s is None  # within the site: never paced
    for tid in ("in", "cross"):
        rx.staged.release(tid, ok=True)


async def test_bad_agent_requests_are_answered_and_the_connection_goes_on(
    threads: tuple[TransferThread, TransferThread, AgentClient],
) -> None:
    _, _, agent = threads
    reader, writer = await asyncio.open_unix_connection(agent.path)
    try:
        for req, needle in (
            ({"op": "set_pace", "gbps": 0}, "gbps must be finite and > 0"),
            ({"op": "set_pace", "gbps": True}, "gbps must be a number"),
            ({"op": "set_pace"}, "gbps must be a number"),
            ([1, 2], "expected a JSON object"),
            ({"op": "teleport", "transfer_id": "x"}, "known: wait_sent, abort, stats, set_pace"),
        ):
            writer.write(json.dumps(req).encode() + b"\n")
            answer = json.loads(await reader.readline())
            assert needle in answer["error"], (req, answer)
        writer.write(b'{"op": "stats"}\n')
        assert "links" in json.loads(await reader.readline())  # still served
    finally:
        writer.close()
    with pytest.raises(AgentError, match="gbps"):
        await agent.set_pace(-1.0)
    paced = _link(await agent.stats()).pace_bytes_per_s  # unchanged by the refused calls
    assert paced == pytest.approx(PACE_GBPS * 1e9 / 8)


def test_closing_ends_an_idle_agent_connection_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sidecar's connection waiting in ``readline`` when the Worker shuts down: it used to be
    left pending and reported by asyncio ("Task was destroyed but it is pending!")."""
    import gc
    import socket

    agent = str(tmp_path / "agent.sock")
    thread = TransferThread(ConnectorSettings.from_extra_config({"agent_socket": agent}), PSK)
    thread.start()
    idle = socket.socket(socket.AF_UNIX)
    try:
        idle.connect(agent)
        idle.sendall(b'{"op": "stats"}\n')
        assert b"links" in idle.recv(65536)  # served, then left open and idle
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            thread.close()
            del thread
            gc.collect()
        assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
        assert idle.recv(1) == b""  # the agent closed its end
    finally:
        idle.close()
