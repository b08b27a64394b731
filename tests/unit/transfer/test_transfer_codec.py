"""The sans-I/O codec: handshake, MAC on every later frame, pre-auth bounds, round trips at every
split point, limits, state table, fuzz."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.spec import get_model
from prfaas.transfer import frames as F
from prfaas.transfer.codec import PRE_AUTH_BUFFER_BYTES, Authenticated, ChunkReceived, Connection
from prfaas.transfer.conn_state import TRANSITIONS, ConnState, Role
from prfaas.transfer.errors import (
    AbortCode,
    AuthenticationFailed,
    FrameTooLarge,
    IntegrityError,
    LocalProtocolError,
    ProtocolError,
)
from prfaas.transfer.mac import FrameMac, derive_keys
from prfaas.transfer.manifest import Manifest

KEY = b"k" * 32
PEER = b"p" * 16
TAG0 = b"\0" * F.TAG_BYTES


class Sinks:
    """A chunk sink that records what it handed out."""

    def __init__(self) -> None:
        self.calls: list[F.Chunk] = []
        self.bufs: dict[tuple[int, int, int], bytearray] = {}

    def __call__(self, chunk: F.Chunk) -> memoryview:
        self.calls.append(chunk)
        buf = bytearray(chunk.length)
        self.bufs[(chunk.session_id, chunk.layer, chunk.offset)] = buf
        return memoryview(buf)


def pair(
    server_key: bytes = KEY,
    client_key: bytes = KEY,
    sink: Sinks | None = None,
    client_nonce: bytes = b"c" * 16,
) -> tuple[Connection, Connection]:
    client = Connection(Role.INITIATOR, client_key, nonce=client_nonce, peer_id=PEER, name="pf")
    server = Connection(Role.ACCEPTOR, server_key, nonce=b"s" * 16, chunk_sink=sink or Sinks())
    return client, server


def handshake(client: Connection, server: Connection) -> None:
    server.receive_data(client.initiate())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())


def ready_pair(
    sink: Sinks | None = None, client_nonce: bytes = b"c" * 16
) -> tuple[Connection, Connection]:
    client, server = pair(sink=sink, client_nonce=client_nonce)
    handshake(client, server)
    client.events()
    server.events()
    return client, server


def test_handshake_authenticates_both_sides() -> None:
    client, server = pair()
    handshake(client, server)
    assert client.state is ConnState.READY and server.state is ConnState.READY
    assert server.events() == [Authenticated(PEER, "pf")]
    assert isinstance(client.next_event(), Authenticated)
    assert client.authenticated and server.authenticated


def test_wrong_key_is_refused_before_any_chunk() -> None:
    sink = Sinks()
    client, server = pair(client_key=b"x" * 32, sink=sink)
    server.receive_data(client.initiate())
    # The client detects that the server does not know *its* key (mutual authentication) ...
    with pytest.raises(AuthenticationFailed):
        client.receive_data(server.data_to_send())
    # ... and a client that skips the check and sends AUTH with a wrong proof is refused too.
    with pytest.raises(AuthenticationFailed):
        server.receive_data(F.encode_frame(F.Auth(b"\0" * 32)))
    assert server.state is ConnState.FAILED
    assert b"authentication failed" in server.data_to_send()
    assert sink.calls == []


def test_chunk_before_authentication_is_refused_at_its_header() -> None:
    sink = Sinks()
    _, server = pair(sink=sink)
    with pytest.raises(AuthenticationFailed):  # header only: refused before the payload
        server.receive_data(F.encode_frame(F.Chunk(1, 0, 0, 3, TAG0)))
    assert sink.calls == []


# -- before authentication: a small fixed bound -------------------------------------------------
def test_hello_declaring_a_huge_body_is_refused_at_its_header() -> None:
    _, server = pair()
    with pytest.raises(FrameTooLarge, match="HELLO body of 1048576 bytes, limit 98"):
        server.receive_data(F.header(F.FrameType.HELLO, 1 << 20))
    assert server.buffered_bytes <= PRE_AUTH_BUFFER_BYTES


@pytest.mark.parametrize(
    "ftype", [F.FrameType.HELLO, F.FrameType.AUTH, F.FrameType.ABORT, F.FrameType.OPEN]
)
def test_every_frame_type_has_a_body_limit_checked_at_the_header(ftype: F.FrameType) -> None:
    _, server = pair()
    with pytest.raises(FrameTooLarge):
        server.receive_data(F.header(ftype, F.MAX_BODY_BYTES[ftype] + 1))
    assert server.buffered_bytes <= PRE_AUTH_BUFFER_BYTES


def test_pre_auth_buffer_stays_fixed_until_the_peer_proves_the_key() -> None:
    client, server = pair()
    hello = client.initiate()
    server.receive_data(hello[:-1])  # all but the last byte: the codec waits, holding it
    assert server.buffered_bytes == PRE_AUTH_BUFFER_BYTES
    assert F.PRE_AUTH_FRAME_BYTES <= PRE_AUTH_BUFFER_BYTES
    server.receive_data(hello[-1:])
    client.receive_data(server.data_to_send())
    assert server.buffered_bytes == PRE_AUTH_BUFFER_BYTES  # CHALLENGE sent, AUTH not yet in
    server.receive_data(client.data_to_send())
    assert server.authenticated and server.buffered_bytes > PRE_AUTH_BUFFER_BYTES


# -- after authentication: every frame carries a MAC --------------------------------------------
def _manifest() -> Manifest:
    layout = get_model("paper-1t").cache.layout(num_tokens=9, num_cached_tokens=4)
    return Manifest.from_layout("req-1", layout)


_PAYLOADS = {(7, 0, 0): b"hello world", (7, 3, 5): bytes(range(200)), (7, 1, 0): b"x"}


def _session_frames() -> list[tuple[F.Frame, bytes]]:
    out: list[tuple[F.Frame, bytes]] = [(F.Open(7, _manifest()), b"")]
    for (sid, layer, off), payload in _PAYLOADS.items():
        out.append((F.Chunk(sid, layer, off, len(payload)), payload))
    out.append((F.End(7, 3, 123, first_token=42), b""))
    out.append((F.Abort(8, AbortCode.CANCELLED, "é"), b""))
    return out


def _sealed(client: Connection) -> list[bytes]:
    """Each frame of the session as the (authenticated) client puts it on the wire."""
    return [client.send(f, p or None) + p for f, p in _session_frames()]


def _session_stream() -> bytes:
    client, _ = ready_pair()
    return b"".join(_sealed(client))


def _ready_server(sink: Sinks) -> Connection:
    """A server in step with ``_session_stream`` (same nonces, so the same keys)."""
    _, server = ready_pair(sink)
    return server


def _expected() -> list[object]:
    return [
        ("chunk", f.session_id, f.layer, f.offset, f.length, True) if isinstance(f, F.Chunk) else f
        for f, _ in _session_frames()
    ]


def _observed(events: list[object]) -> list[object]:
    def one(e: object) -> object:
        if isinstance(e, ChunkReceived):
            c = e.chunk
            return ("chunk", c.session_id, c.layer, c.offset, c.length, e.valid)
        return e

    return [one(e) for e in events]


def test_round_trip_at_every_split_point() -> None:
    stream = _session_stream()
    for cut in range(len(stream) + 1):
        sink = Sinks()
        server = _ready_server(sink)
        server.receive_data(stream[:cut])
        events = server.events()
        server.receive_data(stream[cut:])
        events += server.events()
        assert _observed(events) == _expected(), cut
        assert {k: bytes(v) for k, v in sink.bufs.items()} == _PAYLOADS


def test_round_trip_byte_by_byte_and_through_get_buffer() -> None:
    stream = _session_stream()
    sink = Sinks()
    server = _ready_server(sink)
    for i in range(len(stream)):
        buf = server.get_buffer()
        buf[0] = stream[i]
        server.buffer_updated(1)
    assert _observed(server.events()) == _expected()
    assert {k: bytes(v) for k, v in sink.bufs.items()} == _PAYLOADS


def test_replies_to_the_sender_are_tagged_and_verified_too() -> None:
    client, server = ready_pair()
    replies = [F.Accept(7), F.Ack(7, 11), F.Complete(7), F.Abort(9, AbortCode.REFUSED, "full")]
    client.receive_data(b"".join(server.send(f) for f in replies))
    assert client.events() == replies
    raw = bytearray(server.send(F.Ack(7, 12)))
    raw[-20] ^= 1  # the acknowledged byte count
    with pytest.raises(IntegrityError, match="ACK frame failed its MAC"):
        client.receive_data(bytes(raw))


def test_any_changed_byte_is_refused_and_nothing_changed_gets_through() -> None:
    """Change each byte of the stream in turn: the codec raises (or, for a length field made
    larger, still waits for the bytes it was promised), and what it reported is exactly the
    original frames, valid (at most one last chunk flagged invalid, right before the error)."""
    stream = _session_stream()
    expected = _expected()
    for i in range(len(stream)):
        raw = bytearray(stream)
        raw[i] ^= 0x41
        server = _ready_server(Sinks())
        try:
            server.receive_data(bytes(raw))
            failed = False
        except ProtocolError:
            failed = True
        got = _observed(server.events())
        if failed and got and isinstance(got[-1], tuple) and got[-1][-1] is False:
            got = got[:-1]  # the chunk whose bytes changed: reported invalid, then the error
        # Never the whole session: the changed frame and everything after it are not reported.
        assert got == expected[: len(got)] and len(got) < len(expected), i


def test_replayed_reordered_or_dropped_frames_fail_their_mac() -> None:
    client, _ = ready_pair()
    frames = _sealed(client)
    variants = {
        "replayed": [*frames[:2], frames[1], *frames[2:]],
        "reordered": [frames[0], frames[2], frames[1], *frames[3:]],
        "dropped": [frames[0], *frames[2:]],
    }
    for name, seq in variants.items():
        server = _ready_server(Sinks())
        with pytest.raises(IntegrityError):
            server.receive_data(b"".join(seq))
        assert all(not isinstance(e, F.End) for e in server.events()), name


def test_frames_of_another_connection_fail_their_mac() -> None:
    other_client, _ = ready_pair(client_nonce=b"o" * 16)  # same key, other nonces
    server = _ready_server(Sinks())
    with pytest.raises(IntegrityError):
        server.receive_data(_sealed(other_client)[0])
    assert server.events() == []


def test_mac_keys_depend_on_the_key_both_nonces_and_the_direction() -> None:
    base = derive_keys(KEY, b"c" * 16, b"s" * 16, PEER)
    assert base.initiator_to_acceptor != base.acceptor_to_initiator
    for other in (
        derive_keys(b"K" * 32, b"c" * 16, b"s" * 16, PEER),
        derive_keys(KEY, b"C" * 16, b"s" * 16, PEER),
        derive_keys(KEY, b"c" * 16, b"S" * 16, PEER),
        derive_keys(KEY, b"c" * 16, b"s" * 16, b"q" * 16),
    ):
        assert other.initiator_to_acceptor != base.initiator_to_acceptor
    assert base.initiator_to_acceptor.hex() not in repr(base)  # keys never reach a log


def test_attacker_rewriting_a_payload_byte_and_recomputing_what_it_can_is_refused() -> None:
    """An active attacker without the key rewrites a payload byte and recomputes every value it
    can: the unkeyed checksum of wire version 1 (xxh3 of meta and payload), or a GMAC under keys
    derived from the nonces it saw in the clear and a guessed key. The chunk is flagged invalid
    and the connection fails: its bytes are never reported verified."""
    client, _ = ready_pair()
    payload = bytearray(b"KV cache bytes " * 20)
    chunk = F.Chunk(1, 0, 0, len(payload))
    wire = bytearray(client.send(chunk, payload))
    head, meta = bytes(wire[: F.HEADER_BYTES]), bytes(wire[F.HEADER_BYTES : F.HEADER_BYTES + 24])
    payload[3] ^= 0x01
    guess = derive_keys(b"attacker-guess-0123", b"c" * 16, b"s" * 16, PEER)
    mac = FrameMac(guess.initiator_to_acceptor)
    mac.next_seq = 0  # the first frame after the handshake
    stream = mac.stream()
    for part in (head, meta, payload):
        stream.update(part)
    forged_tags = {
        "xxh3": xxhash.xxh3_64(meta + bytes(payload)).digest() + b"\0" * 8,
        "gmac-guessed-key": stream.tag(),
    }
    for name, tag in forged_tags.items():
        sink = Sinks()
        server = _ready_server(sink)
        forged = bytes(wire[: F.HEADER_BYTES + 24]) + tag + bytes(payload)
        with pytest.raises(IntegrityError, match="failed its MAC"):
            server.receive_data(forged)
        (event,) = server.events()
        assert isinstance(event, ChunkReceived) and not event.valid, name
        assert server.state is ConnState.FAILED


def test_large_payload_goes_straight_into_the_sink() -> None:
    sink = Sinks()
    client, server = ready_pair(sink)
    payload = bytes(range(256)) * 4096  # 1 MiB
    server.receive_data(client.send(F.Chunk(1, 0, 0, len(payload)), payload) + payload[:100])
    view = server.get_buffer()
    # After the first bytes, the codec hands out the destination itself: no intermediate copy.
    target = sink.bufs[(1, 0, 0)]
    assert view.obj is target and len(view) == len(payload) - 100
    view[:] = payload[100:]
    server.buffer_updated(len(view))
    assert bytes(target) == payload
    event = server.next_event()
    assert isinstance(event, ChunkReceived) and event.valid


def test_payload_of_an_aborted_session_stops_landing_mid_chunk() -> None:
    sink = Sinks()
    client, server = ready_pair(sink)
    payload = b"\xff" * 100_000
    stream = client.send(F.Chunk(3, 0, 0, len(payload)), payload) + payload
    server.receive_data(stream[:50_000])
    server.discard_payload_of(4)  # another session: no effect
    server.receive_data(stream[50_000:60_000])
    server.discard_payload_of(3)
    server.receive_data(stream[60_000:])
    target = sink.bufs[(3, 0, 0)]
    written = 60_000 - F.HEADER_BYTES - F.CHUNK_META_BYTES
    assert target[:written] == payload[:written] and not any(target[written:])
    (event,) = server.events()
    # The discarded rest still counted towards the MAC: the frame was genuine.
    assert isinstance(event, ChunkReceived) and event.sink is None and event.valid


def test_discarded_chunk_keeps_the_stream_in_step() -> None:
    client, server = ready_pair()
    server.chunk_sink = lambda chunk: None
    payload = b"z" * 1_000_000
    server.receive_data(client.send(F.Chunk(1, 0, 0, len(payload)), payload) + payload)
    server.receive_data(client.send(F.End(1, 1, 0)))
    events = server.events()
    assert isinstance(events[0], ChunkReceived) and events[0].sink is None and events[0].valid
    assert events[1] == F.End(1, 1, 0)


def _sealed_raw(client: Connection, ftype: F.FrameType, body: bytes) -> bytes:
    """A frame with an arbitrary body, correctly tagged by ``client`` (a peer with the key that
    sends something malformed)."""
    covered = F.header(ftype, len(body) + F.TAG_BYTES) + body
    assert client._tx_mac is not None
    return covered + client._tx_mac.tag(covered)


V = F.VERSION
BAD_STREAMS: list[tuple[str, Callable[[Connection], bytes], type[Exception]]] = [
    ("chunk over the limit", lambda c: F.header(
        F.FrameType.CHUNK, F.CHUNK_META_BYTES + F.MAX_CHUNK_BYTES + 1), FrameTooLarge),
    ("open over the limit", lambda c: F.header(
        F.FrameType.OPEN, F.MAX_CONTROL_BODY_BYTES + 1), FrameTooLarge),
    ("ack over its limit", lambda c: F.header(F.FrameType.ACK, 33), FrameTooLarge),
    ("chunk without payload", lambda c: F.header(F.FrameType.CHUNK, F.CHUNK_META_BYTES),
     ProtocolError),
    ("unknown type", lambda c: struct.pack("<2sBBI", b"PK", V, 99, 0), ProtocolError),
    ("bad magic", lambda c: struct.pack("<2sBBI", b"XX", V, 4, 0), ProtocolError),
    ("wire version 1", lambda c: struct.pack("<2sBBI", b"PK", 1, 4, 0), ProtocolError),
    ("newer version", lambda c: struct.pack("<2sBBI", b"PK", V + 1, 4, 0), ProtocolError),
    # READY is acceptor -> initiator only
    ("ready to the acceptor", lambda c: F.encode_frame(F.Ready()), ProtocolError),
    ("untagged ack", lambda c: F.header(F.FrameType.ACK, 3) + b"abc", ProtocolError),
    ("untagged end", lambda c: F.encode_frame(F.End(1, 1, 0)), IntegrityError),
    ("truncated ack", lambda c: _sealed_raw(c, F.FrameType.ACK, b"abc"), ProtocolError),
    ("abort reason over 512", lambda c: _sealed_raw(
        c, F.FrameType.ABORT, struct.pack("<QHH", 1, 1, 600)), FrameTooLarge),
    ("manifest of 60000 layers", lambda c: _sealed_raw(
        c, F.FrameType.OPEN,
        struct.pack("<QH", 1, 3) + b"req" + struct.pack("<IIH", 10, 0, 60000)), FrameTooLarge),
]  # fmt: skip


@pytest.mark.parametrize(("name", "make", "exc"), BAD_STREAMS, ids=[b[0] for b in BAD_STREAMS])
def test_bad_headers_and_bodies(
    name: str, make: Callable[[Connection], bytes], exc: type[Exception]
) -> None:
    sink = Sinks()
    client, server = ready_pair(sink)
    with pytest.raises(exc):
        server.receive_data(make(client))
    assert sink.calls == []
    assert server.state is ConnState.FAILED
    with pytest.raises(ProtocolError):
        server.get_buffer()


def test_sender_cannot_send_out_of_state() -> None:
    client, _ = pair()
    with pytest.raises(LocalProtocolError):
        client.send(F.Open(1, _manifest()))
    _, server = pair()
    with pytest.raises(LocalProtocolError):
        server.initiate()


def test_transition_table_has_no_path_around_authentication() -> None:
    # Nothing but the handshake frames is accepted before READY, in either role.
    for (role, state, _direction, ftype), _nxt in TRANSITIONS.items():
        if state is not ConnState.READY:
            assert ftype in {
                F.FrameType.HELLO,
                F.FrameType.CHALLENGE,
                F.FrameType.AUTH,
                F.FrameType.READY,
            }, (role, state, ftype)


def test_connection_abort_closes() -> None:
    client, server = ready_pair()
    server.receive_data(client.send(F.Abort(0, AbortCode.SHUTDOWN, "bye")))
    assert server.state is ConnState.CLOSED
    assert server.events() == [F.Abort(0, AbortCode.SHUTDOWN, "bye")]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400), authed=st.booleans(), role=st.sampled_from(list(Role)))
def test_fuzz_only_protocol_errors_escape(data: bytes, authed: bool, role: Role) -> None:
    sink = Sinks()
    client, server = pair(sink=sink)
    if authed:
        handshake(client, server)
    conn = server if role is Role.ACCEPTOR else client
    try:
        conn.receive_data(data)
    except ProtocolError:
        return


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_fuzz_mutated_valid_streams(data: st.DataObject) -> None:
    raw = bytearray(_session_stream())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    server = _ready_server(Sinks())
    try:
        server.receive_data(raw[:cut])
        server.receive_data(raw[cut:])
    except ProtocolError:
        return
