"""serve.http_lines.aiter_lines: a streamed body split on \\n only, never inside a token's text
(U+0085, U+2028, U+2029 and a lone \\r are not line ends), whatever the chunking."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from prfaas.serve.http_lines import aiter_lines, iter_lines

pytestmark = pytest.mark.timeout(10)

TEXT = "x\u0085y\u2028z\u2029w\r\u00e9"


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, body: bytes, size: int) -> None:
        self.body, self.size = body, size

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self.body), self.size):
            yield self.body[i : i + self.size]


async def _lines(body: bytes, size: int) -> list[str]:
    resp = httpx.Response(200, stream=_Chunks(body, size))
    return [line async for line in aiter_lines(resp)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 4096])  # 1-3: UTF-8 sequences split across chunks
async def test_sse_events_with_line_separators_in_their_text_stay_whole(size: int) -> None:
    events = [{"choices": [{"text": TEXT, "token_ids": [i]}]} for i in range(3)]
    body = "".join(f"data: {json.dumps(e, ensure_ascii=False)}\r\n\n" for e in events)
    lines = await _lines(body.encode() + b"data: [DONE]", size)
    data = [json.loads(line[5:]) for line in lines if line.startswith("data: {")]
    assert data == events
    assert lines[-1] == "data: [DONE]" and lines.count("") == 3  # no \n at the end: still a line


async def test_httpx_own_reader_would_have_split_them() -> None:
    body = f"data: {json.dumps({'text': TEXT}, ensure_ascii=False)}\n".encode()
    resp = httpx.Response(200, stream=_Chunks(body, 4096))
    assert len([line async for line in resp.aiter_lines()]) > 1  # why this module exists
    assert len(await _lines(body, 4096)) == 1


async def test_undecodable_bytes_are_replaced_not_raised() -> None:
    assert await _lines(b"a\xffb\nc", 1) == ["a\ufffdb", "c"]


class _SyncChunks(httpx.SyncByteStream):
    def __init__(self, body: bytes, size: int) -> None:
        self.body, self.size = body, size

    def __iter__(self) -> Iterator[bytes]:
        for i in range(0, len(self.body), self.size):
            yield self.body[i : i + self.size]


@pytest.mark.parametrize("size", [1, 3, 4096])
def test_the_synchronous_reader_splits_alike(size: int) -> None:
    event = {"choices": [{"text": TEXT}]}
    body = f"data: {json.dumps(event, ensure_ascii=False)}\r\n\ndata: [DONE]\n".encode()
    lines = list(iter_lines(httpx.Response(200, stream=_SyncChunks(body, size))))
    assert lines == [f"data: {json.dumps(event, ensure_ascii=False)}", "", "data: [DONE]"]
