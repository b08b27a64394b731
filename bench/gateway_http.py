"""Benchmark of the gateway's HTTP surface alone: how many streaming requests per second one gateway
process relays, and the TTFT it adds, with an instant fake backend (no model, no network hops).

    .venv/bin/python bench/gateway_http.py            # table (medians of --repeats runs)
    .venv/bin/python bench/gateway_http.py --json     # one JSON object
    .venv/bin/python bench/gateway_http.py --quick    # 1 repeat, fewer requests

The gateway runs in its own process (uvicorn, one worker); the load comes from the same code as
``prfaas bench`` (streaming /v1/completions, token-id prompts) in this process. Both share the
machine's cores, so the figures are a floor for a dedicated gateway host. The rows compare
concurrency levels and output lengths side by side: req/s bounds the request rate one gateway
process can front; tokens/s bounds the decode throughput it can relay.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from prfaas.serve.loadgen import BenchRequest, PromptSynth, run_workload, summarize  # noqa: E402

SERVER = """
import sys, uvicorn
from prfaas.serve.api import ByteTokenizer, GatewayHTTPConfig, create_gateway_app
from prfaas.serve.backend import ModelInfo, TokenEvent

class Instant:
    def model_info(self): return ModelInfo("instant", 1 << 20)
    async def health(self): return {"status": "ok"}
    async def generate(self, req):
        for k in range(req.max_tokens):
            yield TokenEvent((97 + k % 26,), "length" if k == req.max_tokens - 1 else None)

config = GatewayHTTPConfig(max_in_flight=1024, max_queued=4096)
app = create_gateway_app(Instant(), ByteTokenizer(), config)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("gateway process exited")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("gateway did not start in 30 s")


def one_run(
    url: str, num_requests: int, concurrency: int, num_output_tokens: int
) -> dict[str, Any]:
    # All requests arrive at t=0: the run is closed-loop at `concurrency`.
    reqs = [BenchRequest(i, 0.0, 256, num_output_tokens) for i in range(num_requests)]
    results, wall_s = asyncio.run(
        run_workload(
            reqs,
            base_url=url,
            model="instant",
            synth=PromptSynth(),
            concurrency=concurrency,
            timeout_s=60,
        )
    )
    return summarize(results, wall_s, {})


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    repeats, num_requests = (1, 100) if args.quick else (args.repeats, args.requests)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], cwd=ROOT)
    rows = []
    try:
        wait_ready(port, proc)
        url = f"http://127.0.0.1:{port}"
        one_run(url, 20, 4, 4)  # warm-up
        for concurrency, num_output_tokens in ((1, 16), (16, 16), (64, 16), (16, 256)):
            runs = [
                one_run(url, num_requests, concurrency, num_output_tokens) for _ in range(repeats)
            ]
            failed = sum(r["failed"] for r in runs)
            rows.append({
                "concurrency": concurrency,
                "output_tokens": num_output_tokens,
                "requests_per_run": num_requests,
                "repeats": repeats,
                "failed": failed,
                "req_per_s": statistics.median(r["throughput_rps"] for r in runs),
                "tokens_per_s": statistics.median(r["output_tokens_per_s"] for r in runs),
                "ttft_p50_ms": 1e3 * statistics.median(r["ttft_s"]["p50"] for r in runs),
                "ttft_p99_ms": 1e3 * statistics.median(r["ttft_s"]["p99"] for r in runs),
            })  # fmt: skip
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return 0
    print(
        f"gateway HTTP relay, instant backend, medians of {repeats} runs of {num_requests} requests"
    )
    header = ("concurrency", "out tok", "req/s", "tok/s", "TTFT p50 ms", "p99 ms", "failed")
    print(" ".join(f"{h:>11}" for h in header))
    for r in rows:
        cells = (
            f"{r['concurrency']}", f"{r['output_tokens']}", f"{r['req_per_s']:.1f}",
            f"{r['tokens_per_s']:.0f}", f"{r['ttft_p50_ms']:.2f}", f"{r['ttft_p99_ms']:.2f}",
            f"{r['failed']}",
        )  # fmt: skip
        print(" ".join(f"{c:>11}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
