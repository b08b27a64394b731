"""Lines of a streamed HTTP body split on ``\\n`` only (SSE and JSON-lines streams).

httpx's ``aiter_lines`` splits like ``str.splitlines``: also on U+0085, U+2028 and U+2029, which
a JSON encoder that writes UTF-8 as is (vLLM's, pydantic's) leaves raw inside a token's text, so
one event arrived as two lines that are not JSON. This splits on the byte ``\\n`` (never inside a
multi-byte UTF-8 sequence) and drops one ``\\r`` before it, as SSE and JSON lines define. Imports
httpx only; owns no connection.
"""

from __future__ import annotations

import codecs
from collections.abc import AsyncIterator, Iterator

import httpx


async def aiter_lines(resp: httpx.Response) -> AsyncIterator[str]:
    """``resp``'s body as text lines without their ``\\n`` (or ``\\r\\n``); undecodable bytes
    become U+FFFD; a last line without ``\\n`` is yielded too."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    async for chunk in resp.aiter_bytes():
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending.removesuffix("\r")


def iter_lines(resp: httpx.Response) -> Iterator[str]:
    """``aiter_lines`` for a synchronous stream (``httpx.stream``, ``Client.stream``)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    for chunk in resp.iter_bytes():
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending.removesuffix("\r")
