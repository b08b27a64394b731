"""Pure parts of the transfer package: pacing, congestion rule, ranges, manifests, layering."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prfaas.core import LinkId
from prfaas.spec import get_model
from prfaas.transfer import Manifest, TransferConfig
from prfaas.transfer.integrity import Ranges, session_digest
from prfaas.transfer.monitor import CongestionRule, LinkSample, link_state
from prfaas.transfer.pacing import TokenBucket
from prfaas.transfer.session_state import SessionState, advance


def test_token_bucket_holds_the_rate() -> None:
    bucket = TokenBucket(rate_bytes_per_s=1000.0, burst_bytes=100.0, now_s=0.0)
    assert bucket.reserve(100, 0.0) == 0.0  # the burst is free
    assert bucket.reserve(500, 0.0) == pytest.approx(0.5)  # then debt: wait for it
    # Reservations after waiting: the long-run rate is the configured one.
    now, sent = 0.5, 0
    for _ in range(100):
        now += bucket.reserve(50, now)
        sent += 50
    assert sent / (now - 0.5) == pytest.approx(1000.0, rel=0.05)


def test_token_bucket_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        TokenBucket(0.0, 1.0, 0.0)


def _sample(at: float, acked: int, backlog: int = 0, retrans: int = 0, segs: int = 0,
            rtt: float = 0.05, min_rtt: float = 0.05) -> LinkSample:  # fmt: skip
    return LinkSample(at, acked, backlog, retrans, segs, rtt, min_rtt)


def test_link_state_arithmetic_and_congestion_rule() -> None:
    rule = CongestionRule()
    prev = _sample(0.0, 0)
    calm = link_state(LinkId("a->b"), 1e8, prev, _sample(1.0, 9e7, segs=1000), rule)
    assert calm.goodput_bytes_per_s == 9e7 and calm.utilisation == pytest.approx(0.9)
    assert not calm.congested
    lossy = link_state(LinkId("a->b"), 1e8, prev, _sample(1.0, 9e7, retrans=30, segs=1000), rule)
    assert lossy.retransmit_rate == pytest.approx(0.03) and lossy.congested
    queued = link_state(LinkId("a->b"), 1e8, prev, _sample(1.0, 9e7, rtt=0.09), rule)
    assert queued.congested  # 40 ms above a 50 ms min_rtt > max(20 ms, 25 ms)
    backlog = link_state(LinkId("a->b"), 1e8, prev, _sample(1.0, 9e7, backlog=2 * 10**8), rule)
    assert backlog.drain_time_s() == pytest.approx(2.0) and backlog.congested


def test_ranges_reject_overlap_and_track_coverage() -> None:
    r = Ranges((10, 4))
    r.claim(0, 0, 4)
    r.claim(0, 6, 4)
    assert r.check(0, 3, 2) is not None and r.check(0, 5, 2) is not None
    assert r.check(0, 4, 2) is None and r.check(1, 0, 5) is not None and r.check(2, 0, 1)
    r.claim(0, 4, 2)
    assert r.layer_full(0) and r.missing() == [(1, 4)]


def test_digest_ignores_arrival_order_but_not_content() -> None:
    recs = [(0, 0, 4), (0, 4, 4), (1, 0, 8)]
    assert session_digest(recs) == session_digest(reversed(recs))
    assert session_digest(recs) != session_digest([(0, 0, 4), (0, 4, 4), (1, 0, 7)])


def test_manifest_from_cache_spec_layout() -> None:
    spec = get_model("paper-1t").cache
    m = Manifest.from_layout("r", spec.layout(1000, 400))
    assert m.num_bytes == spec.transfer_bytes(1000, 400)
    assert m.num_layers == spec.num_layers
    with pytest.raises(ValueError, match="request_id"):
        Manifest("", 1, 0, m.layers)


def test_a_manifest_carries_its_model_fingerprint_across_the_wire() -> None:
    from prfaas.transfer import frames as F

    spec = get_model("paper-1t").cache
    fp = (("block_tokens", "512"), ("config", "paper-1t"), ("weights_digest", "ab" * 8))
    m = Manifest.from_layout("r", spec.layout(1000, 400), fp)
    back = F.decode_body(F.FrameType.OPEN, memoryview(F.encode_body(F.Open(7, m))))
    assert isinstance(back, F.Open) and back.manifest == m and back.manifest.fingerprint == fp
    bare = Manifest.from_layout("r", spec.layout(1000, 400))  # a sender that states none
    back = F.decode_body(F.FrameType.OPEN, memoryview(F.encode_body(F.Open(7, bare))))
    assert isinstance(back, F.Open) and back.manifest.fingerprint == ()
    with pytest.raises(ValueError, match="at most 16 fields"):
        Manifest.from_layout("r", spec.layout(10, 0), tuple((f"f{i}", "") for i in range(17)))
    with pytest.raises(ValueError, match=r"fingerprint\.config"):
        Manifest.from_layout("r", spec.layout(10, 0), (("config", "x" * 129),))


def test_fingerprints_differ_by_their_first_stated_field() -> None:
    from prfaas.core.fingerprint import as_fingerprint, first_difference

    pool = {"config": "m", "block_tokens": "512", "weights_digest": "aa"}
    assert first_difference(pool, dict(pool)) is None
    other = {**pool, "weights_digest": "bb"}
    assert first_difference(pool, other) == ("weights_digest", "bb", "aa")
    assert first_difference(pool, {"config": "m"}) == ("weights_digest", None, "aa")
    assert first_difference({"config": "m"}, pool) is None  # what is not stated is not compared
    assert as_fingerprint({"b": "2", "a": "1"}) == (("a", "1"), ("b", "2"))


def test_session_state_table() -> None:
    assert advance(SessionState.OPENING, SessionState.STREAMING) is SessionState.STREAMING
    with pytest.raises(ValueError, match="streaming to verified"):
        advance(SessionState.STREAMING, SessionState.VERIFIED)


def test_config_validation_names_the_value() -> None:
    with pytest.raises(ValueError, match="psk"):
        TransferConfig(psk=b"short")
    with pytest.raises(ValueError, match="num_connections"):
        TransferConfig(psk=b"k" * 16, num_connections=0)
    with pytest.raises(ValueError, match="handshake_timeout_s"):
        TransferConfig(psk=b"k" * 16, handshake_timeout_s=0)
    with pytest.raises(ValueError, match="max_pending_handshakes"):
        TransferConfig(psk=b"k" * 16, max_pending_handshakes=0)


def test_pure_modules_import_neither_asyncio_nor_torch() -> None:
    code = (
        "import sys\n"
        "import prfaas.transfer.codec, prfaas.transfer.assembly, prfaas.transfer.pacing\n"
        "import prfaas.transfer.session_state, prfaas.transfer.integrity, prfaas.transfer.mac\n"
        "from prfaas.transfer import Manifest, TransferConfig, SessionAborted\n"
        "bad = [m for m in ('asyncio', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "from prfaas.transfer import Link\n"  # the engine loads lazily, on first use
        "assert 'asyncio' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
