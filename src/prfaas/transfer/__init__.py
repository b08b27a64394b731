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
        await session.layer(i)                             # layer i's bytes MAC-verified
        delivery = await session.complete()                # whole session verified (digest)

``view`` is any C-contiguous buffer (bytes, bytearray, memoryview, numpy array; a CPU torch tensor
via ``t.view(torch.uint8).numpy()``); it is referenced, not copied, until ``finish`` returns.
Buffers from ``allocate`` are written in place and must not be touched until ``complete()``
returns or the session aborts.

Errors: ``SessionAborted`` (``.code``: ``AbortCode``, ``.reason``, ``.by_peer``), ``ConnectError``,
``Refused``; the codec raises only ``ProtocolError`` subclasses. ``LinkMonitor`` turns a link's
counters and ``TCP_INFO`` into ``prfaas.core.LinkState`` snapshots. ``Link.in_memory(receiver,
config)`` runs the same engine without sockets (tests).

Layering: codec, frames, manifest, integrity, assembly, pacing, session_state, config, errors are
pure (no asyncio, no I/O) and importing them (or their names from here) loads no asyncio; channel,
sender, receiver, monitor are the asyncio engine, loaded on first use. Nothing imports torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Lazy exports (PEP 562): importing a pure submodule (``prfaas.transfer.codec``) or a pure name
# (``Manifest``) must not pull in asyncio; the engine loads on first use of an engine name.
_EXPORTS = {
    "DEFAULT_NUM_CONNECTIONS": "config",
    "TransferConfig": "config",
    "AbortCode": "errors",
    "AuthenticationFailed": "errors",
    "ConnectError": "errors",
    "FrameTooLarge": "errors",
    "ProtocolError": "errors",
    "Refused": "errors",
    "SessionAborted": "errors",
    "TransferError": "errors",
    "LayerEntry": "manifest",
    "Manifest": "manifest",
    "TensorEntry": "manifest",
    "CongestionRule": "monitor",
    "LinkMonitor": "monitor",
    "Delivery": "inbound",
    "InboundSession": "inbound",
    "Receiver": "receiver",
    "Link": "sender",
    "LinkCounters": "sender",
    "OutboundSession": "outbound",
    "SessionState": "session_state",
}

if TYPE_CHECKING:
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
    from prfaas.transfer.inbound import Delivery, InboundSession
    from prfaas.transfer.manifest import LayerEntry, Manifest, TensorEntry
    from prfaas.transfer.monitor import CongestionRule, LinkMonitor
    from prfaas.transfer.outbound import OutboundSession
    from prfaas.transfer.receiver import Receiver
    from prfaas.transfer.sender import Link, LinkCounters
    from prfaas.transfer.session_state import SessionState


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prfaas.transfer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"prfaas.transfer.{module}"), name)
    globals()[name] = value
    return value


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
