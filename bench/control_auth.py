"""What signing costs a control-plane call (``prfaas.serve.auth``): sign (``SignedAuth``) plus
verify (``Verifier``) of one request, by body size, medians of 5 runs; and what authenticating
the answers costs (``prfaas.serve.answer_auth``): MAC + verify of one decode-stream line (one
token's event, as a decode node sends it), and of a whole prefill outcome.

    .venv/bin/python bench/control_auth.py

Both halves hash the body once (SHA-256) and HMAC a few hundred bytes, so the cost is a fixed
part plus the body at SHA-256 speed twice over. Measured on the shared 2-core dev machine
(2026-12-01): 24-38 us for a 200 B call, 86-150 us at 64 KiB, 1.0-1.3 ms at 1 MiB (0.8-1.0 GB/s):
a 128K-token prefill command (~0.7 MB of base64 token ids) pays about a millisecond against a
prefill of seconds. The same loop without the signing (building the ``httpx.Request``) is
subtracted. Answer MACs (2026-12-02, the same machine under load average 2-5 from other work):
21-59 us per streamed token line for both ends together (one HMAC-SHA256 of ~130 B each end plus
the line split), 7.5-19 us per prefill outcome each end: at 30 ms a decode step, about 0.1-0.2 %
of a token's time per stream.
"""

from __future__ import annotations

import statistics
import time

import httpx

from prfaas.serve.answer_auth import LineCheck, body_mac, sign_answers
from prfaas.serve.auth import SignedAuth, Verifier

PSK = b"bench-key-0123456789abcdef"
URL = "http://127.0.0.1:8001/nodes/p0/prefill"
SIZES = (200, 64 << 10, 1 << 20)
RUNS = 5


def _per_call_s(body: bytes, n: int) -> float:
    verifier, auth = Verifier(PSK, max_nonces=n + 1), SignedAuth(PSK)
    t0 = time.perf_counter()
    for _ in range(n):
        signed = next(auth.auth_flow(httpx.Request("POST", URL, content=body)))
        headers = {k.lower(): v.encode() for k, v in signed.headers.items()}
        assert verifier.verify(b"POST", b"/nodes/p0/prefill", headers, body, time.time()) is None
    t1 = time.perf_counter()
    for _ in range(n):
        httpx.Request("POST", URL, content=body)
    t2 = time.perf_counter()
    return ((t1 - t0) - (t2 - t1)) / n


LINE = (
    b'{"kind":"token","token_ids":[12345],"text":null,"finish_reason":null,'
    b'"prefix_tokens":0,"error":null}'
)
"""One decode event as the node streams it (one token per line at ``token_chunk`` 1)."""


def _per_line_s(n: int) -> float:
    """Server MACs the line (``sign_answers``, as the ASGI layer runs it) + client verifies."""
    import asyncio

    out: list[bytes] = []

    async def sink(message: dict[str, object]) -> None:
        body = message.get("body")
        if isinstance(body, bytes):
            out.append(body)

    async def run() -> float:
        send = sign_answers(sink, PSK, b"0" * 32)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})  # fmt: skip
        check = LineCheck(PSK, b"0" * 32, 200)
        t0 = time.perf_counter()
        for _ in range(n):
            await send({"type": "http.response.body", "body": LINE + b"\n", "more_body": True})
            check.feed(out.pop())
        t1 = time.perf_counter()
        for _ in range(n):  # the same loop without the MACs
            await sink({"type": "http.response.body", "body": LINE + b"\n", "more_body": True})
            out.pop()
        t2 = time.perf_counter()
        return ((t1 - t0) - (t2 - t1)) / n

    return asyncio.run(run())


def main() -> None:
    print(f"{'body bytes':>12} {'sign+verify us':>15} {'MB/s':>8}")
    for size in SIZES:
        body = b"x" * size
        n = 2000 if size < 1 << 20 else 200
        per_call_s = statistics.median(_per_call_s(body, n) for _ in range(RUNS))
        print(f"{size:>12} {per_call_s * 1e6:>15.1f} {size / per_call_s / 1e6:>8.0f}")
    per_line_s = statistics.median(_per_line_s(20_000) for _ in range(RUNS))
    print(f"answer MAC per streamed token line ({len(LINE)} B): {per_line_s * 1e6:.1f} us "
          "(MAC at the node + verify at the gateway)")  # fmt: skip
    outcome = b'{"request_id":"r1","ok":true,"kv_bytes":123456789,"error":null}'
    t0 = time.perf_counter()
    for _ in range(20_000):
        body_mac(PSK, b"0" * 32, 200, outcome)
    per_body_s = (time.perf_counter() - t0) / 20_000
    print(f"answer MAC of a prefill outcome ({len(outcome)} B): {per_body_s * 1e6:.1f} us each end")


if __name__ == "__main__":
    main()
