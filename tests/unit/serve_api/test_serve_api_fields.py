"""Field rules, JSON parsing, the unknown-field log and the relay's cached-token bookkeeping,
without HTTP; and docs/api.md naming every field the gateway knows."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from prfaas.config import GatewayConfig
from prfaas.serve.api.app import UnknownFields
from prfaas.serve.api.errors import ApiError
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.api.prepare import MAX_JSON_DEPTH, parse_json
from prfaas.serve.api.relay import Relay
from prfaas.serve.api.schemas import (
    CHAT_RULES,
    COMPLETION_RULES,
    HONOURED_CHAT,
    HONOURED_COMPLETION,
    TOKENIZE_RULES,
    DefaultOnly,
    Ignored,
)
from prfaas.serve.api.tokenizer import ByteTokenizer
from prfaas.serve.api.tracking import RequestTracker
from prfaas.serve.backend import GenerationRequest, ModelInfo, TokenEvent

pytestmark = pytest.mark.timeout(10)
DOCS = Path(__file__).parents[3] / "docs" / "api.md"


def refused(rule: DefaultOnly | Ignored, value: Any) -> bool:
    try:
        rule.check("f", value)
    except ApiError as exc:
        assert exc.status == 400 and exc.param == "f"
        return True
    return False


def test_default_only_compares_as_json() -> None:
    n = DefaultOnly((1, None), "one choice")
    assert not refused(n, 1) and not refused(n, 1.0) and not refused(n, None)
    assert refused(n, True) and refused(n, 2) and refused(n, "1")
    penalty = DefaultOnly((0, None), "no")
    assert not refused(penalty, 0.0) and refused(penalty, False) and refused(penalty, 1e-9)
    bias = DefaultOnly((None, {}), "no")
    assert not refused(bias, {}) and refused(bias, []) and refused(bias, {"1": 2})
    assert refused(DefaultOnly((False, None), "no"), 0)


def test_ignored_checks_only_the_type() -> None:
    user = Ignored("unused", (str, type(None)))
    assert not refused(user, "u") and not refused(user, None) and refused(user, 5)
    assert refused(Ignored("x", (int, type(None))), True)  # a JSON boolean is not a number
    assert not refused(Ignored("anything"), {"deep": [1, {"x": None}]})


def test_parse_json_bounds_nesting_and_names_the_place() -> None:
    ok = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    assert parse_json(b'{"a": ' + ok.encode() + b"}")["a"] is not None
    deep = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    with pytest.raises(ApiError) as info:
        parse_json(b'{"a": {"b": ' + deep.encode() + b"}}")
    assert info.value.code == "invalid_json" and info.value.param is not None
    assert info.value.param.startswith("a.b")
    with pytest.raises(ApiError, match="deeper"):
        parse_json(b"[" * 100_000)


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b'{"x": NaN}', "invalid_json", None),
        (b'{"x": -Infinity}', "invalid_json", None),
        (b'{"x": ' + b"1" * 4301 + b"}", "invalid_json", None),
        (b'{"m": [{"c": "ok"}, {"c": "\\udbff"}]}', "invalid_unicode", "m.1.c"),
        (b'{"k": {"\\ud800x": 1}}', "invalid_unicode", "k"),
        (b'{"s": "\xed\xa0\x80"}', "invalid_json", None),  # a surrogate encoded as UTF-8
        (b"[]", None, None),
    ],
)
def test_parse_json_refusals(raw: bytes, code: str | None, param: str | None) -> None:
    with pytest.raises(ApiError) as info:
        parse_json(raw)
    assert info.value.status == 400
    assert (info.value.code, info.value.param) == (code, param)


def test_parse_json_keeps_valid_surrogate_pairs() -> None:
    assert parse_json(b'{"e": "\\ud83d\\ude00"}') == {"e": "\U0001f600"}


def test_unknown_fields_are_logged_once_per_set_and_bounded(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(UnknownFields, "MAX_SETS", 3)
    log = UnknownFields()
    with caplog.at_level(logging.WARNING, logger="prfaas.serve.api"):
        log.note("/v1/completions", ())
        log.note("/v1/completions", ("b", "a"))
        log.note("/v1/completions", ("a", "b"))  # the same set: no second line
        log.note("/v1/completions", ("x" * 500,))
        log.note("/tokenize", ("a", "b"))  # another endpoint: its own line
        log.note("/v1/completions", ("c",))  # past the bound: not logged
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines  # three sets and the "no more" notice
    assert "'a', 'b'" in lines[0] and len(lines[1]) < 200 and "no more" in lines[-1]


async def test_coalesced_events_keep_cached_tokens_and_the_finish() -> None:
    class Burst:
        def model_info(self) -> ModelInfo:
            return ModelInfo("m", 64)

        async def health(self) -> dict[str, Any]:
            return {"status": "ok"}

        async def ready(self) -> str | None:
            return None

        async def generate(self, req: GenerationRequest) -> AsyncIterator[TokenEvent]:
            yield TokenEvent((120,))
            yield TokenEvent((121,), None, 7)
            yield TokenEvent((), "stop")  # an empty event carrying only the finish

    req = GenerationRequest("r", (1, 2), 10, 0.0, 1.0, None, (), 0.0)
    tracker = RequestTracker(GatewayMetrics(), "completions")
    relay = Relay(Burst(), req, ByteTokenizer(), tracker, timeout_s=5.0, buffer_events=8)
    relay.start()
    deltas = [d async for d in relay.deltas()]
    assert "".join(d.text for d in deltas) == "xy" and deltas[-1].finish_reason == "stop"
    assert relay.num_cached_tokens == 7


def test_gateway_config_api_keys_never_echo_a_key() -> None:
    assert GatewayConfig(api_keys=["long-enough-key"]).api_keys == ["long-enough-key"]
    for bad in ("short", "with space 123", "ünïcödé-key"):
        with pytest.raises(ValueError, match="key 0 must be at least 8") as info:
            GatewayConfig(api_keys=[bad])
        assert bad not in str(info.value).split("input_value")[0]


def test_docs_name_every_field() -> None:
    text = DOCS.read_text(encoding="utf-8")
    documented = set(re.findall(r"`([a-z_][a-z_.]*)`", text))
    fields = {*COMPLETION_RULES, *CHAT_RULES, *TOKENIZE_RULES, *HONOURED_COMPLETION}
    fields |= {*HONOURED_CHAT, "stream_options.include_usage"}
    fields |= {"stream_options.continuous_usage_stats", "return_token_strs", "tokens"}
    assert fields - documented == set()
