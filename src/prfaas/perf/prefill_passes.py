"""``pass_ends``: where the torch engine ends the forward passes of one request's prefill.

It ends a pass at every block boundary of the prompt when it checkpoints the prefix (it copies
the linear and sliding-window states there for the prefix store), and, while requests decode in
the same engine, after at most ``chunk_tokens`` tokens. One implementation for the engine that
cuts its passes and for ``prfaas profile --pass-tokens``, which times the same passes (a
profile's curve then prices a prefill as the engine runs it).

Pure: no I/O, no clock; imports nothing from prfaas.
"""

from __future__ import annotations


def pass_ends(start: int, end: int, block: int | None, chunk_tokens: int | None) -> list[int]:
    """Where each pass of a prefill of tokens ``[start, end)`` ends: every block boundary (when
    checkpointing, ``block``), and no pass longer than ``chunk_tokens`` (None: no limit)."""
    marks = [] if block is None else list(range((start // block + 1) * block, end, block))
    ends: list[int] = []
    prev = start
    for mark in [*marks, end]:
        while chunk_tokens is not None and mark - prev > chunk_tokens:
            prev += chunk_tokens
            ends.append(prev)
        ends.append(mark)
        prev = mark
    return ends
