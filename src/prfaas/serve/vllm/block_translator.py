"""``BlockTranslator``: what one vLLM server's prefix cache holds, in prfaas's terms, from its KV
cache events (``kv_event_codec``), as a ``StoreJournal`` for the sidecar's heartbeats.

vLLM names a cached block by its own chained hash (sha256 over the parent's hash and the block's
tokens, ``block_size`` tokens a block); prfaas names a prefix by the chained hash of its last
block (``serve/gateway/hashing.py``: blake2b over int64 token ids, ``block_tokens`` a block).
The two cannot be converted, but a ``BlockStored`` event carries each block's parent and tokens,
so the translator keeps, per vLLM block, its own tokens, where it ends (tokens from the prompt's
start) and the prfaas chain digest at the last prfaas boundary at or before that end: enough to
continue the prfaas chain into a child block without keeping whole prompts. A vLLM prefix that
ends exactly on a prfaas boundary (block ``k``, ``k * block_tokens`` tokens) is reported as the
prfaas entry (hash of block ``k``, ``k * block_tokens``): a prompt sharing those tokens finds
exactly that many in vLLM's cache. With unequal block sizes only the common multiples are
entries (vLLM block 128, prfaas 512: every 4th vLLM block; vLLM 48, prfaas 32: every 96 tokens).

vLLM finds a prefix only while every block of it is cached, so a block counts (is *attached*)
only while its whole chain back to the prompt's first block is known: a removed block detaches
every longer prefix through it (their entries are reported evicted), and a block stored again
re-attaches the cached blocks that continue it. Blocks of another KV cache group (a second
group means sliding-window or hybrid layers, whose hits need every group), with LoRA or extra
keys (multimodal features, cache salt), or in an offload tier are never entries: prfaas cannot
tell when a prompt would hit them. Memory is bounded: at most ``max_blocks`` vLLM blocks (the
oldest stored first out, as if vLLM had evicted them), and the journal is replaced by a
snapshot once it outgrows one (``serve/node/prefix_store.py`` does the same).

Pure: no I/O, no clock, no asyncio; the epoch is passed in. Must not import vllm or zmq.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prfaas.cache.mirror import MAX_CHANGES_PER_REPORT, ReportAck, StoreJournal, StoreReport
from prfaas.serve.vllm.kv_event_codec import (
    AllBlocksCleared,
    BlockKey,
    BlockRemoved,
    BlockStored,
    KvEvent,
)

DEFAULT_MAX_BLOCKS = 65536
"""vLLM blocks tracked at most (each keeps its tokens: 8 bytes a token)."""
TOKEN_BYTES = 8


def prfaas_key(digest: bytes) -> int:
    """A prfaas block hash from its chain digest (as ``serve/gateway/hashing.block_hashes``)."""
    return int.from_bytes(digest, "big") >> 1


def chain(prev: bytes, block: bytes) -> bytes:
    """The next prfaas chain digest: ``block`` is the block's token ids as little-endian int64
    (``serve/gateway/hashing.block_hashes``; ``tests/unit/test_vllm_block_translator.py`` holds
    the two equal)."""
    h = hashlib.blake2b(prev, digest_size=8)
    h.update(block)
    return h.digest()


def token_bytes(token_ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(token_ids)}q", *token_ids)


@dataclass(slots=True)
class _Block:
    parent: BlockKey | None
    tokens: bytes
    """This block's own token ids, little-endian int64."""
    placed: bool = False
    """``end``, ``digest`` and ``entry`` are known (once its chain was known: they depend on the
    block's tokens and its ancestors' only, i.e. on its vLLM hash, and never change)."""
    end: int = 0
    digest: bytes = b""
    """The prfaas chain digest after prfaas block ``end // block_tokens`` (b"" before block 1)."""
    entry: int | None = None
    """The prfaas hash this block's end names, when it ends on a prfaas boundary."""
    attached: bool = False
    """Its whole chain is cached: vLLM would hit this block's prefix."""

    @property
    def num_tokens(self) -> int:
        return len(self.tokens) // TOKEN_BYTES


@dataclass(frozen=True, slots=True)
class TranslatorStats:
    num_blocks: int
    num_attached: int
    num_entries: int
    disabled: str


class BlockTranslator:
    """One vLLM server lifetime's prefix cache as prfaas entries. ``apply`` events in the
    publisher's order; ``clear`` when events were lost (the server's state is then unknown: the
    mirror starts again from nothing, which never claims a block vLLM lacks)."""

    def __init__(
        self,
        block_tokens: int,
        epoch: int,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        max_changes_per_report: int = MAX_CHANGES_PER_REPORT,
    ) -> None:
        if block_tokens <= 0 or max_blocks <= 0:
            raise ValueError(
                f"need block_tokens > 0 and max_blocks > 0, got {block_tokens}, {max_blocks}"
            )
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[BlockKey, _Block] = OrderedDict()
        """vLLM hash -> block, oldest stored first."""
        self._children: dict[BlockKey, set[BlockKey]] = {}
        """vLLM hash -> the known blocks whose parent it is (also while it is not known)."""
        self._entries: dict[int, tuple[int, int]] = {}
        """prfaas hash -> (tokens, attached blocks naming it)."""
        self.disabled = ""
        """Why nothing is reported (events of a second KV cache group); "" while translating."""
        self.journal = StoreJournal(epoch, max_changes_per_report)
        self.journal.snapshot(())  # the gateway starts from an empty store
        self.num_cleared = 0

    # -- events -----------------------------------------------------------------------------------
    def apply(self, events: Iterable[KvEvent]) -> None:
        for event in events:
            if self.disabled:
                return
            if isinstance(event, AllBlocksCleared):
                self._forget()
            elif event.group != 0:
                self.disabled = (
                    f"KV cache group {event.group}: a prefix hit needs every group's blocks"
                )
                self._forget()
            elif isinstance(event, BlockStored):
                if event.plain:
                    self._stored(event)
            elif isinstance(event, BlockRemoved) and event.primary:
                for key in event.block_hashes:
                    self._remove(key)
        while len(self._blocks) > self.max_blocks:
            self._remove(next(iter(self._blocks)))
        self._bound_journal()

    def clear(self) -> None:
        """Events were lost: forget everything (a RESET for the gateway)."""
        self.num_cleared += 1
        self._forget()

    def _forget(self) -> None:
        self._blocks.clear()
        self._children.clear()
        self._entries.clear()
        self.journal.snapshot(())

    def _stored(self, event: BlockStored) -> None:
        parent = event.parent
        step = event.block_size * TOKEN_BYTES
        data = token_bytes(event.token_ids)
        for i, key in enumerate(event.block_hashes):
            block = self._blocks.get(key)
            if block is None:
                block = _Block(parent, data[i * step : (i + 1) * step])
                self._blocks[key] = block
                if parent is not None:
                    self._children.setdefault(parent, set()).add(key)
            else:
                self._blocks.move_to_end(key)  # stored again: vLLM's newest too
            self._attach(key)
            parent = key

    def _attach(self, key: BlockKey) -> None:
        """Attach the block if its chain is known, then every waiting block continuing it."""
        todo = [key]
        while todo:
            k = todo.pop()
            block = self._blocks.get(k)
            if block is None or block.attached:
                continue
            parent = None if block.parent is None else self._blocks.get(block.parent)
            if block.parent is not None and (parent is None or not parent.attached):
                continue
            if not block.placed:
                self._place(block, parent)
            block.attached = True
            if block.entry is not None:
                self._add_entry(block.entry, block.end)
            todo.extend(self._children.get(k, ()))

    def _place(self, block: _Block, parent: _Block | None) -> None:
        """Continue the prfaas chain from the parent's last boundary through this block."""
        bt = self.block_tokens
        start = 0 if parent is None else parent.end
        end = start + block.num_tokens
        boundary = start // bt * bt
        data = self._tail(parent, start - boundary) + block.tokens
        digest = b"" if parent is None else parent.digest
        step = bt * TOKEN_BYTES
        for off in range(0, (end - boundary) // bt * step, step):
            digest = chain(digest, data[off : off + step])
        block.end, block.digest, block.placed = end, digest, True
        block.entry = prfaas_key(digest) if end % bt == 0 else None

    def _tail(self, block: _Block | None, num_tokens: int) -> bytes:
        """The last ``num_tokens`` tokens up to the end of ``block`` (attached: its ancestors
        are all known), as bytes."""
        parts: list[bytes] = []
        need = num_tokens
        while need > 0 and block is not None:
            take = min(block.num_tokens, need)
            parts.append(block.tokens[len(block.tokens) - take * TOKEN_BYTES :])
            need -= take
            block = None if block.parent is None else self._blocks.get(block.parent)
        if need > 0:  # cannot happen for an attached block: a broken invariant, not bad input
            raise AssertionError(f"{need} tokens of an attached chain are missing")
        return b"".join(reversed(parts))

    def _remove(self, key: BlockKey) -> None:
        block = self._blocks.pop(key, None)
        if block is None:
            return
        if block.parent is not None and (siblings := self._children.get(block.parent)):
            siblings.discard(key)
            if not siblings:
                del self._children[block.parent]
        todo = [(key, block)] if block.attached else []
        while todo:  # every longer prefix through this block is gone from vLLM's hits
            k, b = todo.pop()
            b.attached = False
            if b.entry is not None:
                self._drop_entry(b.entry)
            for child in self._children.get(k, ()):
                cb = self._blocks.get(child)
                if cb is not None and cb.attached:
                    todo.append((child, cb))

    def _add_entry(self, key: int, tokens: int) -> None:
        _, count = self._entries.get(key, (tokens, 0))
        self._entries[key] = (tokens, count + 1)
        if count == 0:
            self.journal.stored(key, tokens)

    def _drop_entry(self, key: int) -> None:
        tokens, count = self._entries.get(key, (0, 0))
        if count <= 1:
            self._entries.pop(key, None)
            if count == 1:
                self.journal.evicted(key)
        else:
            self._entries[key] = (tokens, count - 1)

    # -- what the sidecar reads -------------------------------------------------------------------
    def entries(self) -> list[tuple[int, int]]:
        """(prfaas hash, tokens) of every prefix vLLM would hit."""
        return [(h, tokens) for h, (tokens, _) in self._entries.items()]

    def cached_tokens(self, block_hashes: Sequence[int], num_prompt_tokens: int) -> int:
        """The longest prefix of this prompt (its prfaas block hashes) the server holds, shorter
        than the prompt (vLLM computes at least its last token)."""
        for k in range(len(block_hashes), 0, -1):
            hit = self._entries.get(block_hashes[k - 1])
            if hit is not None and hit[0] < num_prompt_tokens:
                return hit[0]
        return 0

    def stats(self) -> TranslatorStats:
        attached = sum(1 for b in self._blocks.values() if b.attached)
        return TranslatorStats(len(self._blocks), attached, len(self._entries), self.disabled)

    # -- the journal ------------------------------------------------------------------------------
    def report(self) -> StoreReport:
        return self.journal.report()

    def acknowledge(self, ack: ReportAck) -> None:
        if self.journal.acknowledge(ack):
            self.snapshot()

    def snapshot(self) -> None:
        self.journal.snapshot(self.entries())

    def _bound_journal(self) -> None:
        if self.journal.outgrown(len(self._entries)):
            self.snapshot()
