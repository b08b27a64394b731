"""Reader of the Mooncake JSONL trace format (one request per line).

Each line: ``{"timestamp": ms, "input_length": int, "output_length": int, "hash_ids": [int, ...]}``.
``hash_ids`` name the prompt's 512-token blocks; an id identifies its block *and the whole prefix
before it* (equal ids at the same position mean a reusable prefix), which is what the prefix caches
key on. A malformed line raises ``TraceError`` naming the file and line number. This module is the
workload layer's one piece of file I/O.

Lines are read a chunk at a time: those in the traces' own layout (``_CANONICAL``) are parsed all
at once by numpy (``_bulk_values``, which checks they are what ``json`` reads), about twice as fast
as ``json`` per line (whose cost was mostly making the ``hash_ids`` integers); any other line
goes through ``parse_line``. The values, the errors and the line each is raised at are those of
``parse_line`` on every line (``tests/unit/workload``).
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

TRACE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace line that cannot be read; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    line_number: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    block_hashes: tuple[int, ...]


def _int_field(obj: dict[str, object], key: str, where: str, minimum: int) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise TraceError(f"{where}: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


_raw_decode = json.JSONDecoder().raw_decode
_INT_ONLY = frozenset({int})


def _decode(text: str) -> object:
    """``json.loads(text)``, a quarter faster on the usual line (an object, then at most
    whitespace): the decoder's C scanner is called directly, without ``loads``' regex scans for
    whitespace around it. Any other line goes through ``json.loads``: same value, or its error."""
    if text.startswith("{"):
        try:
            obj, end = _raw_decode(text)
        except json.JSONDecodeError:
            pass
        else:
            if end == len(text) or text[end:].isspace():
                return obj
    return json.loads(text)


def parse_line(text: str, where: str | Path, line_number: int) -> TraceRecord:
    """One trace line; ``where`` (the file) and ``line_number`` name it in errors."""
    try:
        obj = _decode(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}:{line_number}: not valid JSON ({exc.msg})") from None
    # Fast path for well-formed lines (a trace has millions); the checks below explain failures.
    if type(obj) is dict:
        ts = obj.get("timestamp")
        num_in = obj.get("input_length")
        num_out = obj.get("output_length")
        hashes = obj.get("hash_ids", [])
        if (
            (type(ts) is int or type(ts) is float)
            and ts >= 0
            and type(num_in) is int
            and num_in >= 1
            and type(num_out) is int
            and num_out >= 0
            and type(hashes) is list
            and set(map(type, hashes)) <= _INT_ONLY
            and (not hashes or min(hashes) >= 0)
        ):
            return TraceRecord(line_number, ts / 1000.0, num_in, max(1, num_out), tuple(hashes))
    return _explain(obj, f"{where}:{line_number}", line_number)


def _explain(obj: object, where: str, line_number: int) -> TraceRecord:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    ts = obj.get("timestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts < 0:
        raise TraceError(f"{where}: 'timestamp' must be a number of ms >= 0, got {ts!r}")
    num_in = _int_field(obj, "input_length", where, 1)
    num_out = _int_field(obj, "output_length", where, 0)
    hashes = obj.get("hash_ids", [])
    if not isinstance(hashes, list) or not set(map(type, hashes)) <= {int}:
        raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
    if hashes and min(hashes) < 0:
        raise TraceError(f"{where}: 'hash_ids' must be >= 0")
    return TraceRecord(line_number, ts / 1000.0, num_in, max(1, num_out), tuple(hashes))


def read_mooncake(path: str | Path, limit: int | None = None) -> Iterator[TraceRecord]:
    """Records of a Mooncake JSONL trace, in file order (blank lines skipped).

    Raises ``TraceError`` for a missing file or a malformed line (with its number), and for
    timestamps that go backwards.
    """
    for row in trace_rows(path, limit):
        yield TraceRecord(*row)


TraceRow = tuple[int, float, int, int, tuple[int, ...]]
"""A ``TraceRecord``'s fields as a plain tuple ``(line_number, arrival_s, num_prompt_tokens,
num_output_tokens, block_hashes)``: what the simulator's own workload reads (a frozen dataclass
per line cost more than the rest of reading it)."""

# The canonical line (as the Mooncake traces are written): keys in this order, one space after
# each separator, integers without leading zeros (at most 18 digits: they fit an int64).
# ``hash_ids`` is only matched here; ``_bulk_values`` checks it, all lines of a chunk at once.
_CANONICAL = re.compile(
    r'\{"timestamp": (0|[1-9][0-9]{0,17}), "input_length": ([1-9][0-9]{0,17}), '
    r'"output_length": (0|[1-9][0-9]{0,17}), "hash_ids": \[([0-9, ]*)\]\}\n?'
)
_POWERS_OF_TEN = np.array([10**i for i in range(1, 19)], dtype=np.int64)
_CHUNK_CHARS = 1 << 18
"""Lines are read about this many characters at a time (a few hundred lines)."""


def _bulk_values(parts: list[str]) -> list[int] | None:
    """The integers of ``parts`` (each one integer, or a ``hash_ids`` list's inside: digits,
    commas and spaces only), parsed in one C call; ``None`` unless every part is exactly what
    ``json`` reads as those integers: separators exactly ``", "``, no empty item, no leading
    zero, none of 19 digits or more. The checks run over the text's bytes, vectorised."""
    text = ", ".join(parts)
    raw = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    comma = raw == 44
    space = raw == 32
    if (
        not np.array_equal(comma[:-1], space[1:])  # each comma then a space, and only there
        or comma[-1]
        or (comma[:-2] & comma[2:]).any()  # ", ,": an empty item
        or (space[:-2] & (raw[1:-1] == 48) & (raw[2:] > 47)).any()  # an item "0<digit>..."
        # (after ", " only: the first part is a timestamp, canonical by ``_CANONICAL``)
    ):
        return None
    try:
        values = np.fromstring(text, dtype=np.int64, sep=",")
    except ValueError:
        return None
    num_items = int(np.count_nonzero(comma)) + 1
    if len(values) != num_items or values.min() < 0 or values.max() >= 10**18:
        return None
    # A value read from fewer digits than its text has (overflow) fails this; the first item
    # (a timestamp) and every item after ", " start with a non-zero digit (or are "0").
    digits = int(np.searchsorted(_POWERS_OF_TEN, values, side="right").sum()) + num_items
    if digits != len(text) - 2 * (num_items - 1):
        return None
    result: list[int] = values.tolist()
    return result


def _chunk_rows(lines: list[str], first_number: int) -> list[TraceRow | tuple[int, str]]:
    """A chunk's lines: a ``TraceRow`` for each canonical line (all parsed in one call), else
    ``(line_number, text)`` to parse alone (``parse_line``: the same value, or its error)."""
    parts: list[str] = []
    num_hashes: list[int | None] = []  # per line: its hash ids (None: not canonical)
    match = _CANONICAL.fullmatch
    for text in lines:
        m = match(text)
        if m is None:
            num_hashes.append(None)
            continue
        ts, num_in, num_out, hashes = m.groups()
        if hashes:
            parts += (ts, num_in, num_out, hashes)
            num_hashes.append(hashes.count(",") + 1)
        else:
            parts += (ts, num_in, num_out)
            num_hashes.append(0)
    parsed = _bulk_values(parts) if parts else None
    # A tuple: each line's hash ids are then one slice, not a list slice copied into a tuple.
    values = tuple(parsed) if parsed is not None else None
    out: list[TraceRow | tuple[int, str]] = []
    i = 0
    for number, (text, n) in enumerate(zip(lines, num_hashes, strict=True), start=first_number):
        if n is None or values is None:
            out.append((number, text))
            continue
        num_out = values[i + 2]
        out.append(
            (number, values[i] / 1000.0, values[i + 1], num_out if num_out > 1 else 1,
             values[i + 3 : i + 3 + n])
        )  # fmt: skip
        i += 3 + n
    return out


_arrival_of = operator.itemgetter(1)
"""A row's second item: its arrival time (a ``TraceRow``), or its text (a line to parse alone)."""


def trace_rows(path: str | Path, limit: int | None = None) -> Iterator[TraceRow]:
    """``read_mooncake``'s records as ``TraceRow`` tuples: the same values and the same errors,
    raised at the same line. Canonical lines are read a chunk at a time (``_chunk_rows``); any
    other line goes through ``parse_line``."""
    p = Path(path)
    try:
        fh = p.open(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(p)!r}: {exc.strerror}") from None
    with fh:
        count = 0
        last_s = 0.0
        number = 1
        while lines := fh.readlines(_CHUNK_CHARS):
            rows = _chunk_rows(lines, number)
            number += len(lines)
            # The usual chunk (every line canonical, in time order, within the limit) is checked
            # once and passed on whole: the loop below spent ~0.8 us a row on the same checks.
            times = list(map(_arrival_of, rows))
            if (
                2 not in map(len, rows)  # no line left to parse alone
                and (limit is None or count + len(rows) <= limit)
                and times[0] >= last_s
                and all(map(operator.le, times, times[1:]))
            ):
                count += len(rows)
                last_s = times[-1]
                yield from cast(list[TraceRow], rows)
                continue
            for row in rows:
                if limit is not None and count >= limit:
                    return
                if len(row) == 2:
                    line_number, text = row
                    if text.isspace():  # a blank line (file lines are never empty)
                        continue
                    rec = parse_line(text, p, line_number)
                    row = (line_number, rec.arrival_s, rec.num_prompt_tokens,
                           rec.num_output_tokens, rec.block_hashes)  # fmt: skip
                if row[1] < last_s:
                    raise TraceError(f"{p}:{row[0]}: timestamp goes backwards")
                last_s = row[1]
                count += 1
                yield row
