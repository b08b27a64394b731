"""``PlumbingCosts``: what the live system pays around the engine's forward passes.

The cost model's prefill and decode curves time the engine's work alone; a live request also pays
HTTP between client, gateway and nodes, KV session set-up and MACs, receiving, verifying and
installing KV bytes on the decode node, relaying each output token, and the gateway's own CPU.
Each term is measured (``prfaas profile``), stored in the profile file and charged by the
simulator to the process and core that pays it; the planner's capacity reads the same terms. A
term the profile did not measure is 0.0 and named in ``missing`` (the loader warns once).
``split_decode_overhead`` is the arithmetic that splits the decode node's batch-1 per-token CPU
into a per-step and a per-token term (``commands.profile_step`` measures its inputs).

Pure: no I/O, no clock; imports nothing from prfaas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

PLUMBING_TERMS = (
    "prefill_per_request_s",
    "decode_per_request_s",
    "decode_per_kv_byte_s",
    "decode_per_output_token_s",
    "gateway_per_request_s",
    "gateway_per_output_token_s",
    "decode_per_step_s",
    "shared_core_overhead",
    "prefill_per_token_s",
    "decode_per_context_token_s",
    "gateway_per_step_s",
    "first_token_wait_per_decoding_s",
    "first_token_wait_s",
    "prefill_in_service_excess",
)
RATIO_TERMS = ("shared_core_overhead", "prefill_in_service_excess")
"""The terms that are fractions of other work, not seconds."""
SIGNED_TERMS = ("prefill_in_service_excess",)
"""The terms that may be below 0, down to (not including) -1: a ratio of two timings of the same
work less 1, below 0 where the work ran faster in service than at the profile's curve (the price
stays ``1 + excess`` times the curve, above 0). Every other term is a cost: >= 0."""


@dataclass(frozen=True, slots=True)
class PlumbingCosts:
    prefill_per_request_s: float = 0.0
    """Fixed CPU seconds a prefill node process pays per request it prefills (its HTTP call, the
    KV session's set-up and MACs, the first token), beyond the forward pass, on its core."""
    decode_per_request_s: float = 0.0
    """Fixed CPU seconds a decode node process pays per request it decodes (its HTTP call, the
    KV session's set-up and verification, the first token's relay), beyond the per-byte and
    per-token terms, on its core."""
    decode_per_kv_byte_s: float = 0.0
    """Decode node CPU seconds per KV byte received, verified and installed."""
    decode_per_output_token_s: float = 0.0
    """Decode node CPU seconds per output token beyond the batched step's forward pass: its
    relay, and the engine's per-request work in a step (cache gather/split, sampling). Charged
    per request of each step's batch. Profiles written before ``decode_per_step_s`` existed
    measured it at batch 1, so it also holds the per-step overhead there."""
    gateway_per_request_s: float = 0.0
    """Gateway CPU seconds per request (HTTP in and out, tokenizing, routing)."""
    gateway_per_output_token_s: float = 0.0
    """Gateway CPU seconds per output token relayed to the client."""
    decode_per_step_s: float = 0.0
    """Decode node CPU seconds per decode step beyond its forward pass, whatever the batch (the
    engine's step loop: hand-off to the engine thread, the batch's bookkeeping). Measured with
    the engine stepping batches of two sizes (``commands.profile_plumbing``)."""
    shared_core_overhead: float = 0.0
    """CPU a node spends beyond its own work while another busy process time-shares its core
    (cache and context-switch losses), as a fraction of that work (0.05: 5% more): charged on
    shared cores only (``engine.cpus``, ``sim.processor.SharedCores``), on top of ``cores /
    demand``. Measured with a second pinned process running the same passes
    (``commands.profile_sharing``). Not seconds: a ratio."""
    prefill_per_token_s: float = 0.0
    """Prefill node CPU seconds per uncached prompt token beyond its forward passes: the
    engine's work around them (the prefill job's cache and checkpoint copies, each layer's KV
    handed out, the KV stream's framing and MACs). Measured with prompts of three lengths on the
    live node, beyond the passes it counted over the same requests
    (``commands.profile_plumbing``); charged with ``prefill_per_request_s``
    (``prefill_overhead_s``)."""
    decode_per_context_token_s: float = 0.0
    """Decode node CPU seconds per decode step per context token of its batch, beyond the
    profiled forward pass: the engine gathers its batch's caches into one (left-padded) every
    step, which copies every request's KV (``engine.torch``'s ``hf_cache.build_cache``), and
    hands each its cache back a token longer. Measured in the profiling process as the engine
    step's overhead beyond the forward pass at two contexts (``commands.profile_step``);
    charged in each step like the context term of the forward pass itself."""
    gateway_per_step_s: float = 0.0
    """Gateway CPU seconds per decode step of its home's decode nodes, beyond the per-token
    relay: one wake-up of its event loop relays every token a step emitted, so the relay of a
    batch of ``b`` streams costs this once plus ``b`` times ``gateway_per_output_token_s``.
    Measured with batched classes beside the sequential ones (``perf.relay_fit``); a profile
    without it measured the gateway's relay at batch 1, where both are one token's."""
    first_token_wait_per_decoding_s: float = 0.0
    """Seconds a request's first token waits, per request already decoding at its decode node,
    beyond the steps the cost model times: a latency, not CPU (the per-token terms charge the
    CPU). A new request's first token leaves through the processes that relay every stream's
    tokens (a vLLM server's API process, the sidecar, the gateway), each working through the
    batch's tokens of a step before it, on cores the steps keep busy: live, a 256-token
    prompt's TTFT grew ~3 ms per request decoding beside it (4 to 16 requests), the model's
    mixed step ~0.6 ms (issue 20, docs/fidelity.md). Measured with probes sent while batches
    of several sizes decode, against the simulator with every other term
    (``commands.profile_first_token``); charged on the TTFT only (the decode's own timing is
    the steps')."""
    first_token_wait_s: float = 0.0
    """Seconds a request's first token waits beyond the cost model with nothing decoding beside
    it: a latency, not CPU, per request (the hops between the processes a request crosses that
    no CPU term holds: the server's API process to its engine, the sidecar, the gateway's relay
    wake-ups). Measured with ``first_token_wait_per_decoding_s``, from the same probes: the
    median gap of those sent with nobody decoding (``perf.first_token_fit``); charged with it on
    the TTFT only. After the older terms, so positional construction keeps their order."""
    prefill_in_service_excess: float = 0.0
    """How much more a prefill node's forward passes cost in service than the profile's curve
    prices them, as a fraction of the curve (0.4: 40% more): the passes as the live
    deployment's prefill node counted them (its engine thread's CPU in them, ``forward_cpu_s``),
    one request at a time, against the curve's passes timed back to back
    (``commands.profile_plumbing``; since 2026-12-08; before, passes timed in the profiling
    process between the classes' requests: 1.2-1.4x on the slower machine of 2026-12-06,
    0.91-0.93x on 2026-12-07). ``prefill_per_request_s`` and ``prefill_per_token_s`` are read
    beyond those in-service passes, so without this the difference is charged nowhere. Charged
    on the prefill node with them, on the passes' seconds (``prefill_overhead_s``). Not
    seconds: a ratio, like ``shared_core_overhead``; unlike it, below 0 where the passes ran
    faster in service than at the curve (``SIGNED_TERMS``: above -1)."""
    missing: tuple[str, ...] = PLUMBING_TERMS
    """The terms the profile did not measure (each 0.0 here)."""
    approximated: tuple[str, ...] = ()
    """Terms read from an older profile's coarser figure (``LEGACY_TERMS``), not measured apart:
    named in the loader's one warning, like the missing ones."""

    def __post_init__(self) -> None:
        for name in PLUMBING_TERMS:
            value = getattr(self, name)
            if name in SIGNED_TERMS:
                if not -1.0 < value < float("inf"):
                    raise ValueError(f"plumbing term {name} must be above -1, got {value!r}")
            elif not value >= 0.0:
                raise ValueError(f"plumbing cost {name} must be >= 0, got {value!r}")
        for field in ("missing", "approximated"):
            unknown = set(getattr(self, field)) - set(PLUMBING_TERMS)
            if unknown:
                raise ValueError(f"unknown plumbing terms in {field}: {sorted(unknown)}")

    def prefill_overhead_s(self, num_new_tokens: int, passes_s: float) -> float:
        """The prefill node's CPU beyond the profile's price of one prefill of
        ``num_new_tokens`` uncached tokens whose forward passes the curve prices at
        ``passes_s``: its per-request and per-token terms and the passes' in-service excess.
        Below 0 where that excess is (a refund on the curve), never below ``-passes_s``."""
        return (self.prefill_per_request_s + self.prefill_per_token_s * num_new_tokens
                + self.prefill_in_service_excess * passes_s)  # fmt: skip


LEGACY_TERMS = {"node_per_request_s": ("prefill_per_request_s", "decode_per_request_s")}
"""Terms older profiles stored, and the terms each now reads as: ``node_per_request_s`` was one
figure (the mean of the prefill and the decode node's) charged on both nodes; the profile now
measures each node's apart (issue 20: 11.2 ms and 4.5 ms on the tiny Qwen3-Next here)."""

NO_PLUMBING = PlumbingCosts()
"""Nothing measured: every term 0.0 (the model of today's simulator)."""


@dataclass(frozen=True, slots=True)
class DecodeSplit:
    """The decode node's CPU beyond the forward pass, split into what a step costs once and
    what it costs per request of its batch (``split_decode_overhead``)."""

    per_step_s: float
    """``decode_per_step_s``."""
    per_output_token_s: float
    """``decode_per_output_token_s``: the live per-token figure at batch 1 less the per-step."""
    engine_per_request_s: float
    """The engine step's own per-request share (informational: inside ``per_output_token_s``;
    0.0 from ``split_decode_live``, which does not see it apart)."""
    clipped: tuple[str, ...] = ()
    """What had to be clipped (a negative slope or intercept, a per-step above the batch-1
    figure): noise the caller reports."""


def split_decode_overhead(
    engine_overhead_s: dict[int, float], per_token_at_batch1_s: float
) -> DecodeSplit:
    """Split a decode node's per-token CPU measured at batch 1 (``per_token_at_batch1_s``: one
    step's overhead plus one token's relay) with the engine's step overhead beyond its forward
    pass measured at two or more batch sizes (``engine_overhead_s[b]`` = engine step - forward
    pass, seconds, at batch ``b``).

    The engine's overhead is fitted as ``per_step + per_request x b`` (least squares over the
    sizes); ``per_step`` is the step's batch-independent cost and ``per_token_at_batch1_s -
    per_step`` the per-token remainder (the relay, the engine's per-request work), which is kept
    at least ``per_request`` (``per_step`` is capped: the two are measured apart). At batch 1
    the two add up to the measured figure exactly; at batch ``b`` a step costs ``per_step + b x
    per_token`` instead of ``b x per_token_at_batch1_s``."""
    if len(engine_overhead_s) < 2:
        raise ValueError(f"need two or more batch sizes, got {sorted(engine_overhead_s)}")
    if any(b < 1 for b in engine_overhead_s):
        raise ValueError(f"batch sizes must be >= 1, got {sorted(engine_overhead_s)}")
    if not per_token_at_batch1_s >= 0.0:
        raise ValueError(f"per_token_at_batch1_s must be >= 0, got {per_token_at_batch1_s!r}")
    xs, ys = list(engine_overhead_s), list(engine_overhead_s.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    clipped: list[str] = []
    if slope < 0:
        clipped.append(f"per-request slope {slope:.3g} s stored as 0")
        slope = 0.0
    intercept = my - slope * mx
    if intercept < 0:
        clipped.append(f"per-step {intercept:.3g} s stored as 0")
        intercept = 0.0
    # A token costs at least the engine's own per-request share: the per-step takes the rest.
    cap = max(0.0, per_token_at_batch1_s - slope)
    if intercept > cap:
        clipped.append(
            f"per-step {intercept:.3g} s above the batch-1 figure less the engine's per-request "
            f"{slope:.3g} s, capped at {cap:.3g} s"
        )
        intercept = cap
    return DecodeSplit(intercept, per_token_at_batch1_s - intercept, slope, tuple(clipped))


@dataclass(frozen=True, slots=True)
class DecodeClass:
    """One class of requests at the decode node, its fixed costs and forward passes taken out."""

    num_steps: int
    """Decode steps the node counted over the class."""
    num_tokens: int
    """Tokens those steps made (as many one request at a time, more in a batch)."""
    beyond_s: float
    """The node's CPU over the class beyond the requests' fixed costs and the forward passes of
    its steps (may be negative: noise)."""
    forward_s: float
    """Those forward passes (what ``beyond_s`` is read against: as the node counted them, or the
    profile's price for them), which weigh the class (``split_decode_live``)."""


def split_decode_live(
    classes: Sequence[DecodeClass], pass_noise: float, tick_s: float
) -> DecodeSplit:
    """The decode node's CPU beyond its forward passes split into one step's overhead ``a`` and
    one token's ``c``: each class cost ``S a + N c`` (``S`` steps made ``N`` tokens). A class
    one request at a time (``S = N``) pins ``a + c``, a batched one (``N > S``) tells them
    apart. Weighted least squares over all of them, ``a, c >= 0`` (non-negative least
    squares): each class weighed by the size of its work, ``pass_noise`` of its forward passes
    or ``tick_s``, whichever is larger (where the passes are the profile's, timed earlier, the
    machine's speed between then and the class lands here too). One batch-1 class and
    one batched class alone traded the terms off: a batch-1 figure below 0 with 5 ms a step
    beyond at batch 8 stored both as 0 (2026-12-07). A term held at 0 is named in ``clipped``;
    both held at 0 say the classes ran faster than the passes they are read against."""
    from scipy.optimize import nnls  # type: ignore[import-untyped]

    if any(c.num_steps < 1 or c.num_tokens < c.num_steps for c in classes):
        raise ValueError(
            "each class needs steps >= 1 and at least a token a step, got "
            + ", ".join(f"{c.num_tokens} tokens in {c.num_steps} steps" for c in classes)
        )
    rows = np.array([[c.num_steps, c.num_tokens] for c in classes], dtype=np.float64)
    if len(classes) < 2 or np.linalg.matrix_rank(rows) < 2:
        raise ValueError(
            "the classes do not tell a step from a token: need two with different tokens a step "
            "(one a batch over 1)"
        )
    y = np.array([c.beyond_s for c in classes])
    sigma = np.array([max(pass_noise * abs(c.forward_s), tick_s) for c in classes])
    coef, _ = nnls(rows / sigma[:, None], y / sigma)
    a, c = float(coef[0]), float(coef[1])
    clipped = tuple(f"{name} held at 0 (noise)" for name, v in (("per step", a), ("per token", c))
                    if v <= 0.0)  # fmt: skip
    return DecodeSplit(a, c, 0.0, clipped)


def line_fit(
    points: dict[int, float], sigma: dict[int, float] | None = None
) -> tuple[float, float]:
    """``(intercept, slope)`` of ``y = intercept + slope x n``, weighted least squares over
    ``points`` (``{n: y}``, two or more sizes; ``sigma[n]``: each point's uncertainty, weights
    ``1 / sigma^2``; None: equal): the prefill node's CPU beyond its passes per request and per
    prompt token, from classes of prompts of several sizes. Each class's figure is its live CPU
    less its profiled passes, so it is as uncertain as those passes: a long class pins the slope
    and a short one the intercept. A negative slope (noise) is returned as 0 with the intercept
    the weighted mean."""
    if len(points) < 2:
        raise ValueError(f"need two or more sizes, got {sorted(points)}")
    ns = np.array(sorted(points), dtype=np.float64)
    ys = np.array([points[int(n)] for n in ns])
    sig = np.ones_like(ns) if sigma is None else np.array([sigma[int(n)] for n in ns])
    slope, intercept = np.polyfit(ns, ys, 1, w=1.0 / sig)  # residuals weighted by 1 / sigma
    if slope < 0:
        return float(np.average(ys, weights=sig**-2.0)), 0.0
    return float(intercept), float(slope)


def context_cost(overhead_s: dict[tuple[int, int], float]) -> float:
    """``decode_per_context_token_s`` from the engine step's overhead beyond the forward pass
    (``overhead_s[(b, ctx)]``, seconds, ``b`` requests of ``ctx`` context tokens each) at two or
    more contexts: least squares of ``overhead(b, ctx) - overhead(b, smallest ctx) = k x b x
    (ctx - smallest ctx)`` over every batch size (a batch-1 step may run two rows, as
    ``engine.torch`` does for batch invariance: its cost is the engine's, and is fitted so).
    Negative (noise): 0.0."""
    contexts = sorted({c for _, c in overhead_s})
    if len(contexts) < 2:
        raise ValueError(f"need two or more contexts, got {contexts}")
    low = contexts[0]
    num = den = 0.0
    for (b, c), value in overhead_s.items():
        if c == low or (b, low) not in overhead_s:
            continue
        x = b * (c - low)
        num += (value - overhead_s[b, low]) * x
        den += x * x
    if den == 0.0:
        raise ValueError("no batch size measured at two contexts")
    return max(0.0, num / den)


def in_service_excess(
    in_service_s: dict[int, float], priced_s: Callable[[int], float]
) -> tuple[float | None, str]:
    """``prefill_in_service_excess`` and how it was read: the prefill node's forward passes per
    request of each one-token class as its engine counted them while the deployment served
    (``in_service_s[n]``, per prompt length: its engine thread's CPU in them, on the node's core)
    over the profile's price for them (``priced_s``, its curve, timed back to back minutes
    before), summed over the classes (the long class weighs most), less 1. None: nothing
    counted, or no price to read them against: the curve prices a class at 0 s or less (a noisy
    profile's end segment extended past its points), said in the how."""
    if not in_service_s:
        return None, ""
    unpriced = {n: priced_s(n) for n in in_service_s if priced_s(n) <= 0.0}
    if unpriced:
        # A ratio over such a price is no measurement (fresh-clone CI read -38 from a --quick
        # profile on a loaded core): missing, charged as 0.
        return None, (
            "not measured: the profile's curve prices "
            + ", ".join(f"{n} tokens at {s * 1e3:.4g} ms" for n, s in unpriced.items())
            + " (at or below 0: noise extended past its points); profile again on a quiet core"
        )
    ratio = sum(in_service_s.values()) / sum(priced_s(n) for n in in_service_s)
    each = ", ".join(f"{n} tokens {m * 1e3:.4g} vs {priced_s(n) * 1e3:.4g} ms"
                     for n, m in sorted(in_service_s.items()))  # fmt: skip
    return ratio - 1.0, (
        f"the prefill node's core: its forward passes per request of the one-token classes of a "
        f"live one-site torch deployment, as its engine counted them (forward_cpu_s), over the "
        f"profile's curve (timed back to back before), summed over the classes: {each}; "
        f"{ratio:.3f}x. On a machine whose speed drifts this is as much the curve's moment as a "
        "cost of serving: the two are not told apart"
    )


def engine_in_service_how(
    engine_per_request_s: dict[int, float], priced_s: Callable[[int], float], threads: int
) -> str:
    """What ``prefill_in_service_excess``'s how adds (said, not stored): the prefill node's own
    engine thread per request in service (``engine_cpu_s``) per one-token class, and summed over
    the curve's price (``priced_s``). Its slices also hand each layer's KV out and copy
    checkpoints, which the terms beyond the curve carry. With more than one intra-op thread per
    node the engine thread times only its own share of the passes: then no ratio is said. (A
    curve timed on more cores than the nodes get reads high against it: the fidelity bench's
    --quick profile, both cores, read the engine at 0.44x its curve.)"""
    if not engine_per_request_s:
        return ""
    each = ", ".join(f"{n} tokens {s * 1e3:.4g} ms" for n, s in engine_per_request_s.items())
    priced = sum(priced_s(n) for n in engine_per_request_s)
    if threads > 1:
        ratio = f"; with {threads} intra-op threads, the engine thread's share only"
    elif priced > 0:
        ratio = f"; {sum(engine_per_request_s.values()) / priced:.3f}x the curve"
    else:
        ratio = ""
    return (
        f". The prefill node's own engine thread in service (engine_cpu_s), per request: {each}"
        f"{ratio} (its slices also hand each layer's KV out and copy checkpoints: the terms "
        "beyond the curve carry that)"
    )
