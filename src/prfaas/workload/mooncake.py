"""Reader of the Mooncake JSONL trace format (one request per line).

Each line: ``{"timestamp": ms, "input_length": int, "output_length": int, "hash_ids": [int, ...]}``.
``hash_ids`` name the prompt's 512-token blocks; an id identifies its block *and the whole prefix
before it* (equal ids at the same position mean a reusable prefix), which is what the prefix caches
key on. A malformed line raises ``TraceError`` naming the file and line number. This module is the
workload layer's one piece of file I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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
    p = Path(path)
    try:
        fh = p.open(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(p)!r}: {exc.strerror}") from None
    with fh:
        count = 0
        last_s = 0.0
        for number, text in enumerate(fh, start=1):
            if limit is not None and count >= limit:
                return
            if text.isspace():  # a blank line (file lines are never empty)
                continue
            record = parse_line(text, p, number)
            if record.arrival_s < last_s:
                raise TraceError(f"{p}:{number}: timestamp goes backwards")
            last_s = record.arrival_s
            count += 1
            yield record
