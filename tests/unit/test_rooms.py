"""Arrows between rooms point down: nothing below ``serve/`` imports ``serve/`` (or the CLI), and
the product path (``serve/``) imports no test harness (``testbed/``). Read from the source with
``ast`` (``test_import_graph.import_graph``), function-level and ``TYPE_CHECKING`` imports
included."""

from __future__ import annotations

import pytest
from test_import_graph import import_graph

pytestmark = pytest.mark.timeout(60)

BELOW_SERVE = ("core", "spec", "perf", "analytic", "workload", "cache", "policy", "sim",
               "transfer", "engine", "integrations", "netlab", "config", "deployment_sections",
               "errors")  # fmt: skip
ABOVE_SERVE = ("prfaas.serve", "prfaas.commands", "prfaas.cli", "prfaas.testbed", "prfaas.demo")


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_no_arrow_from_a_lower_room_up_to_serve() -> None:
    graph = import_graph()
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _room(m) in BELOW_SERVE
        for t in targets
        if any(_under(t, up) for up in ABOVE_SERVE)
    )
    assert not bad, "lower rooms import upward:\n" + "\n".join(bad)


def test_the_product_path_imports_no_test_harness() -> None:
    graph = import_graph()
    bad = sorted(
        f"{m} -> {t}"
        for m, targets in graph.items()
        if _under(m, "prfaas.serve") or _under(m, "prfaas.commands")
        for t in targets
        if _under(t, "prfaas.testbed")
    )
    assert not bad, "serve/ imports test harnesses:\n" + "\n".join(bad)
