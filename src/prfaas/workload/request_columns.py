"""The per-request export's columns: ``RequestRow``, one row per request, shared by
``prfaas sim --requests-csv`` (``sim.request_log``) and ``prfaas bench --requests-csv``
(``serve.loadgen.export``), so the two CSVs cannot drift apart; and their text form both ways
(``cells`` to write a row, ``parse_rows`` to read a CSV back).

A column a source cannot know is ``None`` and an empty cell: the live client sees no queueing
(it happens inside the gateway), and without the gateway's route log (or with text prompts, whose
token ids only the server knows) a bench row has no nodes, route, cached tokens or bytes. Pure:
imports nothing of ``sim`` or ``serve``, writes no file (the commands do).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, get_args, get_type_hints

OK = "ok"
"""``outcome`` of a request that completed (else the client's failure reason, e.g. ``http_429``)."""


@dataclass(frozen=True, slots=True)
class RequestRow:
    index: int
    """The request's index in its workload (trace row or synthetic draw)."""
    arrival_s: float
    """Arrival at the system (sim) / when the client sent it (bench), from the start of the run."""
    num_prompt_tokens: int
    num_cached_tokens: int | None
    """Prefix tokens reused at the prefill site (the prefix hit)."""
    num_output_tokens: int
    prefill_site: str | None
    prefill_node: str | None
    decode_node: str | None
    offloaded: bool | None
    """Prefilled at a PrfaaS site, not at its home PD site."""
    rerouted: bool | None
    """Sim: the router moved it off its first choice. Bench: the gateway needed more than one
    attempt (a node failed under it)."""
    queueing_s: float | None
    """Arrival to the start of its prefill batch (sim only)."""
    ttft_s: float | None
    """Arrival to its first token."""
    e2e_s: float | None
    """Arrival to its last token."""
    cross_site_bytes: int | None
    """KV bytes that crossed an inter-site link for it (0: prefilled at its home site)."""
    prefix_hit: float | None
    """``num_cached_tokens / num_prompt_tokens``."""
    outcome: str = OK
    """``ok``, or why it failed (bench: ``http_429``, ``timeout`` ...)."""


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestRow))


def cells(row: RequestRow) -> list[str]:
    """The row's CSV cells in ``COLUMNS`` order (``None``: an empty cell; floats in full)."""
    return ["" if v is None else repr(v) if isinstance(v, float) else str(v)
            for v in dataclasses.astuple(row)]  # fmt: skip


def _kind(hint: Any) -> tuple[type, bool]:
    """(the column's type, whether it may be None) from its annotation."""
    args = [a for a in get_args(hint) if a is not type(None)]
    return (args[0], True) if args else (hint, False)


_KINDS: dict[str, tuple[type, bool]] = {n: _kind(t) for n, t in get_type_hints(RequestRow).items()}


def _parse(name: str, text: str) -> object:
    kind, optional = _KINDS[name]
    if text == "":
        if optional:
            return None
        if kind is str:
            return ""
        raise ValueError(f"column {name}: empty, but it is always known")
    if kind is bool:
        if text not in ("True", "False"):
            raise ValueError(f"column {name}: {text!r} is not True/False")
        return text == "True"
    if kind is int or kind is float:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"column {name}: {text!r} is not a number") from None
    return text


def parse_rows(lines: Iterable[str]) -> list[RequestRow]:
    """Rows of a per-request CSV (its header must be ``COLUMNS``); ``ValueError`` names the line
    and column that does not parse."""
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or tuple(header) != COLUMNS:
        raise ValueError(f"not a per-request CSV: header {header!r}, expected {list(COLUMNS)}")
    out = []
    for number, record in enumerate(reader, start=2):
        if len(record) != len(COLUMNS):
            raise ValueError(f"line {number}: {len(record)} cells, expected {len(COLUMNS)}")
        try:
            values = {n: _parse(n, t) for n, t in zip(COLUMNS, record, strict=True)}
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        out.append(RequestRow(**values))  # type: ignore[arg-type]
    return out
