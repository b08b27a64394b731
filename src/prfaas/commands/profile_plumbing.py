"""``prfaas profile --engine torch``'s plumbing terms: what a live request pays around the forward
passes, measured through a real deployment of the profiled model (``perf.plumbing``).

A one-site deployment (the gateway, one torch prefill node, one torch decode node, each its own
process, ``router: local_only``) is launched on this host with ``serve.Launcher``; requests go
through its HTTP API one at a time (nothing queued), in four classes: short prompts with one
output token, short prompts with ``K`` output tokens, long and middle-sized prompts with one
output token (fresh random prompts, so no prefix hits); then short prompts with ``K`` tokens,
8 and 32 at once (``RELAY_BATCHES``). Each process's CPU time (user + system, all threads, from
``/proc``), less its idle rate measured beforehand, divided by the requests, gives per process
and class the CPU one request costs; the terms are differences of classes (or a line or a
least-squares fit through them), beyond the forward passes where a node computes. Those passes
are what the nodes' engines counted over the same requests (``forward_cpu_s``: their engine
thread's CPU in the model's forward passes, ``engine.torch.forward_clock``) on a CPU with one
torch thread a node (``in_service``); else (a GPU, more threads) the profile's curve for them.
Read against passes timed at another moment, every term moved 30-70% between three profiles of
the same code within 90 minutes (docs/fidelity.md, the twenty-seventh round): the machine's
speed between the two moments landed in them.

- ``gateway_per_request_s``, ``gateway_per_step_s`` and ``gateway_per_output_token_s``: the
  gateway's CPU over the short, K and batched classes (K tokens, 8 and 32 at once:
  ``RELAY_BATCHES``), split by least squares (``perf.relay_fit``; its wake-ups: one per request
  for the first token, one per decode step the node counted);
- ``decode_per_kv_byte_s``: the decode node's CPU, (long class - short class) over the KV bytes
  between them (it runs no forward pass for a one-token request: the prefill sampled it);
- ``decode_per_output_token_s`` and ``decode_per_step_s``: the decode node's CPU beyond the
  requests' fixed costs (the short class's) and the forward passes of its steps, in each class
  that decoded: ``K`` tokens one request at a time (a step a token: what one token
  costs beyond the forward pass at batch 1, one step's overhead plus one token's) and the
  batched classes (``RELAY_BATCHES``, the steps counted by the decode node), split by weighted
  least squares (``perf.plumbing.split_decode_live``): ``decode_per_step_s`` once per step, the
  rest ``decode_per_output_token_s``. Both read 0 (the classes cost no more than the passes
  they are read against) is said on the terminal and in ``how``, and so are the passes against
  the curve's price for them (said, not stored). The engine's step overhead measured
  in the profiling process (``commands.profile_step``) is recorded beside it, and splits the
  batch-1 figure only if no batched class made a batch (``split_decode_overhead``); with
  neither, the per-step term is left missing;
- ``prefill_per_token_s`` and ``prefill_per_request_s``: the slope and intercept of a
  least-squares line (``perf.plumbing.line_fit``) through the prefill node's CPU beyond its
  forward passes in the one-token classes (short, a middle class of 1,024-token prompts, long):
  the engine's work around its passes (its cache and checkpoint copies, the layers handed out)
  and the KV stream's; two classes alone traded the terms off between profiles;
- ``prefill_in_service_excess``: those passes as the node counted them over the profile's curve
  for them, summed over the classes, less 1 (``perf.plumbing.in_service_excess``): what the two
  terms above are read beyond, charged nowhere else; stored below 0 too (not floored like the
  seconds terms: a ratio under 1 is a measurement, the passes ran faster in service); missing
  where the passes are the curve's;
- ``decode_per_request_s``: the decode node's
  CPU of the short class less its KV bytes' (it runs no forward pass for a one-token request).
  The simulator charges each on its node;
- ``first_token_wait_s`` and ``first_token_wait_per_decoding_s``: probes sent while batches
  decode, against the simulator with every other term (``commands.profile_first_token``), once
  ``shared_core_overhead`` is known (``with_plumbing``); said in the how and both left missing
  (the measurement's gateway shares its nodes' core, a deployment's need not).

CPU is counted in clock ticks (10 ms): the figures are means over ``requests`` requests per
class; a difference that comes out negative (noise) is stored as 0 and said so in ``how``.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from prfaas.commands.plumbing_classes import (
    OUTPUT_TOKENS,
    SHORT_PROMPT_TOKENS,
    Counters,
    Sender,
    batched_classes,
    class_cpu,
    idle_rates,
    relay_terms,
    reported_counters,
    started,
)
from prfaas.commands.profile_first_token import ProbeClass, probe_live, with_first_token_wait
from prfaas.errors import UsageError

LONG_PROMPT_TOKENS = 4096
PASS_NOISE = 0.03
"""How closely a class's forward passes repeat, relative (the torch profiles' ``spread_s`` over
``median_s`` at 1,024-8,192 tokens: 2-6%, 2026-12-05): weighs the decode node's classes by the
size of their work in its split (``perf.plumbing.split_decode_live``)."""
TICK_S = 0.01
"""A CPU clock tick (``/proc`` counts in ticks)."""
STEP_LONG_CONTEXT = 1024
"""The longer context the engine's decode step overhead is measured at (``context_cost``)."""
PROCESSES = ("gateway", "p0", "d0")


@dataclass(frozen=True, slots=True)
class ClassCpu:
    """Mean CPU seconds per request of one class, per process, idle rate removed, and what the
    nodes counted over the whole class (``Counters``: their forward passes' CPU, decode steps)."""

    prompt_tokens: int
    output_tokens: int
    requests: int
    per_process_s: dict[str, float]
    counted: Counters

    def forward_s(self, node: str) -> float:
        """``node``'s engine thread's CPU in the model's forward passes, per request."""
        return self.counted.forward_cpu_s.get(node, 0.0) / self.requests


def deployment_text(model_name: str, model_path: Path, profile: Path, threads: int) -> str:
    """The one-site deployment measured. Its processes run on this process's cores (they
    inherit its affinity: ``taskset -c 0 prfaas profile`` puts all three on core 0), which the
    file says (the site's and the gateway's ``cpus``), so that the simulator the probes are read
    against (``commands.profile_first_token``) shares those cores among them as they did; its
    decode batch is the torch engine kind's, the engine's own (``ENGINE_DECODE_MAX_BATCH``)."""
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    d = {
        "engine": {
            "kind": "torch", "model": model_name, "model_path": str(model_path.resolve()),
            "threads": threads,
        },
        "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 600, "cpus": cores},
        "policy": {"router": "local_only", "tune_min_samples": 1_000_000},
        "sites": [{
            "name": "pd", "kind": "pd", "hardware": str(profile.resolve()),
            "engine": {"cpus": cores},
            "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
        }],
        "psk": secrets.token_hex(16),
    }  # fmt: skip
    return "# Written by prfaas profile: the deployment its plumbing terms are measured on.\n" + (
        yaml.safe_dump(d, sort_keys=False)
    )


@dataclass(frozen=True, slots=True)
class Measured:
    """What ``measure`` measured: the terms and how, and the probe classes for
    ``first_token_wait_per_decoding_s``, fitted once every other term is known, on the
    deployment ``deployment`` (``commands.profile_first_token``)."""

    costs: Any
    how: tuple[tuple[str, str], ...]
    probes: tuple[ProbeClass, ...]
    deployment: Any


def measure(
    model_name: str,
    model_path: Path,
    profile: Path,
    workdir: Path,
    *,
    requests: int,
    threads: int,
    seed: int,
    long_prompt_tokens: int,
    mid_prompt_tokens: int | None = None,
    say: Callable[[str], None],
    engine_overhead_s: dict[int, float] | None = None,
    decode_per_context_token_s: float | None = None,
    in_service: bool = True,
) -> Measured:
    """The terms measured on a deployment whose nodes' hardware is ``profile``
    (the forward-pass profile just measured). ``engine_overhead_s``: the engine's decode step
    overhead beyond its forward pass per batch size (``profile_step``), to split the decode
    node's per-token figure; None leaves ``decode_per_step_s`` missing.
    ``decode_per_context_token_s``: the engine's per-context-token step cost (``context_cost``),
    taken out of the classes' decode CPU before the per-token and per-step terms are read from
    it, and stored with them; None leaves it missing (charged as 0). ``in_service``: read each
    node's CPU beyond its own forward passes as it reports them (``forward_cpu_s``; a CPU node
    with one torch thread, whose engine thread runs its passes whole), else beyond the profile's
    curve for them (``prefill_in_service_excess`` then missing)."""
    from prfaas.config import load_deployment
    from prfaas.perf.plumbing import (
        DecodeClass,
        DecodeSplit,
        PlumbingCosts,
        engine_in_service_how,
        in_service_excess,
        line_fit,
        split_decode_live,
        split_decode_overhead,
    )
    from prfaas.perf.profile_costs import cost_model_from_profile_file
    from prfaas.perf.profile_read import load_profile_file

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "plumbing-deployment.yaml"
    path.write_text(deployment_text(model_name, model_path, profile, threads), encoding="utf-8")
    d = load_deployment(path)  # a UsageError naming the field
    cm = cost_model_from_profile_file(profile)
    say("plumbing: starting a one-site deployment (gateway, prefill node, decode node)")
    launcher = started(
        d, workdir / "plumbing-run", "plumbing measurement", "; --no-plumbing skips it"
    )
    try:  # started() stopped what it started if it failed; stop() the rest here
        send = Sender(launcher.url, model_name, seed)
        pids = {name: launcher.child(name).proc.pid for name in PROCESSES}
        send(SHORT_PROMPT_TOKENS, 2, 2)  # warm-up: first passes allocate, load lazily
        send(long_prompt_tokens, 1, 1)
        idle = idle_rates(pids)

        def counters() -> Counters:
            return reported_counters(launcher, d.heartbeat_interval_s)

        counted_at = [counters()]  # the classes run back to back: one snapshot between two

        def cls(prompt: int, output: int) -> ClassCpu:
            say(f"plumbing: {requests} requests of {prompt} prompt, {output} output tokens")
            cpu = class_cpu(pids, idle, requests, lambda: send(prompt, output, requests))
            after = counters()
            counted, counted_at[0] = after.since(counted_at[0]), after
            return ClassCpu(prompt, output, requests, cpu, counted)

        short = cls(SHORT_PROMPT_TOKENS, 1)
        tokens = cls(SHORT_PROMPT_TOKENS, OUTPUT_TOKENS)
        long = cls(long_prompt_tokens, 1)
        # A third size between them for the prefill node's two terms (least squares).
        mid = cls(mid_prompt_tokens, 1) if mid_prompt_tokens else None
        # The batched classes: K tokens, 8 and 32 decoding at once (the gateway's and the
        # decode node's splits read them all).
        batched = batched_classes(
            send, {n: pids[n] for n in ("d0", "gateway")}, idle, requests, counters, say
        )
        probes = probe_live(send, say)
    finally:
        launcher.stop()
    notes: dict[str, str] = {}
    steps_batch1 = tokens.counted.decode_steps

    def floor0(name: str, value: float) -> float:
        if value < 0:
            said = f"measured {value:.3g}, stored 0 (below the noise)"
            notes[name] = f"{notes[name]}; {said}" if name in notes else said
            return 0.0
        return value

    # The gateway relays each first token as it comes from the prefill node, the rest a decode
    # step at a time: its wake-ups are the decode node's steps and one a request.
    gw_classes = [
        (requests, requests, requests, {"gateway": short.per_process_s["gateway"] * requests}),
        (requests, steps_batch1 + requests, requests * OUTPUT_TOKENS,
         {"gateway": tokens.per_process_s["gateway"] * requests}),
        *((n, c.decode_steps + n, n * OUTPUT_TOKENS, cpu) for n, c, cpu in batched.values()),
    ]  # fmt: skip
    gw_req, gw_tok, gw_step_or_none, gw_how = relay_terms("gateway", gw_classes)
    gw_req = floor0("gateway_per_request_s", gw_req)
    gw_tok = floor0("gateway_per_output_token_s", gw_tok)

    # The decode node: its CPU beyond its forward passes. In service, the passes it ran over
    # the same requests (its engine's forward_cpu_s); else the profile's price for them.
    per_ctx_copy = decode_per_context_token_s or 0.0
    ctx_missing = ("decode_per_context_token_s",) if decode_per_context_token_s is None else ()

    def priced_decode_s(n: int, num_steps: int) -> float:
        """The curve's price of ``n`` requests' ``OUTPUT_TOKENS - 1`` steps in ``num_steps``:
        each step at the class's mean batch and context (the simulator prices each step so; a
        line through batch 1 and 2 missed that the engine steps a lone request as two rows)."""
        batch = max(1, round(n * (OUTPUT_TOKENS - 1) / num_steps))
        return num_steps * cm.decode_step_s(batch, round(context_tokens(n) / num_steps))

    def context_tokens(n: int) -> int:
        """The contexts those steps read, summed: the engine copies each (``per_ctx_copy``)."""
        return n * ((OUTPUT_TOKENS - 1) * SHORT_PROMPT_TOKENS
                    + (OUTPUT_TOKENS - 1) * OUTPUT_TOKENS // 2)  # fmt: skip

    def decode_forward_s(n: int, output: int, num_steps: int, counted: Counters) -> float:
        """The passes ``n`` requests of ``output`` tokens ran at the decode node, in
        ``num_steps`` steps (none for one token: the prefill sampled it)."""
        if in_service:
            return counted.forward_cpu_s.get("d0", 0.0)
        return priced_decode_s(n, num_steps) if output > 1 else 0.0

    tokens_batch1 = requests * (OUTPUT_TOKENS - 1)  # one step a token
    # Per request, the decode node's CPU beyond its passes.
    d_s, d_k, d_l = (
        c.per_process_s["d0"]
        - decode_forward_s(requests, c.output_tokens, tokens_batch1, c.counted) / requests
        for c in (short, tokens, long)
    )
    kv_short, kv_long = cm.kv_bytes(SHORT_PROMPT_TOKENS), cm.kv_bytes(long_prompt_tokens)
    per_byte = floor0("decode_per_kv_byte_s", (d_l - d_s) / (kv_long - kv_short))
    # K - 1 tokens a request, one step each, less the engine's copies of their contexts.
    batch1 = (d_k - d_s - per_ctx_copy * context_tokens(1)) / (OUTPUT_TOKENS - 1)
    per_tok, per_step, split_how = batch1, 0.0, ""
    missing: tuple[str, ...] = ("decode_per_step_s",)
    # Every class that decoded, each its CPU beyond the requests' fixed costs (the short
    # class's, per request), its passes and the engine's copies of its contexts: one request
    # at a time, then the batched classes (RELAY_BATCHES).
    one_at_a_time = DecodeClass(
        tokens_batch1, tokens_batch1, batch1 * tokens_batch1,
        decode_forward_s(requests, OUTPUT_TOKENS, tokens_batch1, tokens.counted),
    )  # fmt: skip

    def decode_class(n: int, counted: Counters, cpu_s: float) -> DecodeClass:
        forward_s = decode_forward_s(n, OUTPUT_TOKENS, counted.decode_steps, counted)
        beyond = cpu_s - n * d_s - forward_s - per_ctx_copy * context_tokens(n)
        return DecodeClass(counted.decode_steps, n * (OUTPUT_TOKENS - 1), beyond, forward_s)

    decoded = [one_at_a_time] + [decode_class(n, c, cpu["d0"]) for n, c, cpu in batched.values()
                                 if c.decode_steps > 0]  # fmt: skip
    read_against = "its passes' CPU as it counted them" if in_service else "the profile's passes"
    live_how = f"; beyond the fixed costs and {read_against}: " + ", ".join(
        f"{c.num_tokens} tokens in {c.num_steps} steps {c.beyond_s:.4g} s (passes "
        f"{c.forward_s:.4g} s)" for c in decoded
    )  # fmt: skip
    if in_service:  # said, not stored: the simulator prices the passes at the curve
        priced = [priced_decode_s(requests, tokens_batch1)] + [
            priced_decode_s(n, c.decode_steps) for n, c, _ in batched.values() if c.decode_steps > 0
        ]
        live_how += "; those passes against the curve's price for them: " + ", ".join(
            f"{c.forward_s / p:.2f}x" for c, p in zip(decoded, priced, strict=True) if p > 0
        )
    live_how += f" (the batch-1 class's steps counted: {steps_batch1})"
    try:
        live: DecodeSplit | None = split_decode_live(decoded, PASS_NOISE, TICK_S)
    except ValueError:  # no batched class made a batch
        live = None
    if live is not None:
        per_step, per_tok, missing = live.per_step_s, live.per_output_token_s, ()
        split_how = (
            f"; split by weighted least squares over {len(decoded)} classes, at batch "
            f"{', '.join(str(b) for b in (1, *batched))} (each weighed by {PASS_NOISE:.0%} of "
            f"its passes){live_how}: per step {per_step:.4g} s, per token {per_tok:.4g} s"
        ) + "".join(f"; {c}" for c in live.clipped)
        if engine_overhead_s is not None:
            engine = split_decode_overhead(engine_overhead_s, max(0.0, batch1))
            split_how += (f"; for comparison, engine.torch's own step overhead beyond the "
                          f"forward pass gives per step {engine.per_step_s:.4g} s")  # fmt: skip
        if per_step == 0.0 and per_tok == 0.0:
            decode_unmeasured = (
                "the decode node's classes cost no more than the forward passes they are read "
                "against: decode_per_step_s and decode_per_output_token_s stored 0, a relay the "
                "node does pay; re-profile on a quieter machine"
            )
            notes["decode_per_step_s"] = decode_unmeasured
            say(f"warning: {decode_unmeasured}")
    elif engine_overhead_s is not None:
        per_tok = floor0("decode_per_output_token_s", batch1)
        split = split_decode_overhead(engine_overhead_s, per_tok)
        per_step, per_tok, missing = split.per_step_s, split.per_output_token_s, ()
        overheads = ", ".join(f"{v * 1e3:.3g} ms at batch {b}" for b, v in
                              engine_overhead_s.items())  # fmt: skip
        split_how = (
            f"; split from the batch-1 figure {split.per_step_s + per_tok:.4g} s by the engine's "
            f"step overhead beyond the forward pass ({overheads}, {SHORT_PROMPT_TOKENS}-token "
            f"contexts): per step {split.per_step_s:.4g} s, engine per request "
            f"{split.engine_per_request_s:.4g} s"
        ) + "".join(f"; {c}" for c in split.clipped)
    else:
        per_tok = floor0("decode_per_output_token_s", batch1)

    # The prefill node: its CPU beyond its forward passes (its own, counted over the same
    # requests, else the profile's curve), per request and per prompt token, fitted over the
    # one-token classes.
    one_token = [c for c in (short, mid, long) if c is not None]

    def passes_of(c: ClassCpu) -> float:
        return c.forward_s("p0") if in_service else cm.prefill_s(c.prompt_tokens)

    beyond = {c.prompt_tokens: c.per_process_s["p0"] - passes_of(c) for c in one_token}
    # In service both figures are the same requests' (the /proc CPU in clock ticks over the
    # class); against the curve, each is as uncertain as the profiled passes (a few percent).
    sigma = {c.prompt_tokens: max(0.0 if in_service else PASS_NOISE * passes_of(c),
                                  TICK_S / requests) for c in one_token}  # fmt: skip
    prefill_req, prefill_tok = line_fit(beyond, sigma)
    if prefill_tok == 0.0:
        notes["prefill_per_token_s"] = "the fitted slope was negative (noise): stored 0"
    decode_req = d_s - per_byte * kv_short
    excess, excess_how = (
        in_service_excess({c.prompt_tokens: passes_of(c) for c in one_token}, cm.prefill_s)
        if in_service else (None, "")
    )  # fmt: skip
    prefill_points = load_profile_file(profile).prefill
    smallest = min((pt.new_tokens for pt in prefill_points.points if pt.cached_tokens == 0),
                   default=None) if prefill_points is not None else None  # fmt: skip
    if smallest is not None and smallest > SHORT_PROMPT_TOKENS:
        # The curve's value here is extrapolated: its error lands in this term (profile with
        # --new-tokens from 64, as the default grid does).
        notes["prefill_per_request_s"] = (
            f"the profile's prefill curve is extrapolated below its smallest point "
            f"({smallest} tokens) to {SHORT_PROMPT_TOKENS}: add --new-tokens {SHORT_PROMPT_TOKENS}"
        )
    costs = PlumbingCosts(
        floor0("prefill_per_request_s", prefill_req), floor0("decode_per_request_s", decode_req),
        per_byte, per_tok, gw_req, gw_tok, per_step, prefill_per_token_s=prefill_tok,
        decode_per_context_token_s=per_ctx_copy,
        gateway_per_step_s=gw_step_or_none or 0.0,
        prefill_in_service_excess=excess or 0.0,  # signed: below 0 is a measurement too
        missing=(*missing, *ctx_missing,
                 *(() if gw_step_or_none is not None else ("gateway_per_step_s",)),
                 *(() if excess is not None else ("prefill_in_service_excess",))),
    )  # fmt: skip

    def passes_how(c: ClassCpu) -> str:
        curve = cm.prefill_s(c.prompt_tokens) * 1e3
        if not in_service:
            return f"passes {curve:.4g} ms, the curve's"
        return f"passes {passes_of(c) * 1e3:.4g} ms as the node counted them; the curve {curve:.4g}"

    where = ("as the prefill node counted them over the same requests (forward_cpu_s)"
             if in_service else "the profile's curve")  # fmt: skip
    prefill_fit_how = (
        f"a least-squares line over the one-token classes' CPU beyond their forward passes "
        f"({where}): "
        + ", ".join(
            f"{c.prompt_tokens} tokens {beyond[c.prompt_tokens] * 1e3:.4g} ms ({passes_how(c)})"
            for c in sorted(one_token, key=lambda c: c.prompt_tokens)
        )
    )
    common = (
        f"process CPU (/proc, idle rate removed) of a live one-site torch deployment, "
        f"{requests} sequential requests per class"
    )
    how = {
        "prefill_per_request_s": f"{common}; prefill node, the intercept of {prefill_fit_how}",
        "prefill_per_token_s": f"{common}; prefill node, the slope of {prefill_fit_how}",
        "decode_per_request_s": f"{common}; decode node, {SHORT_PROMPT_TOKENS}-token prompts, "
        f"less their {kv_short} KV bytes at decode_per_kv_byte_s",
        "decode_per_kv_byte_s": f"{common}; decode node, {long_prompt_tokens} vs "
        f"{SHORT_PROMPT_TOKENS}-token prompts ({kv_long} vs {kv_short} KV bytes)",
        "decode_per_output_token_s": f"{common}; decode node, {OUTPUT_TOKENS} vs 1 output "
        f"tokens, beyond {read_against}{split_how}",
        "gateway_per_request_s": f"{common}; gateway process{gw_how}",
        "gateway_per_output_token_s": f"{common}; gateway{gw_how}",
    }
    if gw_step_or_none is not None:
        how["gateway_per_step_s"] = f"{common}; gateway{gw_how}"
    if excess_how:  # measured, or why not
        how["prefill_in_service_excess"] = excess_how + engine_in_service_how(
            {c.prompt_tokens: c.counted.engine_cpu_s.get("p0", 0.0) / c.requests
             for c in one_token}, cm.prefill_s, threads,
        )  # fmt: skip
    if engine_overhead_s is not None:
        how["decode_per_step_s"] = (
            f"engine.torch's decode step less its forward pass at batch sizes "
            f"{sorted(engine_overhead_s)} (wall, this process), the batch-independent part, "
            f"capped by the decode node's batch-1 per-token CPU ({common})"
        )
    if live is not None:
        how["decode_per_step_s"] = f"{common}; decode node, steps counted by the node{split_how}"
    for name, note in notes.items():
        how[name] += f"; {note}"
    return Measured(costs, tuple(how.items()), probes, d)


def with_plumbing(pf: Any, args: argparse.Namespace) -> Any:
    """``prfaas profile --engine torch``'s plumbing step: ``pf`` with its terms, measured on a
    live deployment whose nodes' hardware is ``pf`` itself (written to a scratch folder first,
    ``measure``), the engine's decode step overhead (``commands.profile_step``) and, on CPU,
    ``shared_core_overhead`` (``commands.profile_sharing``)."""
    import dataclasses
    import sys
    import tempfile

    from prfaas.commands.profile_step import DEFAULT_BATCH_SIZES as STEP_BATCHES
    from prfaas.commands.profile_step import engine_step_overheads
    from prfaas.perf.plumbing import PlumbingCosts, context_cost
    from prfaas.perf.profile_write import dump_profile_file

    if args.plumbing_requests < 2:
        raise UsageError(f"--plumbing-requests must be >= 2, got {args.plumbing_requests}")
    limit = pf.model.max_context_tokens or 4096

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    contexts = (SHORT_PROMPT_TOKENS, min(STEP_LONG_CONTEXT, limit // 2))
    say(f"plumbing: engine decode steps beyond the forward pass at batch sizes {STEP_BATCHES}, "
        f"contexts {contexts}")  # fmt: skip
    overheads = engine_step_overheads(
        args.model_path, device=args.device, batch_sizes=STEP_BATCHES, contexts=contexts,
        seed=args.seed + 2,
    )  # fmt: skip
    beyond = {key: engine_s - forward_s for key, (engine_s, forward_s) in overheads.items()}
    engine_overhead_s = {b: s for (b, c), s in beyond.items() if c == SHORT_PROMPT_TOKENS}
    per_context = context_cost(beyond)
    context_how = (
        f"engine.torch's decode step less its forward pass (wall, this process) at batch sizes "
        f"{list(STEP_BATCHES)} and contexts {list(contexts)}: "
        + ", ".join(f"{v * 1e3:.3g} ms at ({b}, {c})" for (b, c), v in beyond.items())
        + f"; the growth per batch context token, least squares: {per_context:.4g} s"
    )
    with tempfile.TemporaryDirectory(prefix="prfaas-plumbing-") as tmp:
        scratch = Path(tmp) / "forward.yaml"
        # Zeros, none missing: the forward passes only, without the missing-terms warning.
        dump_profile_file(dataclasses.replace(pf, plumbing=PlumbingCosts(missing=())), scratch)
        measured = measure(
            pf.model.name, args.model_path, scratch, Path(tmp), requests=args.plumbing_requests,
            threads=args.threads, seed=args.seed + 1, long_prompt_tokens=min(4096, limit // 2),
            mid_prompt_tokens=min(1024, limit // 8) if limit // 8 > SHORT_PROMPT_TOKENS else None,
            say=say, engine_overhead_s=engine_overhead_s, decode_per_context_token_s=per_context,
            # Each node's engine thread runs its passes whole on a CPU with one torch thread: its
            # forward CPU is theirs. On a GPU it launches them (the curve is the GPU's time);
            # with more threads it runs its share only: there, the curve's price.
            in_service=args.device == "cpu" and args.threads == 1,
        )  # fmt: skip
        costs, how = measured.costs, (*measured.how, ("decode_per_context_token_s", context_how))
        if args.device == "cpu" and args.sharing_rounds > 0:
            from prfaas.commands.profile_sharing import measure_shared_core_overhead

            say("plumbing: the CPU a node loses to a second busy process on its core")
            try:
                overhead, sharing_how = measure_shared_core_overhead(
                    args.model_path, pass_tokens=args.pass_tokens or 512, seed=args.seed + 3,
                    rounds=args.sharing_rounds,
                )  # fmt: skip
            except (RuntimeError, OSError) as exc:  # the second process did not start: say so
                say(f"plumbing: shared_core_overhead not measured ({exc}); charged as 0")
            else:
                costs = dataclasses.replace(costs, shared_core_overhead=overhead)
                how = (*how, ("shared_core_overhead", sharing_how))
        if "shared_core_overhead" not in dict(how):
            # Not measured (a GPU's kernels do not time-share a core this way, --sharing-rounds
            # 0, or the measurement failed): missing, charged as 0.
            costs = dataclasses.replace(costs, missing=(*costs.missing, "shared_core_overhead"))
        # Last, read against the simulator with every other term (the deployment reads the
        # scratch profile: inside this folder), said and not stored: this deployment's gateway
        # shares its nodes' core, and on torch nodes whose deployment pinned the gateway apart
        # the waits read here (17-30 ms alone, 0.5-2.3 ms per request decoding) made the
        # simulated TTFT longer than live (docs/fidelity.md, fifteenth round and its re-run).
        out = dataclasses.replace(pf, plumbing=costs, plumbing_how=how)
        return with_first_token_wait(out, measured.deployment, measured.probes, say, store=False)
