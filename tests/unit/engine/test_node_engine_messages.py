"""The decode node's engine-event translation (``serve.node.engine_messages``), and the node's two
pure helper modules importing neither the node, the transfer package, asyncio nor torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prfaas.engine import FinishReason, TokenEvent
from prfaas.serve.node.engine_messages import decode_event_of

pytestmark = pytest.mark.timeout(60)


def test_a_stop_drops_the_stop_token_and_a_length_keeps_every_token() -> None:
    stop = decode_event_of(TokenEvent("r", (5, 2), FinishReason.STOP))
    assert stop is not None and (stop.token_ids, stop.finish_reason) == ([5], "stop")
    length = decode_event_of(TokenEvent("r", (5, 2), FinishReason.LENGTH))
    assert length is not None and (length.token_ids, length.finish_reason) == ([5, 2], "length")
    running = decode_event_of(TokenEvent("r", (7,)))
    assert running is not None and (running.token_ids, running.finish_reason) == ([7], None)


def test_an_engine_error_is_the_request_s_error_and_nothing_says_nothing() -> None:
    failed = decode_event_of(TokenEvent("r", (), FinishReason.ERROR, "boom"))
    assert failed is not None and (failed.kind, failed.error) == ("error", "engine: boom")
    assert decode_event_of(TokenEvent("r", ())) is None  # installed, first token still to come
    stopped = decode_event_of(TokenEvent("r", (2,), FinishReason.STOP))  # only the stop token
    assert stopped is not None and (stopped.token_ids, stopped.finish_reason) == ([], "stop")


def test_the_node_s_pure_helpers_import_no_node_no_transfer_no_asyncio() -> None:
    code = """
import sys
import prfaas.serve.node.engine_messages, prfaas.serve.node.kv_pieces
bad = ("torch", "asyncio", "prfaas.transfer", "prfaas.serve.node.worker")
print(",".join(m for m in bad if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"imported: {proc.stdout.strip()}"
