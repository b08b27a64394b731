"""The PSK handshake of a KV connection: the proofs each end sends and the frame MACs after it.

HELLO (initiator: peer id, nonce, name) -> CHALLENGE (acceptor: its nonce and proof) -> AUTH
(initiator: its proof) -> READY. Each proof is an HMAC-SHA256 under the pre-shared key over a
role label, both nonces and the initiator's peer id, so neither end can replay the other's; both
then derive per-direction frame MAC keys (``mac.derive_keys``). ``codec.Connection`` runs the
exchange; this module holds no state. Pure: no asyncio, no I/O.
"""

from __future__ import annotations

import hashlib
import hmac

from prfaas.transfer import frames as F
from prfaas.transfer.errors import AuthenticationFailed
from prfaas.transfer.mac import FrameMac, derive_keys

_LABEL = b"prfaas-kv-v2 "

FrameMacs = tuple[FrameMac, FrameMac]
"""(send, receive): the MAC of every frame this end sends and of every frame it receives."""


def proof(psk: bytes, who: bytes, first_nonce: bytes, second_nonce: bytes, peer_id: bytes) -> bytes:
    """HMAC-SHA256 over a role label, both nonces and the initiator's peer id."""
    msg = _LABEL + who + first_nonce + second_nonce + peer_id
    return hmac.new(psk, msg, hashlib.sha256).digest()


def acceptor_challenge(psk: bytes, hello: F.Hello, nonce: bytes) -> F.Challenge:
    """The acceptor's answer to ``hello``: its ``nonce`` and its proof that it knows the key."""
    return F.Challenge(nonce, proof(psk, b"acceptor", hello.nonce, nonce, hello.peer_id))


def initiator_auth(
    psk: bytes, nonce: bytes, peer_id: bytes, challenge: F.Challenge
) -> tuple[F.Auth, FrameMacs]:
    """The initiator's AUTH and its frame MACs, once the acceptor's proof in ``challenge`` checks
    out; ``AuthenticationFailed`` if it does not."""
    expected = proof(psk, b"acceptor", nonce, challenge.nonce, peer_id)
    if not hmac.compare_digest(expected, challenge.proof):
        raise AuthenticationFailed("the acceptor does not know our pre-shared key")
    mine = proof(psk, b"initiator", challenge.nonce, nonce, peer_id)
    keys = derive_keys(psk, nonce, challenge.nonce, peer_id)
    macs = FrameMac(keys.initiator_to_acceptor), FrameMac(keys.acceptor_to_initiator)
    return F.Auth(mine), macs


def initiator_proof_valid(
    psk: bytes, nonce: bytes, peer_nonce: bytes, peer_id: bytes, auth: F.Auth
) -> bool:
    """Whether the initiator's ``auth`` proves the key (``nonce`` is the acceptor's own)."""
    expected = proof(psk, b"initiator", nonce, peer_nonce, peer_id)
    return hmac.compare_digest(expected, auth.proof)


def acceptor_macs(psk: bytes, nonce: bytes, peer_nonce: bytes, peer_id: bytes) -> FrameMacs:
    """The acceptor's frame MACs (``nonce`` is its own, ``peer_nonce`` the initiator's)."""
    keys = derive_keys(psk, peer_nonce, nonce, peer_id)
    return FrameMac(keys.acceptor_to_initiator), FrameMac(keys.initiator_to_acceptor)
