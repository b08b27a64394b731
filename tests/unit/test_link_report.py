"""``core.SenderLinkReport``: scaled into modelled units, and read back from the vLLM agent's JSON
with the bad field named."""

from __future__ import annotations

import pytest

from prfaas.core.link_report import SenderLinkReport

pytestmark = pytest.mark.timeout(30)

WALL = SenderLinkReport("pf->pd", 1e6, 1e6, 8e5, "measured", 2_000, rtt_s=0.002)


def test_scaled_multiplies_bytes_and_rates_and_divides_seconds() -> None:
    m = WALL.scaled(1000, 0.1)  # byte_divisor 1000, time_scale 0.1
    assert m.configured_bytes_per_s == pytest.approx(1e8) and m.pace_bytes_per_s == 1e8
    assert m.capacity_bytes_per_s == pytest.approx(8e7) and m.backlog_bytes == 2_000_000
    assert m.rtt_s == pytest.approx(0.02) and (m.link, m.basis) == ("pf->pd", "measured")
    assert WALL.scaled(1, 1.0) == WALL  # a real engine converts nothing


def test_json_round_trip_and_bad_fields_named() -> None:
    assert SenderLinkReport.from_json(WALL.to_json()) == WALL
    for change, needle in (
        ({"basis": "guessed"}, "basis"),
        ({"backlog_bytes": -1}, "backlog_bytes"),
        ({"capacity_bytes_per_s": "fast"}, "capacity_bytes_per_s"),
        ({"link": ""}, "link"),
        ({"extra": 1}, "unknown fields"),
    ):
        with pytest.raises(ValueError, match=needle):
            SenderLinkReport.from_json({**WALL.to_json(), **change})
    with pytest.raises(ValueError, match="object"):
        SenderLinkReport.from_json([1])
