"""What signing costs a control-plane call (``prfaas.serve.auth``): sign (``SignedAuth``) plus
verify (``Verifier``) of one request, by body size, medians of 5 runs.

    .venv/bin/python bench/control_auth.py

Both halves hash the body once (SHA-256) and HMAC a few hundred bytes, so the cost is a fixed
part plus the body at SHA-256 speed twice over. Measured on the shared 2-core dev machine
(2026-12-01): 24-38 us for a 200 B call, 86-150 us at 64 KiB, 1.0-1.3 ms at 1 MiB (0.8-1.0 GB/s):
a 128K-token prefill command (~0.7 MB of base64 token ids) pays about a millisecond against a
prefill of seconds. The same loop without the signing (building the ``httpx.Request``) is
subtracted.
"""

from __future__ import annotations

import statistics
import time

import httpx

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


def main() -> None:
    print(f"{'body bytes':>12} {'sign+verify us':>15} {'MB/s':>8}")
    for size in SIZES:
        body = b"x" * size
        n = 2000 if size < 1 << 20 else 200
        per_call_s = statistics.median(_per_call_s(body, n) for _ in range(RUNS))
        print(f"{size:>12} {per_call_s * 1e6:>15.1f} {size / per_call_s / 1e6:>8.0f}")


if __name__ == "__main__":
    main()
