"""The sans-I/O codec: handshake, round trips at every split point, limits, state table, fuzz."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prfaas.spec import get_model
from prfaas.transfer import frames as F
from prfaas.transfer.codec import (
    TRANSITIONS,
    Authenticated,
    ChunkReceived,
    Connection,
    ConnState,
    Role,
)
from prfaas.transfer.errors import (
    AbortCode,
    AuthenticationFailed,
    FrameTooLarge,
    LocalProtocolError,
    ProtocolError,
)
from prfaas.transfer.integrity import make_chunk
from prfaas.transfer.manifest import Manifest

KEY = b"k" * 32
PEER = b"p" * 16


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
    server_key: bytes = KEY, client_key: bytes = KEY, sink: Sinks | None = None
) -> tuple[Connection, Connection]:
    client = Connection(Role.INITIATOR, client_key, nonce=b"c" * 16, peer_id=PEER, name="pf")
    server = Connection(Role.ACCEPTOR, server_key, nonce=b"s" * 16, chunk_sink=sink or Sinks())
    return client, server


def handshake(client: Connection, server: Connection) -> None:
    server.receive_data(client.initiate())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())


def test_handshake_authenticates_both_sides() -> None:
    client, server = pair()
    handshake(client, server)
    assert client.state is ConnState.READY and server.state is ConnState.READY
    assert server.events() == [Authenticated(PEER, "pf")]
    assert isinstance(client.next_event(), Authenticated)


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
    chunk = make_chunk(1, 0, 0, b"abc")
    with pytest.raises(AuthenticationFailed):
        server.receive_data(F.encode_frame(chunk))  # header only: refused before the payload
    assert sink.calls == []


def _manifest() -> Manifest:
    layout = get_model("paper-1t").cache.layout(num_tokens=9, num_cached_tokens=4)
    return Manifest.from_layout("req-1", layout)


def _session_stream() -> tuple[bytes, list[object], dict[tuple[int, int, int], bytes]]:
    frames: list[F.Frame] = [F.Open(7, _manifest())]
    payloads = {(7, 0, 0): b"hello world", (7, 3, 5): bytes(range(200)), (7, 1, 0): b"x"}
    stream = bytearray(F.encode_frame(frames[0]))
    for (sid, layer, off), payload in payloads.items():
        chunk = make_chunk(sid, layer, off, payload)
        frames.append(chunk)
        stream += F.encode_frame(chunk) + payload
    tail: list[F.Frame] = [F.End(7, 3, 123, first_token=42), F.Abort(8, AbortCode.CANCELLED, "é")]
    for f in tail:
        stream += F.encode_frame(f)
    frames += tail
    return bytes(stream), frames, payloads


def _ready_server(sink: Sinks) -> Connection:
    client, server = pair(sink=sink)
    handshake(client, server)
    server.events()
    return server


def _expected(frames: list[object]) -> list[object]:
    return [f if not isinstance(f, F.Chunk) else ("chunk", f, True) for f in frames]


def _observed(events: list[object]) -> list[object]:
    return [("chunk", e.chunk, e.valid) if isinstance(e, ChunkReceived) else e for e in events]


def test_round_trip_at_every_split_point() -> None:
    stream, frames, payloads = _session_stream()
    for cut in range(len(stream) + 1):
        sink = Sinks()
        server = _ready_server(sink)
        server.receive_data(stream[:cut])
        events = server.events()
        server.receive_data(stream[cut:])
        events += server.events()
        assert _observed(events) == _expected(frames), cut
        assert {k: bytes(v) for k, v in sink.bufs.items()} == payloads


def test_round_trip_byte_by_byte_and_through_get_buffer() -> None:
    stream, frames, payloads = _session_stream()
    sink = Sinks()
    server = _ready_server(sink)
    for i in range(len(stream)):
        buf = server.get_buffer()
        buf[0] = stream[i]
        server.buffer_updated(1)
    assert _observed(server.events()) == _expected(frames)
    assert {k: bytes(v) for k, v in sink.bufs.items()} == payloads


def test_large_payload_goes_straight_into_the_sink() -> None:
    sink = Sinks()
    server = _ready_server(sink)
    payload = bytes(range(256)) * 4096  # 1 MiB
    chunk = make_chunk(1, 0, 0, payload)
    server.receive_data(F.encode_frame(chunk) + payload[:100])
    view = server.get_buffer()
    # After the first bytes, the codec hands out the destination itself: no intermediate copy.
    target = sink.bufs[(1, 0, 0)]
    assert view.obj is target and len(view) == len(payload) - 100
    view[:] = payload[100:]
    server.buffer_updated(len(view))
    assert bytes(target) == payload
    assert isinstance(server.next_event(), ChunkReceived)


def test_payload_of_an_aborted_session_stops_landing_mid_chunk() -> None:
    sink = Sinks()
    server = _ready_server(sink)
    payload = b"\xff" * 100_000
    stream = F.encode_frame(make_chunk(3, 0, 0, payload)) + payload
    server.receive_data(stream[:50_000])
    server.discard_payload_of(4)  # another session: no effect
    server.receive_data(stream[50_000:60_000])
    server.discard_payload_of(3)
    server.receive_data(stream[60_000:])
    target = sink.bufs[(3, 0, 0)]
    written = 60_000 - F.HEADER_BYTES - F.CHUNK_META_BYTES
    assert target[:written] == payload[:written] and not any(target[written:])
    (event,) = server.events()
    assert isinstance(event, ChunkReceived) and event.sink is None and not event.valid


def test_discarded_chunk_keeps_the_stream_in_step() -> None:
    _, server = pair(sink=None)
    server.chunk_sink = lambda chunk: None
    client, _ = pair()
    handshake(client, server)
    server.events()
    payload = b"z" * 1_000_000
    server.receive_data(F.encode_frame(make_chunk(1, 0, 0, payload)) + payload)
    server.receive_data(F.encode_frame(F.End(1, 1, 0)))
    events = server.events()
    assert isinstance(events[0], ChunkReceived) and events[0].sink is None
    assert events[1] == F.End(1, 1, 0)


@pytest.mark.parametrize(
    ("raw", "exc"),
    [
        (F.header(F.FrameType.CHUNK, F.CHUNK_META_BYTES + F.MAX_CHUNK_BYTES + 1), FrameTooLarge),
        (F.header(F.FrameType.OPEN, F.MAX_CONTROL_BODY_BYTES + 1), FrameTooLarge),
        (F.header(F.FrameType.CHUNK, F.CHUNK_META_BYTES), ProtocolError),
        (struct.pack("<2sBBI", b"PK", 1, 99, 0), ProtocolError),
        (struct.pack("<2sBBI", b"XX", 1, 4, 0), ProtocolError),
        (struct.pack("<2sBBI", b"PK", 2, 4, 0), ProtocolError),
        (F.encode_frame(F.Ready()), ProtocolError),  # READY is acceptor -> initiator only
        (F.header(F.FrameType.ACK, 3) + b"abc", ProtocolError),  # truncated body
        (F.header(F.FrameType.ABORT, 12) + struct.pack("<QHH", 1, 1, 600), FrameTooLarge),
    ],
)
def test_bad_headers_and_bodies(raw: bytes, exc: type[Exception]) -> None:
    sink = Sinks()
    server = _ready_server(sink)
    with pytest.raises(exc):
        server.receive_data(raw)
    assert sink.calls == []
    assert server.state is ConnState.FAILED
    with pytest.raises(ProtocolError):
        server.get_buffer()


def test_oversize_manifest_fields_are_rejected() -> None:
    body = bytearray(struct.pack("<Q", 1))
    body += struct.pack("<H", 3) + b"req" + struct.pack("<IIH", 10, 0, 60000)
    server = _ready_server(Sinks())
    with pytest.raises(FrameTooLarge):
        server.receive_data(F.header(F.FrameType.OPEN, len(body)) + bytes(body))


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
    server = _ready_server(Sinks())
    server.receive_data(F.encode_frame(F.Abort(0, AbortCode.SHUTDOWN, "bye")))
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
    stream, _, _ = _session_stream()
    raw = bytearray(stream)
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
