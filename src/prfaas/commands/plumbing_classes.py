"""The pieces both plumbing measurements share (``commands.profile_plumbing``: a torch
deployment's; ``commands.profile_deployment``: a vLLM one's): a deployment started for them, the
classes of requests sent through its gateway, each process's CPU per request of a class, the
decode nodes' step count, and the split of a relay's batch-1 per-token CPU into per step and per
token.

Not pure (processes, HTTP, ``/proc``, the clock): the command helpers' own helper.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError

SHORT_PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32
BATCH = 8
"""Requests decoding at once in the batched class (the split of the decode node's terms)."""
IDLE_S = 2.0


def started(d: Any, workdir: Path, what: str, hint: str = "") -> Any:
    """``d`` launched in ``workdir`` (a ``serve.Launcher``, started; the caller stops it), or a
    ``UsageError`` saying in one line why it did not start (``what``: the command's words)."""
    from prfaas.serve.launch_errors import LaunchError
    from prfaas.serve.launcher import Launcher

    launcher = Launcher(d, workdir)
    try:
        launcher.start()  # stops what it started when it fails
    except LaunchError as exc:
        raise UsageError(
            f"{what}: the deployment did not start ({launch_failure(exc)}){hint}"
        ) from None
    return launcher


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sender:
    """Sends a class of requests through a deployment's gateway and checks each answered in full
    (``ignore_eos``: exactly the tokens asked for); fresh random prompts (no prefix hits)."""

    def __init__(self, url: str, model: str, seed: int) -> None:
        from prfaas.serve.loadgen import PromptSynth

        self.url, self.model = url, model
        self._synth = PromptSynth(seed=seed, vocab_size=256)
        self._index = iter(range(1, 1 << 30))

    def __call__(self, prompt: int, output: int, count: int, concurrency: int = 1) -> None:
        from prfaas.serve.loadgen import BenchRequest, run_workload

        reqs = [BenchRequest(next(self._index), 0.0, prompt, output) for _ in range(count)]
        results, _ = asyncio.run(
            run_workload(reqs, base_url=self.url, model=self.model, synth=self._synth,
                         concurrency=concurrency, timeout_s=300,
                         extra_body={"ignore_eos": True})
        )  # fmt: skip
        bad = [r for r in results if not r.ok]
        if bad:
            raise UsageError(f"plumbing measurement: a request failed: {bad[0].reason}")
        short = [r for r in results if r.num_output_tokens != output]
        if short:
            raise UsageError(
                f"plumbing measurement: asked for {output} tokens, got {short[0].num_output_tokens}"
            )


def idle_rates(pids: dict[str, int]) -> dict[str, float]:
    """Each process's CPU seconds per second while nothing is sent (``IDLE_S`` of it): its
    heartbeats and polling, taken out of every class's figure."""
    t0, cpu0 = time.perf_counter(), {n: process_cpu_s(p) for n, p in pids.items()}
    time.sleep(IDLE_S)
    wall = time.perf_counter() - t0
    return {n: (process_cpu_s(p) - cpu0[n]) / wall for n, p in pids.items()}


def class_cpu(
    pids: dict[str, int], idle: dict[str, float], requests: int, send: Callable[[], None]
) -> dict[str, float]:
    """Each process's CPU seconds per request while ``send()`` sends ``requests`` requests, its
    idle rate removed (a negative figure, noise, read as 0)."""
    w0, c0 = time.perf_counter(), {n: process_cpu_s(p) for n, p in pids.items()}
    send()
    wall = time.perf_counter() - w0
    return {
        n: max(0.0, process_cpu_s(p) - c0[n] - idle[n] * wall) / requests for n, p in pids.items()
    }


def launch_failure(exc: BaseException) -> str:
    """One line for a deployment that did not start: what failed and the error its log ended
    with (the log is in a scratch folder removed on the way out, so it is named, not pointed
    at)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    what = re.sub(r"\s*\(log [^)]*\):?$", "", lines[0])
    errors = [line for line in lines[1:] if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return f"{what}: {errors[-1]}" if errors else what


def reported_steps(launcher: Any, heartbeat_s: float) -> int:
    """The decode nodes' step counts summed, once their reports have caught up (a vLLM site's
    server reports its engine steps: ``serve.vllm.metrics``)."""
    time.sleep(3 * heartbeat_s + 0.3)
    return sum(int(r.get("decode_steps", 0)) for r in launcher.nodes() if r.get("role") == "decode")


def split_relay(
    per_request_s: float, per_token_s: float, batched_cpu_s: float,
    num_requests: int, num_steps: int, num_tokens: int,
) -> tuple[Any, str]:  # fmt: skip
    """A relaying process's per-token CPU at batch 1 (``per_token_s``: one wake-up and one
    token, each token its own step there) split into per step and per token
    (``perf.plumbing.split_decode_live``) with its CPU in a batched class: ``num_requests``
    requests, each its fixed cost (``per_request_s``), whose ``num_tokens`` tokens came in
    ``num_steps`` steps. ``(DecodeSplit, how)``; None where the class made no batch (no more
    tokens than steps)."""
    from prfaas.perf.plumbing import split_decode_live

    if not num_tokens > num_steps > 0:
        return None, ""
    beyond_s = batched_cpu_s - num_requests * per_request_s
    split = split_decode_live(per_token_s, beyond_s, num_steps, num_tokens)
    how = (
        f"; split from the batch-1 figure {per_token_s:.4g} s by its CPU with {BATCH} requests at "
        f"once ({num_requests} requests, {num_tokens} tokens in {num_steps} steps, "
        f"{batched_cpu_s:.4g} CPU s): per step {split.per_step_s:.4g} s, per token "
        f"{split.per_output_token_s:.4g} s"
    ) + "".join(f"; {c}" for c in split.clipped)
    return split, how
