"""Test tiers by directory: tests/unit (pure Python), tests/integration (sockets, subprocesses,
tiny CPU models), tests/e2e (network namespaces, several processes). `make test` runs every tier."""

from __future__ import annotations

import signal
from pathlib import Path
from types import FrameType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TRACE = SHARED / "traces" / "mooncake_conversation_trace.jsonl"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """Stop like Ctrl-C on SIGTERM, and take Ctrl-C even when started in the background: `make
    test` runs unit + integration behind e2e as a shell background job, which starts with SIGINT
    ignored, and stops it with SIGTERM. Either way the session unwinds through the fixtures'
    teardown, which stop the processes and namespaces the tests started."""
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in ("unit", "integration", "e2e"):
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
