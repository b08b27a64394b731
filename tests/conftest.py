"""Test tiers by directory: tests/unit (pure Python), tests/integration (sockets, subprocesses,
tiny CPU models), tests/e2e (network namespaces, several processes). `make test` runs every tier."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TRACE = SHARED / "traces" / "mooncake_conversation_trace.jsonl"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for tier in ("unit", "integration", "e2e"):
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
