"""SIGTERM as a spot notice for a node process: a deployment's node of an autoscaled spot group
(``serve.run``) and a pool node of a group with ``notice_s`` (``pool.node_main``) take it so.

Given to ``serve.listeners.serve`` as its ``on_sigterm``: the node app (``serve.node.app``)
stops taking prefills, keeps those expected to end by the deadline, hands the rest back, and the
listener closes once the kept ones are done or at the deadline (any kept one still running then
is handed back, not cut). Nothing here decides what is kept: ``serve.node.notice.NoticeDesk``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger("prfaas.node")
POLL_S = 0.05


def notice_on_sigterm(app: Any, notice_s: float) -> Any:
    """SIGTERM as a spot notice of ``notice_s`` wall seconds on ``app`` (the node app): stop
    taking prefills, keep those that end in time, hand the rest back, and end once the kept ones
    are done or at the deadline (handing back any kept one still running then)."""
    loop = asyncio.get_running_loop()

    def on_sigterm(server: Any) -> bool:
        deadline_s = time.monotonic() + notice_s

        async def notice_then_end() -> None:
            try:
                app.state.begin_notice(notice_s)
                desk = app.state.notice_desk
                while desk.num_held and time.monotonic() < deadline_s:
                    await asyncio.sleep(POLL_S)
                app.state.end_notice()  # a kept one still running: handed back, not cut
                await asyncio.sleep(POLL_S)  # its answer leaves before the listener closes
            except Exception:  # whatever happens, the process ends by its deadline
                log.exception("spot notice")
            server.should_exit = True

        loop.call_soon_threadsafe(lambda: loop.create_task(notice_then_end()))
        log.warning("SIGTERM: a spot notice, ending within %g s", notice_s)
        return True

    return on_sigterm
