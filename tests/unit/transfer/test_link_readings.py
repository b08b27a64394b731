"""``transfer.link_readings``: a sender's links as the capacity estimator's readings (shared by the
worker processes' sender links and the vLLM connector's transfer thread). Fake links for the
counters, a real loopback TCP pair for TCP_INFO."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import pytest

from prfaas.transfer.link_readings import (
    SenderLinkEstimator,
    link_reading,
    link_readings,
)
from prfaas.transfer.sender import LinkCounters
from prfaas.transfer.tcpinfo import read_tcp_info

pytestmark = pytest.mark.timeout(60)


@dataclass
class FakeLink:
    peer_id: bytes
    queued: int = 0
    sent: int = 0
    acked: int = 0
    dropped: int = 0
    paced_s: float = 0.0
    blocked_s: float = 0.0
    socks: list[socket.socket] = field(default_factory=list)

    def counters(self) -> LinkCounters:
        return LinkCounters(
            self.queued, self.sent, self.acked, self.dropped, 1,
            pacer_limited_s=self.paced_s, write_blocked_s=self.blocked_s,
        )  # fmt: skip

    def sockets(self) -> list[socket.socket]:
        return self.socks


def test_a_link_in_memory_reads_its_own_counters() -> None:
    link = FakeLink(b"a", queued=10_000, sent=7_000, acked=5_000, dropped=1_000,
                    paced_s=1.5, blocked_s=0.25)  # fmt: skip
    for paced in (True, False):
        r = link_reading(link, paced)
        assert r.bytes_acked == 5_000
        assert r.queue_bytes == 10_000 - 7_000 - 1_000  # accepted, not written, not given up
        assert r.link_limited_s == pytest.approx(1.75)
        assert r.network_queue_bytes == 0 and r.rtt_s == 0.0  # no kernel queue in memory


def test_aborted_bytes_never_make_the_queue_negative() -> None:
    r = link_reading(FakeLink(b"a", queued=100, sent=20, acked=0, dropped=90), paced=False)
    assert r.queue_bytes == 0


def test_readings_are_keyed_by_peer_id() -> None:
    a, b = FakeLink(b"a", acked=1), FakeLink(b"b", acked=2)
    readings = link_readings([a, b], paced=True)
    assert {k: r.bytes_acked for k, r in readings.items()} == {b"a": 1, b"b": 2}


def test_tcp_info_gives_acked_and_unsent_bytes_and_only_an_unpaced_link_counts_the_kernel_queue(
) -> None:  # fmt: skip
    server = socket.create_server(("127.0.0.1", 0))
    tx = socket.socket()
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
    tx.connect(server.getsockname())
    rx, _ = server.accept()
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    tx.setblocking(False)
    try:
        written = 0
        deadline = time.monotonic() + 10
        # Nobody reads: the receiver's window fills, then the kernel keeps the rest unsent.
        while time.monotonic() < deadline:
            try:
                written += tx.send(b"x" * 65536)
            except BlockingIOError:
                info = read_tcp_info(tx)
                if info is not None and info.notsent_bytes > 0:
                    break
                time.sleep(0.01)
        info = read_tcp_info(tx)
        if info is None:
            pytest.skip("no TCP_INFO on this kernel")
        link = FakeLink(b"t", queued=written, sent=written, socks=[tx])
        unpaced, paced = link_reading(link, False), link_reading(link, True)
        assert 0 < unpaced.bytes_acked <= written
        assert unpaced.queue_bytes > 0 and unpaced.network_queue_bytes == unpaced.queue_bytes
        assert paced.network_queue_bytes == 0  # a paced link's bottleneck is its pacer
        assert unpaced.rtt_s > 0
    finally:
        for s in (tx, rx, server):
            s.close()


def test_the_estimate_is_measured_from_a_pacer_limited_span_and_capped_at_the_pace() -> None:
    est = SenderLinkEstimator(1_000_000.0)
    link = FakeLink(b"a")
    first = est.observe(0.0, [link], pace_bytes_per_s=500_000.0)
    assert first.basis == "configured" and first.capacity_bytes_per_s == 500_000.0  # capped
    # One second with the pacer in debt throughout: 400 kB acknowledged.
    link.queued, link.sent, link.acked, link.paced_s = 600_000, 450_000, 400_000, 1.0
    after = est.observe(1.0, [link], pace_bytes_per_s=500_000.0)
    assert after.basis == "measured"
    assert after.capacity_bytes_per_s == pytest.approx(400_000.0)
    assert after.goodput_bytes_per_s == pytest.approx(400_000.0)
    assert after.queue_bytes == 150_000 and after.backlog_bytes == 200_000


def test_an_app_limited_span_does_not_measure_and_a_replaced_link_starts_anew() -> None:
    est = SenderLinkEstimator(1_000_000.0)
    est.observe(0.0, [FakeLink(b"a", acked=10_000_000)], None)
    # The same peer, a new Link (counters from zero) that sent a little with no queue.
    again = est.observe(1.0, [FakeLink(b"b", queued=1_000, sent=1_000, acked=1_000)], None)
    assert again.basis == "configured" and again.goodput_bytes_per_s == 0.0
