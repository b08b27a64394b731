"""Tokenizers as the gateway sees them, chat rendering, and incremental detokenization.

A tokenizer is anything with ``encode(str) -> list[int]`` and ``decode(list[int]) -> str`` (a
Hugging Face tokenizer fits). ``ByteTokenizer`` is a dependency-free one (UTF-8 bytes are the ids)
for tests and emulated deployments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

REPLACEMENT_CHAR = "\ufffd"


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class ByteTokenizer:
    """Token id = UTF-8 byte (0..255); ``eos_token_id`` 256. Ids above 255 decode to nothing."""

    vocab_size = 257
    eos_token_id = 256
    chat_template = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")


def render_chat(
    tokenizer: Any, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
) -> list[int]:
    """Token ids of a chat prompt, by default ready for the assistant's answer.

    With a Hugging Face chat template: ``apply_chat_template(..., tokenize=False)`` then
    ``encode``. Without one: one line per message, ``"<role>: <content>\\n"``, then
    ``"assistant:"`` (when ``add_generation_prompt``).
    """
    if getattr(tokenizer, "chat_template", None) and hasattr(tokenizer, "apply_chat_template"):
        text = tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return list(tokenizer.encode(text))
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    if add_generation_prompt:
        text += "assistant:"
    return list(tokenizer.encode(text))


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting a character.

    Decodes a short window (``prefix_offset:``) per step, so a long answer costs O(tokens), and
    holds text back while it ends in U+FFFD (an incomplete multi-byte character), like vLLM.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_ids: Sequence[int]) -> str:
        self._ids.extend(token_ids)
        prefix = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT_CHAR):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (at the end of generation)."""
        prefix = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._tokenizer.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full[len(prefix) :]
