"""A checker of the Chrome trace-event JSON that ``prfaas sim --perfetto`` and ``prfaas bench
--perfetto`` write (the subset a viewer needs), written apart from the builder it checks."""

from __future__ import annotations

import json
from typing import Any

CATEGORIES = {"prefill", "transfer", "decode", "to_first_token"}
TRACK_PREFIXES = ("node ", "link ", "endpoint")


def check_trace(obj: Any) -> list[dict[str, Any]]:
    """Assert the schema; return the complete (``ph: X``) events."""
    json.dumps(obj)  # plain JSON
    assert isinstance(obj, dict) and isinstance(obj["traceEvents"], list)
    names: dict[int, str] = {}
    spans: list[dict[str, Any]] = []
    for e in obj["traceEvents"]:
        assert e["ph"] in ("M", "X"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["name"], str), e
        if e["ph"] == "M":
            if e["name"] == "process_name":
                names[e["pid"]] = e["args"]["name"]
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0, e
        assert isinstance(e["dur"], int | float) and e["dur"] >= 0, e
        assert e["cat"] in CATEGORIES, e
        assert e["name"] == f"{e['cat']} r{e['args']['request']}", e  # says what it is
        spans.append(e)
    assert set(names) >= {e["pid"] for e in spans}, "a track without a name"
    assert all(n.startswith(TRACK_PREFIXES) for n in names.values()), names
    last: dict[tuple[int, int], tuple[float, float]] = {}
    for e in spans:  # per track: in time order, and spans in one lane never overlap
        key = (e["pid"], e["tid"])
        if key in last:
            ts, end = last[key]
            assert e["ts"] >= ts, f"not monotonic on {key}: {e}"
            assert e["ts"] >= end - 1e-3, f"overlap on {key}: {e}"
        last[key] = (e["ts"], e["ts"] + e["dur"])
    return spans
