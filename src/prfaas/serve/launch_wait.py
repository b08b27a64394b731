"""The waits of a ``prfaas up`` start-up, each until a deadline: the gateway answering, the
nodes in rotation, ``/ready`` saying yes; with the progress lines they say.

Each wait polls, checks the children (``check_alive``: a death during start-up is a
``LaunchError`` with its log tail) and pauses one poll period between tries (``pause``: cut short,
as ``LaunchCancelled``, by ``Launcher.cancel()``); both are the launcher's, passed in. Owns no
process and writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from prfaas.serve.control_client import GatewayUnreachable
from prfaas.serve.launch_errors import LaunchError


class Progress:
    """Says a progress line when it differs from the last one (polls repeat themselves)."""

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        self._sink = sink
        self._last = ""

    def __call__(self, message: str) -> None:
        if self._sink is not None and message != self._last:
            self._last = message
            self._sink(message)


def serving(node: dict[str, Any]) -> bool:
    return bool(node.get("in_rotation", node.get("healthy")))


def wait_gateway(
    url: str,
    workers: Callable[[], int],
    deadline: float,
    say: Progress,
    check_alive: Callable[[], None],
    pause: Callable[[], None],
) -> None:
    say(f"starting the gateway at {url}")
    while time.monotonic() < deadline:
        check_alive()
        try:
            # Any answer will do (503 while no node has registered): the process serves.
            if httpx.get(f"{url}/health", timeout=1.0).status_code in (200, 503):
                say(f"gateway answering at {url}; starting {workers()} workers")
                return
        except httpx.HTTPError:
            pass
        pause()
    raise LaunchError(f"gateway did not answer at {url} in time")


def wait_nodes(
    nodes: Callable[[], list[dict[str, Any]]],
    wanted: set[str],
    deadline: float,
    say: Progress,
    check_alive: Callable[[], None],
    pause: Callable[[], None],
) -> None:
    serving_: set[str] = set()
    while time.monotonic() < deadline:
        check_alive()
        try:
            serving_ = {str(n["node"]) for n in nodes() if serving(n)}
        except (GatewayUnreachable, httpx.HTTPError):
            serving_ = set()
        if wanted <= serving_:
            return
        say(f"{len(wanted & serving_)}/{len(wanted)} nodes in rotation; waiting for "
            + ", ".join(sorted(wanted - serving_)))  # fmt: skip
        pause()
    missing = ", ".join(sorted(wanted - serving_))
    raise LaunchError(f"nodes {missing} did not come into rotation in time")


def wait_ready(
    ready: Callable[[], str | None],
    url: str,
    deadline: float,
    say: Progress,
    check_alive: Callable[[], None],
    pause: Callable[[], None],
) -> None:
    reason: str | None = "no answer"
    while time.monotonic() < deadline:
        check_alive()
        try:
            reason = ready()
        except GatewayUnreachable as exc:
            reason = str(exc)
        if reason is None:
            return
        say(f"gateway not ready yet: {reason}")
        pause()
    raise LaunchError(f"gateway {url}/ready still says: {reason}")
