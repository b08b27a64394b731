"""``Assembly``: the receiver's pure bookkeeping for one session.

It owns the consumer's buffers (one writable view per manifest layer), hands out the exact slice a
chunk's payload may be written to (after checking range and overlap, *before* a payload byte is
written), records each chunk's MAC verdict (bytes that failed it abort the session: they are in
the consumer's buffer but never counted, never handed over), tracks layer completion and END, and
verifies the chunk count and session digest. Errors come out as ``SessionAborted`` with a code
and a readable reason; the engine turns them into ABORT frames. Pure: no asyncio, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from prfaas.transfer import frames as F
from prfaas.transfer.errors import AbortCode, SessionAborted
from prfaas.transfer.integrity import Ranges, session_digest
from prfaas.transfer.manifest import Manifest
from prfaas.transfer.session_state import SessionState, advance


class Assembly:
    def __init__(self, session_id: int, manifest: Manifest) -> None:
        self.session_id = session_id
        self.manifest = manifest
        self.state = SessionState.OPENING
        self.buffers: tuple[memoryview, ...] = ()
        self._ranges = Ranges(manifest.layer_bytes())
        self._records: list[tuple[int, int, int]] = []
        self._end: F.End | None = None
        self._layer_bytes = manifest.layer_bytes()
        self._total_bytes = sum(self._layer_bytes)
        # Claimed ranges (``_ranges``) are reserved when a chunk's meta arrives, before its payload;
        # completion counts only bytes whose MAC was verified.
        self._verified_per_layer = [0] * manifest.num_layers
        self.verified_bytes = 0

    def accept(self, buffers: Sequence[object]) -> None:
        """Take the consumer's buffers: one per layer, writable, exactly the layer's size."""
        views = []
        for i, (buf, layer) in enumerate(zip(buffers, self.manifest.layers, strict=False)):
            try:
                view = memoryview(buf).cast("B")  # type: ignore[arg-type]
            except TypeError as exc:
                raise self._fail(AbortCode.INTERNAL, f"buffer {i} is not a buffer: {exc}") from None
            if view.readonly or len(view) != layer.num_bytes:
                raise self._fail(
                    AbortCode.INTERNAL,
                    f"allocate gave layer {i} a {'read-only ' if view.readonly else ''}"
                    f"buffer of {len(view)} bytes, needs {layer.num_bytes}",
                )
            views.append(view)
        if len(views) != self.manifest.num_layers:
            raise self._fail(
                AbortCode.INTERNAL,
                f"allocate returned {len(buffers)} buffers for {self.manifest.num_layers} layers",
            )
        self.buffers = tuple(views)
        self.state = advance(self.state, SessionState.STREAMING)

    def sink(self, chunk: F.Chunk) -> memoryview:
        """Where ``chunk``'s payload goes. Raises SessionAborted (PROTOCOL) if it may not land."""
        if self.state not in (SessionState.STREAMING, SessionState.ENDED):
            raise self._fail(AbortCode.PROTOCOL, f"chunk in session state {self.state.value}")
        why = self._ranges.check(chunk.layer, chunk.offset, chunk.length)
        if why is not None:
            raise self._fail(AbortCode.PROTOCOL, why)
        self._ranges.claim(chunk.layer, chunk.offset, chunk.length)
        return self.buffers[chunk.layer][chunk.offset : chunk.offset + chunk.length]

    def chunk_arrived(self, chunk: F.Chunk, valid: bool) -> bool:
        """Record the chunk (``valid``: its MAC matched, as the codec computed while the bytes
        landed). True if it completed its layer."""
        if not valid:
            raise self._fail(
                AbortCode.CHECKSUM,
                f"chunk MAC mismatch in layer {chunk.layer} bytes "
                f"[{chunk.offset}, {chunk.offset + chunk.length}): changed on the wire (or sent "
                "under another key); none of the session is used",
            )
        self._records.append((chunk.layer, chunk.offset, chunk.length))
        self.verified_bytes += chunk.length
        self._verified_per_layer[chunk.layer] += chunk.length
        return self.layer_full(chunk.layer)

    def end(self, end: F.End) -> None:
        if self.state is not SessionState.STREAMING:
            raise self._fail(AbortCode.PROTOCOL, f"END in session state {self.state.value}")
        self._end = end
        self.state = advance(self.state, SessionState.ENDED)

    def layer_full(self, layer: int) -> bool:
        """Every byte of ``layer`` arrived and passed its chunk's MAC."""
        return self._verified_per_layer[layer] == self._layer_bytes[layer]

    @property
    def first_token(self) -> int:
        return -1 if self._end is None else self._end.first_token

    def try_verify(self) -> bool:
        """After END and full coverage: check the count and digest. True once VERIFIED."""
        if self.state is not SessionState.ENDED or self._end is None:
            return False
        if self.verified_bytes != self._total_bytes:
            return False
        if len(self._records) != self._end.num_chunks:
            raise self._fail(
                AbortCode.DIGEST,
                f"received {len(self._records)} chunks, the sender sent {self._end.num_chunks}",
            )
        if session_digest(self._records) != self._end.digest:
            raise self._fail(AbortCode.DIGEST, "session digest mismatch")
        self.state = advance(self.state, SessionState.VERIFIED)
        return True

    def abort(self) -> None:
        if not self.state.terminal:
            self.state = advance(self.state, SessionState.ABORTED)

    def _fail(self, code: AbortCode, reason: str) -> SessionAborted:
        self.abort()
        return SessionAborted(code, f"request {self.manifest.request_id}: {reason}")
