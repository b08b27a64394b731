"""Decode pods as the tests see them: an HTTP/1.1 server per address that answers an OpenAI
request with a short SSE stream naming itself and echoing the picker's headers, and can be told
to fail its next request with 503 (a retry's trigger)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field


@dataclass
class FakeEndpoint:
    host: str
    port: int
    seen: list[dict[str, str]] = field(default_factory=list)
    """Headers of every request that reached it."""
    fail_next: int = 0
    chunk_gap_s: float = 0.01
    """Between SSE chunks: separate writes on the wire, a stream rather than one body."""
    server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, self.host, self.port)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            length = int(headers.get("content-length", "0"))
            if length:
                await reader.readexactly(length)
            self.seen.append(headers)
            if self.fail_next > 0:
                self.fail_next -= 1
                body = b'{"error": "busy"}'
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            )
            picked = {k: v for k, v in headers.items() if k.startswith(("x-prfaas", "x-pref"))}
            events = [
                {"endpoint": f"{self.host}:{self.port}", "headers": picked},
                {"choices": [{"text": "hello"}]},
            ]
            for event in events:
                chunk = f"data: {json.dumps(event)}\n\n".encode()
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                await writer.drain()
                await asyncio.sleep(self.chunk_gap_s)
            done = b"data: [DONE]\n\n"
            writer.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
