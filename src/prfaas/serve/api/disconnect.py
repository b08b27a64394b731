"""Racing a wait against the client going away, before a streaming response has started.

Once ``StreamingResponse`` runs, Starlette watches for ``http.disconnect`` itself; before that
(queued for a slot, waiting for the first token, collecting a non-streaming answer) the handler
would not notice, and the backend would keep working for nobody. ``until_disconnect`` runs the
wait beside a reader of the ASGI ``receive`` channel and raises ``ClientGone`` if the client left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was complete."""


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(receive: Receive, awaitable: Awaitable[T]) -> T:
    """``await awaitable``, unless the client leaves first (``ClientGone``; the work is
    cancelled). ``receive`` is the request's ASGI channel, its body already read."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # server shutdown: take both down with us
        work.cancel()
        watch.cancel()
        raise
    loser = watch if work.done() else work
    loser.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.gather(loser, return_exceptions=True)
    if not work.done() or work.cancelled():
        raise ClientGone
    return work.result()
