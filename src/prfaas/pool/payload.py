"""``Payload``: what a placed prefill needs beyond what admission decides on (``docs/pool.md``).

The front door's API keeps it from an accepted submit until the placement driver sends the prefill
to a pool node: the prompt's tokens, the decode side's sampling (the node computes the first
token), what the tenant's decode node already holds, and the tenant key id the KV link to the
tenant's receiver authenticates with (the key the submit was signed with). ``FrontDoor`` and the
admission policy never see it: they decide on lengths and costs only.
"""

from __future__ import annotations

from dataclasses import dataclass

from prfaas.serve.node.messages import SamplingMsg


@dataclass(frozen=True, slots=True)
class Payload:
    tenant: str
    request_id: str
    key_id: str
    """The tenant key the submit was signed with: the KV link to its receiver uses it too."""
    tokens: str
    """The prompt's token ids, ``serve.node.messages.pack_tokens``-encoded."""
    sampling: SamplingMsg
    receiver_cached_tokens: int = 0
    decode_recomputes_last_token: bool = False

    @property
    def num_tokens(self) -> int:
        """The prompt's length, from the packed text's length (4 bytes a token, base64)."""
        return (len(self.tokens) * 3 // 4 - self.tokens[-2:].count("=")) // 4
