"""The elastic loop with torch nodes (a real start-up): ``prfaas up`` of a two-site deployment of a
tiny random-weight Qwen3-Next (CPU) with ``autoscale:`` on the PrfaaS site; a burst of long
prompts through the ``openai`` client, then quiet. Prints what the supervisor did (nodes added and
removed, their names and times from the burst's start), what the gateway decided
(``prfaas_autoscale_decisions_total``), and the requests (completed / sent, seconds P50/P90 while
the pool was one node and after it grew). Nothing is asserted: figures for docs/elastic.md and the
issue's note. Every process it starts is stopped (their process groups) however it ends.

Run under the heavy lock: ``flock /tmp/prfaas-heavy.lock python bench/elastic_torch.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from node_startup import deployment as two_sites  # bench/ is on the path: run as a script


def deployment(model_dir: Path, startup_s: float, prior_tokens_per_s: float) -> dict[str, Any]:
    """``bench/node_startup.py``'s two-site torch file, with ``autoscale:`` on its PrfaaS site."""
    raw = two_sites("torch", model_dir).model_dump(mode="json", exclude_none=True)
    raw["gateway"]["heartbeat_timeout_s"] = 3.0  # torch nodes on two shared cores report late
    raw["policy"]["threshold_tokens"] = 512  # the tiny model's prompts: ~1,400 tokens
    raw["autoscale"] = {"min_nodes": 1, "max_nodes": 3, "tick_s": 1.0, "rate_window_s": 5,
                        "up_cooldown_s": 2, "down_cooldown_s": 4, "down_stabilisation_s": 2,
                        "prior_tokens_per_s": prior_tokens_per_s, "ttft_target_s": 2,
                        "groups": [{"name": "od", "startup_s": startup_s}]}  # fmt: skip
    return raw


def events(workdir: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads((workdir / "processes.json").read_text())["events"])
    except (OSError, ValueError, KeyError):
        return []


def added(workdir: Path, kind: str) -> dict[str, float]:
    """Added nodes (``prfaas-od-*``) -> the wall time (unix s) of their first ``kind`` event."""
    out: dict[str, float] = {}
    for e in events(workdir):
        if e["kind"] == kind and e["member"].startswith("prfaas-od-"):
            out.setdefault(e["member"], float(e.get("at_unix_s", time.time())))
    return out


async def burst(
    url: str, n: int, concurrency: int, rng: random.Random
) -> list[tuple[float, float, bool]]:
    """``n`` completions; (start unix s, seconds, ok) each."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[float, float, bool]:
        # digits tokenize to about a token each with the tiny byte-level BPE; a fresh head per
        # prompt: no shared prefix
        prompt = f"{i} {rng.random()} " + "".join(
            rng.choice("0123456789abcdef") for _ in range(1400)
        )
        async with sem:
            t0, start = time.time(), time.monotonic()
            try:
                await client.completions.create(model="tiny-qwen3-next", prompt=prompt,
                                                max_tokens=8)  # fmt: skip
                ok = True
            except openai.OpenAIError as exc:
                print(f"  request {i}: {exc}", flush=True)
                ok = False
            return t0, time.monotonic() - start, ok

    try:
        return list(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=48, help="prompts in the burst (default 48)")
    ap.add_argument("--concurrency", type=int, default=16, help="in flight at once (default 16)")
    ap.add_argument(
        "--startup-s",
        type=float,
        default=12.0,
        help="the group's modelled start-up (default 12: a torch node's, measured)",
    )
    ap.add_argument(
        "--prior-tokens-per-s",
        type=float,
        default=2000.0,
        help="the autoscaler's per-node prefill speed prior (default 2000)",
    )
    ap.add_argument(
        "--quiet-s",
        type=float,
        default=90.0,
        help="how long to wait after the burst for the pool to shrink (default 90)",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the working folder (model, file, logs); removed by default",
    )
    args = ap.parse_args()
    from prfaas.engine.torch.tiny import make_tiny

    tmp = Path(tempfile.mkdtemp(prefix="prfaas-elastic-torch-"))
    model = make_tiny("qwen3_next", tmp / "model")
    path = tmp / "elastic.yaml"
    path.write_text(yaml.safe_dump(deployment(model, args.startup_s, args.prior_tokens_per_s)))
    workdir = tmp / "work"
    proc = subprocess.Popen(
        [sys.executable, "-m", "prfaas.cli", "up", str(path), "--workdir", str(workdir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    groups: set[int] = set()
    try:
        assert proc.stdout is not None
        t_up = time.monotonic()
        for line in proc.stdout:
            if "autoscaling the PrfaaS pool" in line:
                break
        else:
            print("prfaas up ended before it was ready", file=sys.stderr)
            return 1
        print(f"up in {time.monotonic() - t_up:.1f} s ({path})", flush=True)
        resolved = yaml.safe_load((workdir / "deployment.resolved.yaml").read_text())
        url = f"http://127.0.0.1:{resolved['gateway']['port']}"
        t0 = time.time()
        results = asyncio.run(burst(url, args.requests, args.concurrency, random.Random(7)))
        t_burst = time.time() - t0
        deadline = time.monotonic() + args.quiet_s
        while time.monotonic() < deadline:
            started, removed = added(workdir, "started"), added(workdir, "removed")
            if started and set(started) <= set(removed):
                break
            time.sleep(0.5)
        groups |= {int(e["detail"].rsplit(" ", 1)[1]) for e in events(workdir)
                   if e["kind"] == "started"}  # fmt: skip
        started, removed = added(workdir, "started"), added(workdir, "removed")
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        decisions = re.findall(r"prfaas_autoscale_decisions_total\{(.*?)\} ([0-9.e+]+)", metrics)
        ok = [r for r in results if r[2]]
        first_add = min(started.values(), default=None)
        before = [s for t, s, _ in ok if first_add is None or t < first_add]
        after = [s for t, s, _ in ok if first_add is not None and t >= first_add]

        def p(xs: list[float], q: float) -> str:
            return f"{statistics.quantiles(xs, n=10)[int(q * 10) - 1]:.2f}" if len(xs) >= 2 else "-"

        print(f"burst: {len(ok)}/{len(results)} completed in {t_burst:.1f} s")
        for name in sorted(started):
            gone = removed.get(name)
            print(
                f"  {name}: started {started[name] - t0:+.1f} s, removed "
                f"{'-' if gone is None else f'{gone - t0:+.1f} s'} (from the burst's start)"
            )
        print(f"nodes added {len(started)}, removed {len(removed)}")
        print(
            "decisions: "
            + ", ".join(
                f"{labels} = {v}" for labels, v in decisions if 'action="hold"' not in labels
            )
        )
        print(
            f"request seconds P50/P90: before the first add {p(before, 0.5)}/{p(before, 0.9)} "
            f"({len(before)}), after {p(after, 0.5)}/{p(after, 0.9)} ({len(after)})"
        )
        return 0 if len(ok) == len(results) else 1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(60)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        for g in groups:
            with contextlib.suppress(OSError):
                os.killpg(g, signal.SIGKILL)
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
