"""Outside ``transfer/`` nothing connects a KV ``Link``, builds a link monitor or capacity
estimator, or shares or builds a pacer: ``transfer.link_pool.LinkPool`` owns pooled KV links for
every sender (WorkerHost and the vLLM connector's transfer thread alike). Read with ``ast`` from
the source (nothing is imported); tests and benchmarks are not checked."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "prfaas"
OWNER = SRC / "transfer"
BUILT_THERE = {"LinkMonitor", "SenderLinkEstimator", "CapacityEstimator", "TokenBucket",
               "CappedPacer", "pacer"}  # fmt: skip
"""Names whose call outside ``transfer/`` (and ``core/``, which defines the estimator) is
forbidden."""
METHODS = {"share_pacer"}
"""Methods only the pool calls."""

pytestmark = pytest.mark.timeout(60)


def _link_names(tree: ast.Module) -> set[str]:
    """Local names bound to ``prfaas.transfer``'s ``Link`` (``import ... as`` included)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prfaas.transfer"):
            names |= {a.asname or a.name for a in node.names if a.name == "Link"}
    return names


def offences(source: str, where: str, in_core: bool = False) -> list[str]:
    """What ``source`` (the module at ``where``) does that only the pool may do, as
    ``where:line what``."""
    tree = ast.parse(source, filename=where)
    links = _link_names(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        what = ""
        if name in BUILT_THERE and not in_core:
            what = f"builds {name}"
        elif isinstance(f, ast.Attribute) and f.attr in METHODS:
            what = f"calls .{f.attr}"
        elif isinstance(f, ast.Attribute) and f.attr == "connect":
            owner = f.value
            if (isinstance(owner, ast.Name) and owner.id in links) or (
                isinstance(owner, ast.Attribute) and owner.attr == "Link"
            ):
                what = "calls Link.connect"
        if what:
            found.append((node.lineno, what))
    return [f"{where}:{line} {what}" for line, what in sorted(found)]


def test_only_the_link_pool_connects_links_monitors_estimates_and_paces() -> None:
    bad = [
        o
        for path in sorted(SRC.rglob("*.py"))
        if OWNER not in path.parents
        for o in offences(
            path.read_text(encoding="utf-8"),
            str(path.relative_to(SRC.parent)),
            in_core=path.parent.name == "core",
        )
    ]
    assert not bad, "only transfer/ (transfer.link_pool) may do these:\n" + "\n".join(bad)


def test_the_check_sees_each_forbidden_use() -> None:
    """The check is not blind: each thing it forbids is named."""
    text = (
        "from prfaas.transfer import Link as TL\n"
        "from prfaas.transfer.monitor import LinkMonitor\n"
        "async def f(link, est):\n"
        "    await TL.connect('h', 1, None)\n"
        "    LinkMonitor(link, 'x')\n"
        "    est.SenderLinkEstimator(1.0)\n"
        "    link.share_pacer(None)\n"
        "    await transfer.Link.connect('h', 1, None)\n"
    )
    got = offences(text, "serve/x.py")
    assert [g.split(" ", 1)[1] for g in got] == [
        "calls Link.connect", "builds LinkMonitor", "builds SenderLinkEstimator",
        "calls .share_pacer", "calls Link.connect",
    ]  # fmt: skip
