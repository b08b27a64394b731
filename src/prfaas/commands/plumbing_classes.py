"""The pieces both plumbing measurements share (``commands.profile_plumbing``: a torch
deployment's; ``commands.profile_deployment``: a vLLM one's): a deployment started for them, the
classes of requests sent through its gateway, each process's CPU per request of a class, what
the nodes count over a class (``Counters``: decode steps, each engine's forward CPU), and a
relay's CPU split into per request, per step and per token (``relay_terms``).

Not pure (processes, HTTP, ``/proc``, the clock): the command helpers' own helper.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError

SHORT_PROMPT_TOKENS = 64
OUTPUT_TOKENS = 32
BATCH = 8
"""Requests decoding at once in the batched class (the split of the decode node's terms)."""
RELAY_BATCHES = (BATCH, 32)
"""Requests decoding at once in the batched classes the relays' terms are fitted over
(``relay_terms``): one size put the whole split on one class."""
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


Pids = int | tuple[int, ...]
"""A process, or a group of processes counted together (a vLLM server and its engine core)."""


def process_cpu_s(pid: Pids) -> float:
    """User + system CPU seconds of process ``pid`` (or of each of a group, those still alive)
    so far (all its threads)."""
    if isinstance(pid, tuple):
        total = 0.0
        for p in pid:
            with contextlib.suppress(OSError):  # gone since it was listed
                total += process_cpu_s(p)
        return total
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
        self.at_times([(0.0, prompt, output)] * count, concurrency)

    def at_times(self, requests: list[tuple[float, int, int]], concurrency: int = 1) -> list[Any]:
        """Sends ``(arrival offset s, prompt tokens, output tokens)`` requests at their offsets;
        their ``RequestResult``s in order (each checked whole)."""
        from prfaas.serve.loadgen import BenchRequest, run_workload

        reqs = [BenchRequest(next(self._index), at, prompt, output)
                for at, prompt, output in requests]  # fmt: skip
        results, _ = asyncio.run(
            run_workload(reqs, base_url=self.url, model=self.model, synth=self._synth,
                         concurrency=concurrency, timeout_s=300,
                         extra_body={"ignore_eos": True})
        )  # fmt: skip
        bad = [r for r in results if not r.ok]
        if bad:
            raise UsageError(f"plumbing measurement: a request failed: {bad[0].reason}")
        for r, (_, _, output) in zip(results, requests, strict=True):
            if r.num_output_tokens != output:
                raise UsageError(
                    f"plumbing measurement: asked for {output} tokens, got {r.num_output_tokens}"
                )
        return results


def process_tree(pid: int) -> tuple[int, ...]:
    """``pid`` and every live descendant (a vLLM site's sidecar, its server's API, engine core
    and worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue  # gone since the listing
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return tuple(out)


def idle_rates(pids: Mapping[str, Pids]) -> dict[str, float]:
    """Each process's CPU seconds per second while nothing is sent (``IDLE_S`` of it): its
    heartbeats and polling, taken out of every class's figure."""
    t0, cpu0 = time.perf_counter(), {n: process_cpu_s(p) for n, p in pids.items()}
    time.sleep(IDLE_S)
    wall = time.perf_counter() - t0
    return {n: (process_cpu_s(p) - cpu0[n]) / wall for n, p in pids.items()}


def class_cpu(
    pids: Mapping[str, Pids], idle: dict[str, float], requests: int, send: Callable[[], None]
) -> dict[str, float]:
    """Each process's CPU seconds per request while ``send()`` sends ``requests`` requests, its
    idle rate removed (a negative figure, noise, read as 0)."""
    w0, c0 = time.perf_counter(), {n: process_cpu_s(p) for n, p in pids.items()}
    send()
    wall = time.perf_counter() - w0
    return {
        n: max(0.0, process_cpu_s(p) - c0[n] - idle[n] * wall) / requests for n, p in pids.items()
    }


def batched_classes(
    send: Sender, pids: Mapping[str, Pids], idle: dict[str, float], requests: int,
    counters: Callable[[], Counters], say: Callable[[str], None],
) -> dict[int, tuple[int, Counters, dict[str, float]]]:  # fmt: skip
    """Per batch size of ``RELAY_BATCHES``: (requests, what the nodes counted over them, each
    process's CPU seconds) of a class of short prompts with ``OUTPUT_TOKENS`` tokens, that many
    decoding at once (a new one starts as one ends), at least twice the batch of them."""
    out = {}
    at = counters()
    for batch in RELAY_BATCHES:
        n = max(requests, 2 * batch)
        say(f"plumbing: {n} requests, {batch} at once, {OUTPUT_TOKENS} output tokens")
        run = functools.partial(send, SHORT_PROMPT_TOKENS, OUTPUT_TOKENS, n, concurrency=batch)
        cpu = class_cpu(pids, idle, 1, run)
        after = counters()
        out[batch] = (n, after.since(at), cpu)
        at = after
    return out


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


@dataclass(frozen=True, slots=True)
class Counters:
    """What the nodes count that a class's CPU is read against, as they last reported it (or
    over a class: ``since``)."""

    decode_steps: int
    """The decode nodes' steps, summed (a vLLM site's server reports its engine steps:
    ``serve.vllm.metrics``)."""
    forward_cpu_s: Mapping[str, float]
    """Per node, its engine thread's CPU in the model's forward passes alone (torch nodes: what
    the profile's curves price; 0 elsewhere)."""
    engine_cpu_s: Mapping[str, float]
    """Per node, its engine thread's CPU in its slices (the passes with their sampling, hand-out
    and cache copies)."""

    def since(self, before: Counters) -> Counters:
        return Counters(
            self.decode_steps - before.decode_steps,
            {n: v - before.forward_cpu_s.get(n, 0.0) for n, v in self.forward_cpu_s.items()},
            {n: v - before.engine_cpu_s.get(n, 0.0) for n, v in self.engine_cpu_s.items()},
        )


def reported_counters(launcher: Any, heartbeat_s: float) -> Counters:
    """The nodes' ``Counters`` once their reports have caught up (three heartbeats)."""
    time.sleep(3 * heartbeat_s + 0.3)
    nodes = launcher.nodes()
    return Counters(
        sum(int(r.get("decode_steps", 0)) for r in nodes if r.get("role") == "decode"),
        {str(r["node"]): float(r.get("forward_cpu_s", 0.0)) for r in nodes},
        {str(r["node"]): float(r.get("engine_cpu_s", 0.0)) for r in nodes},
    )


def relay_terms(
    process: str, classes: list[tuple[int, int, int, dict[str, float]]]
) -> tuple[float, float, float | None, str]:
    """``process``'s relay terms (per request, per output token, per step or None, how) from
    ``classes``: ``(requests, steps, tokens, CPU seconds per process)``, the first two one
    request at a time with 1 and ``OUTPUT_TOKENS`` tokens, then the batched ones
    (``perf.relay_fit``: least squares over all of them). Where the batched classes made no
    batch (no more tokens than steps) the two sequential classes give the per-request figure
    and one wake-up plus one token, per step left None."""
    from prfaas.perf.relay_fit import RelayClass, fit_relay

    rows = [RelayClass(n, max(1, s), t, max(0.0, cpu[process])) for n, s, t, cpu in classes]
    try:
        fit = fit_relay(rows)
    except ValueError:
        (n1, _, _, one), (nk, _, _, many) = classes[:2]
        tok = (many[process] / nk - one[process] / n1) / (OUTPUT_TOKENS - 1)
        return one[process] / n1 - tok, tok, None, "; no batched class made a batch: not split"
    return fit.per_request_s, fit.per_output_token_s, fit.per_step_s, "; " + fit.describe(rows)
