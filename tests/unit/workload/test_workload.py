"""Arrival processes, length distributions and the Mooncake reader."""

from __future__ import annotations

import itertools
import random
import statistics
from pathlib import Path

import pytest

from prfaas.workload import (
    ArrivalSpec,
    EmpiricalLengths,
    TraceError,
    TruncatedLogNormal,
    arrival_times,
    read_mooncake,
    synthetic_requests,
    trace_requests,
)
from prfaas.workload.mooncake import parse_line, trace_rows

TRACE = (
    Path(__file__).resolve().parents[4] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
)


def _gaps(kind: str, **kw: float) -> list[float]:
    ts = list(arrival_times(ArrivalSpec(kind, 2.0, **kw), 20000.0, random.Random(1)))
    return [b - a for a, b in itertools.pairwise(ts)]


def test_uniform_is_evenly_spaced() -> None:
    ts = list(arrival_times(ArrivalSpec("uniform", 4.0), 10.0, random.Random(0)))
    assert len(ts) == 40 and ts[1] == 0.25 and ts[-1] == 9.75


@pytest.mark.parametrize(
    ("kind", "kw", "cv"), [("poisson", {}, 1.0), ("gamma", {"cv": 3.0}, 3.0), ("onoff", {}, None)]
)
def test_random_arrivals_keep_the_mean_rate(kind: str, kw: dict, cv: float | None) -> None:  # type: ignore[type-arg]
    gaps = _gaps(kind, **kw)
    mean = statistics.mean(gaps)
    assert mean == pytest.approx(0.5, rel=0.05)
    measured_cv = statistics.pstdev(gaps) / mean
    if cv is not None:
        assert measured_cv == pytest.approx(cv, rel=0.1)
    else:
        assert measured_cv > 1.2  # on/off is burstier than Poisson


def test_bad_arrival_specs() -> None:
    with pytest.raises(ValueError, match="rate"):
        ArrivalSpec("poisson", -1.0)
    with pytest.raises(ValueError, match="unknown arrival"):
        ArrivalSpec("zipf", 1.0)


def test_truncated_lognormal_matches_the_paper() -> None:
    d = TruncatedLogNormal()
    xs = [x for _, x in zip(range(20000), d.stratified(random.Random(3)), strict=False)]
    assert min(xs) >= 128 and max(xs) <= 131072
    assert statistics.mean(xs) == pytest.approx(27485, rel=0.01)  # PAPER.md: mean ~27.5K
    plain = [d.draw(random.Random(i)) for i in range(2000)]
    assert 128 <= min(plain) and max(plain) <= 131072


def test_empirical_lengths() -> None:
    e = EmpiricalLengths.of([5, 1, 3])
    assert e.values == (1, 3, 5)
    assert {e.draw(random.Random(i)) for i in range(50)} == {1, 3, 5}


def test_same_lengths_at_every_rate() -> None:
    d = TruncatedLogNormal()
    a = [
        r.num_prompt_tokens
        for r in synthetic_requests(
            ArrivalSpec("uniform", 1.0), d, 1024, 100.0, random.Random(5), stratified=True
        )
    ]
    b = [
        r.num_prompt_tokens
        for r in synthetic_requests(
            ArrivalSpec("uniform", 2.0), d, 1024, 50.0, random.Random(5), stratified=True
        )
    ]
    assert a == b  # common random numbers across a rate search


@pytest.mark.skipif(not TRACE.is_file(), reason="Mooncake trace not present")
def test_mooncake_reader_and_rate_scale() -> None:
    recs = list(read_mooncake(TRACE, limit=5))
    assert recs[0].num_prompt_tokens == 6758 and recs[0].block_hashes[:3] == (0, 1, 2)
    assert recs[0].line_number == 1
    scaled = list(trace_requests(read_mooncake(TRACE, limit=2000), rate_scale=2.0))
    plain = list(trace_requests(read_mooncake(TRACE, limit=2000)))
    assert scaled[-1].arrival_s == pytest.approx(plain[-1].arrival_s / 2)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("not json", "not valid JSON"),
        ('{"timestamp": 1, "input_length": 0}', "input_length"),
        ('{"timestamp": -1, "input_length": 5}', "timestamp"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}', "hash_ids"),
        ("[1, 2]", "JSON object"),
    ],
)
def test_malformed_lines_name_their_line_number(tmp_path: Path, line: str, needle: str) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n' + line + "\n")
    with pytest.raises(TraceError, match=needle) as err:
        list(read_mooncake(p))
    assert f"{p}:3" in str(err.value)


def test_backwards_timestamps_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"timestamp": 5, "input_length": 5, "output_length": 1}\n'
        '{"timestamp": 1, "input_length": 5, "output_length": 1}\n'
    )
    with pytest.raises(TraceError, match=":2: timestamp goes backwards"):
        list(read_mooncake(p))
    with pytest.raises(TraceError, match="cannot read"):
        list(read_mooncake(tmp_path / "missing.jsonl"))


def _per_line(path: Path) -> list[tuple[int, float, int, int, tuple[int, ...]]]:
    """The reader's values the slow, obvious way: ``parse_line`` (``json``) on every line."""
    rows = []
    for number, text in enumerate(path.read_text().splitlines(keepends=True), start=1):
        if not text.isspace():
            r = parse_line(text, path, number)
            rows.append((number, r.arrival_s, r.num_prompt_tokens, r.num_output_tokens,
                         r.block_hashes))  # fmt: skip
    return rows


_ODD_BUT_VALID = [
    '{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}',
    '{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": []}',
    '{"timestamp": 1, "input_length": 5, "output_length": 1}',
    '{"timestamp":2,"input_length":5,"output_length":1,"hash_ids":[1,2]}',
    '{"timestamp": 2.5, "input_length": 5, "output_length": 1, "hash_ids": [3]}',
    '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [12345678901234567890]}',
    '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [999999999999999999]}',
    '{"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [1000000000000000000]}',
    '{"timestamp": 4, "input_length": 5, "output_length": 1, "hash_ids": [0, 0, 10, 100, 7]}',
    "   ",
    '{"hash_ids": [1], "timestamp": 5, "input_length": 5, "output_length": 1}',
    '{"timestamp": 6, "input_length": 5, "output_length": 2, "hash_ids": [1 , 2]}',
]


@pytest.mark.parametrize("odd", range(len(_ODD_BUT_VALID)))
def test_chunked_reader_reads_what_json_reads(tmp_path: Path, odd: int) -> None:
    # Canonical lines around one odd (still valid) line, the file's last line unterminated.
    canonical = [
        f'{{"timestamp": {10 + i}, "input_length": {600 + i}, "output_length": {i}, '
        f'"hash_ids": [{", ".join(str(7 * i + j) for j in range(i % 4))}]}}'
        for i in range(300)
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join([*_ODD_BUT_VALID[: odd + 1], *canonical]))
    want = _per_line(p)
    assert list(trace_rows(p)) == want
    assert [(r.line_number, r.arrival_s, r.num_prompt_tokens, r.num_output_tokens,
             r.block_hashes) for r in read_mooncake(p)] == want  # fmt: skip
    assert all(type(h) is int for row in want for h in row[4])
    assert list(trace_rows(p, limit=7)) == want[:7]


@pytest.mark.parametrize(
    "hashes", ["[1, 01]", "[1, , 2]", "[1, 2, ]", "[, 1]", "[1 2]", "[1,, 2]", "[-1]"]
)
def test_chunked_reader_fails_where_json_fails(tmp_path: Path, hashes: str) -> None:
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}\n'
    bad = f'{{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": {hashes}}}\n'
    p = tmp_path / "t.jsonl"
    p.write_text(good * 5 + bad + good * 5)
    rows = trace_rows(p)
    assert [next(rows)[0] for _ in range(5)] == [1, 2, 3, 4, 5]  # the lines before it first
    with pytest.raises(TraceError, match=f"{p}:6: "):
        next(rows)
    # A limit that ends before the bad line never reads it.
    assert len(list(trace_rows(p, limit=5))) == 5


@pytest.mark.timeout(10)
@pytest.mark.parametrize("chunk_chars", [100, 1 << 18])
def test_chunked_reader_order_and_limit_checks_per_chunk(
    tmp_path: Path, chunk_chars: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Canonical chunks pass whole once checked: a timestamp going backwards (inside a chunk or
    across two) still raises at its own line after the rows before it, and a limit still ends
    the rows where it falls."""
    import prfaas.workload.mooncake as mooncake

    monkeypatch.setattr(mooncake, "_CHUNK_CHARS", chunk_chars)
    line = '{{"timestamp": {}, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]}}\n'
    p = tmp_path / "t.jsonl"
    p.write_text("".join(line.format(ts) for ts in (0, 10, 10, 20, 30, 25, 40)))
    seen: list[float] = []
    with pytest.raises(TraceError, match=":6: timestamp goes backwards"):
        seen.extend(row[1] for row in trace_rows(p))
    assert seen == [0.0, 0.01, 0.01, 0.02, 0.03]
    for limit in range(6):
        assert [row[0] for row in trace_rows(p, limit=limit)] == list(range(1, limit + 1))
