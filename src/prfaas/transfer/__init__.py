"""prfaas.transfer: move one request's KV cache between nodes, layer by layer, verified.

Public API (everything else is internal; docs/transfer.md has the guide, docs/wire-format.md the
bytes):

Sending side (prefill worker)::

    manifest = Manifest.from_layout(request_id, cache_spec.layout(num_tokens, num_cached_tokens))
    async with await Link.connect(host, port, TransferConfig(psk=key)) as link:  # N connections
        async with link.session(manifest) as session:      # OPEN; raises SessionAborted(REFUSED)
            await session.send(layer, offset, view)        # any byte range, as soon as computed
            await session.finish(first_token)              # END + digest; returns once verified

Receiving side (decode worker)::

    def allocate(manifest) -> list[buffer]: ...            # one writable buffer per layer, or
                                                           # raise Refused("over KV budget")
    async with Receiver(TransferConfig(psk=key), allocate) as rx:
        await rx.listen(host, port)
        session = await rx.next_session()
        await session.layer(i)                             # layer i's bytes checksum-verified
        delivery = await session.complete()                # whole session verified (digest)

``view`` is any C-contiguous buffer (bytes, bytearray, memoryview, numpy array; a CPU torch tensor
via ``t.view(torch.uint8).numpy()``); it is referenced, not copied, until ``finish`` returns.
Buffers from ``allocate`` are written in place and must not be touched until ``complete()``
returns or the session aborts.

Errors: ``SessionAborted`` (``.code``: ``AbortCode``, ``.reason``, ``.by_peer``), ``ConnectError``,
``Refused``; the codec raises only ``ProtocolError`` subclasses. ``LinkMonitor`` turns a link's
counters and ``TCP_INFO`` into ``prfaas.core.LinkState`` snapshots. ``Link.in_memory(receiver,
config)`` runs the same engine without sockets (tests).

Layering: codec, frames, manifest, integrity, assembly, pacing, session_state are pure (no asyncio,
no I/O); channel, sender, receiver, monitor are the asyncio engine. Nothing here imports torch.
"""

from prfaas.transfer.config import DEFAULT_NUM_CONNECTIONS, TransferConfig
from prfaas.transfer.errors import (
    AbortCode,
    AuthenticationFailed,
    ConnectError,
    FrameTooLarge,
    ProtocolError,
    Refused,
    SessionAborted,
    TransferError,
)
from prfaas.transfer.manifest import LayerEntry, Manifest, TensorEntry
from prfaas.transfer.monitor import CongestionRule, LinkMonitor
from prfaas.transfer.receiver import Delivery, InboundSession, Receiver
from prfaas.transfer.sender import Link, LinkCounters, OutboundSession
from prfaas.transfer.session_state import SessionState

__all__ = [
    "DEFAULT_NUM_CONNECTIONS",
    "AbortCode",
    "AuthenticationFailed",
    "CongestionRule",
    "ConnectError",
    "Delivery",
    "FrameTooLarge",
    "InboundSession",
    "LayerEntry",
    "Link",
    "LinkCounters",
    "LinkMonitor",
    "Manifest",
    "OutboundSession",
    "ProtocolError",
    "Receiver",
    "Refused",
    "SessionAborted",
    "SessionState",
    "TensorEntry",
    "TransferConfig",
    "TransferError",
]
