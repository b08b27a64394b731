"""``CostModel``: the single source of timing for the planner, the simulator and the timed engine.

It answers ``T_prefill`` per instance, decode step times and ``S_kv``, from a shipped measured
profile where one exists for the (model, hardware) pair and from the roofline otherwise, and says
which (``prefill_source``, ``decode_source``). A batch of prefills costs the sum of its requests'
times: long prefills are compute-bound, so batching them saves nothing (true of the shipped
profiles, which were taken one request at a time). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prfaas.perf.curves import PiecewiseLinearCurve, PolynomialCurve
from prfaas.perf.plumbing import NO_PLUMBING, PlumbingCosts
from prfaas.perf.prefill_fit import PrefillFit
from prfaas.perf.profile_read import find_profile
from prfaas.perf.profiles import DecodeFit, Profile
from prfaas.perf.roofline import Roofline
from prfaas.spec.hardware import HardwareSpec
from prfaas.spec.model_spec import ModelSpec
from prfaas.spec.presets import get_hardware, get_model

DEFAULT_DECODE_STEP_BUDGET_S = 0.025
"""40 tokens/s per request, the paper's decode SLO."""
DEFAULT_DECODE_CONTEXT_TOKENS = 8192
"""Per-request context at which the roofline sizes ``max_decode_batch``."""


@dataclass(frozen=True, slots=True)
class CostModel:
    model: ModelSpec
    hardware: HardwareSpec
    profile: Profile | None = None
    plumbing: PlumbingCosts = NO_PLUMBING
    """The live system's costs around the forward passes (``perf.plumbing``); all 0.0 unless
    a profile measured them."""
    relay_in_decode_step: bool = False
    """Decode step times include ``plumbing.decode_per_step_s`` once,
    ``plumbing.decode_per_output_token_s`` per request of the batch and
    ``plumbing.decode_per_context_token_s`` per context token of the batch (the simulator's
    view: the decode node runs its step loop and relays each token on the core it steps on).
    False (the default, the timed engine's): the engine's forward pass alone, since a live node
    pays its plumbing itself. ``decode_batch_limit`` never includes it (the engine's batch)."""
    _decode_cache: dict[int, tuple[float, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _prefill_curve: PiecewiseLinearCurve | PolynomialCurve | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """``profile.prefill``, looked up once (``prefill_s`` runs once per simulated request)."""
    _prefill_t0: float = field(default=0.0, init=False, repr=False, compare=False)
    """``T(0)`` of the prefill curve, computed once: a cached prefix's suffix pays it (the same
    call on the same argument, so the same float; it saved a curve evaluation per cache hit)."""

    _prefill_fit: PrefillFit | None = field(default=None, init=False, repr=False, compare=False)
    """``profile.prefill_fit``, looked up once."""

    def __post_init__(self) -> None:
        curve = self.profile.prefill if self.profile is not None else None
        object.__setattr__(self, "_prefill_curve", curve)
        object.__setattr__(self, "_prefill_t0", curve(0) if curve is not None else 0.0)
        fit = self.profile.prefill_fit if self.profile is not None else None
        object.__setattr__(self, "_prefill_fit", fit)

    @property
    def roofline(self) -> Roofline:
        return Roofline(self.model, self.hardware)

    # -- where answers come from -----------------------------------------------------------------
    def _profile_label(self) -> str:
        assert self.profile is not None
        return self.profile.source or f"profile:{self.model.name}@{self.hardware.name}"

    @property
    def prefill_source(self) -> str:
        if self.profile is not None and self.profile.prefill is not None:
            return self._profile_label()
        return f"roofline:{self.hardware.name}"

    @property
    def decode_source(self) -> str:
        if self.profile is not None and self.profile.decode is not None:
            return self._profile_label()
        return f"roofline:{self.hardware.name}"

    @property
    def source(self) -> str:
        """Where prefill timing comes from (what the planner's headline figures rest on)."""
        return self.prefill_source

    # -- S_kv ----------------------------------------------------------------------------------
    def kv_bytes(self, num_tokens: int) -> int:
        return self.model.cache.bytes_for(num_tokens)

    # -- prefill -------------------------------------------------------------------------------
    def prefill_s(self, num_new_tokens: int, num_cached_tokens: int = 0) -> float:
        """Seconds one instance takes to prefill ``num_new_tokens`` after a cached prefix.

        From a profile that knows the engine's passes (``--pass-tokens``): its fit per pass,
        per token and per attended pair (``perf.prefill_fit``), in the passes the engine runs
        for this prefill. From any other profile ``T(l)`` (measured on uncached prompts): ``T(n)``
        uncached; after a prefix, ``T(n) + gamma * n * c`` where the profile also measured
        cached prefills (``gamma`` the fitted attention), else ``T(c + n) - T(c) + T(0)``: the
        suffix pays its share of the longer attention, the fixed overhead ``T(0)`` once.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be > 0, got {num_new_tokens}")
        if num_cached_tokens < 0:
            raise ValueError(f"num_cached_tokens must be >= 0, got {num_cached_tokens}")
        curve = self._prefill_curve
        if curve is None:
            return self.roofline.prefill_s(num_new_tokens, num_cached_tokens)
        fit = self._prefill_fit
        if fit is not None and fit.pass_tokens is not None:
            return fit.seconds(num_new_tokens, num_cached_tokens)
        if num_cached_tokens == 0:
            seconds = curve(num_new_tokens)
        elif fit is not None:
            seconds = curve(num_new_tokens) + fit.attention_s * num_new_tokens * num_cached_tokens
        else:
            t0 = self._prefill_t0
            seconds = curve(num_cached_tokens + num_new_tokens) - curve(num_cached_tokens) + t0
        # Never below 0 s: a noisy curve (a longer prompt timed faster) extended past its points
        # goes negative, and the simulator charged -7.6 s of passes (fresh-clone CI, a --quick
        # profile on a loaded core). A sane curve never gets here below 0.
        return max(0.0, seconds)

    def batch_prefill_s(self, items: Sequence[tuple[int, int]]) -> float:
        """A batch of (num_new, num_cached) prefills: the sum of their times (compute-bound),
        less what one step pays once (``batched_prefill_s``)."""
        return self.batched_prefill_s([self.prefill_s(n, c) for n, c in items])

    def batched_prefill_s(self, each_s: Sequence[float]) -> float:
        """Prefills of ``each_s`` seconds alone, run as one batch: their sum, less the step's
        fixed cost (``decode_step_fixed_s``) for all but one of them. Each was profiled alone,
        one engine step paying it; in one batch they share a step (vLLM schedules them into one
        forward pass), so it is paid once. Never below the longest alone. 0 saved from profiles
        without a measured decode fit, and for the torch engine, which prefills one at a time
        (batches of one)."""
        total = sum(each_s)
        if len(each_s) < 2:
            return total
        shared = (len(each_s) - 1) * self.decode_step_fixed_s()
        return max(total - shared, max(each_s))

    # -- decode --------------------------------------------------------------------------------
    def _engine_parts(self, batch_size: int) -> tuple[float, float]:
        """(fixed, per context token) seconds of the engine's own decode step."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        decode = self.profile.decode if self.profile is not None else None
        if decode is None:
            return self.roofline.decode_step_parts(batch_size)
        if isinstance(decode, DecodeFit):
            return (decode.base_s + decode.per_request_s * batch_size, decode.per_token_s)
        return (decode.step_s * max(1.0, batch_size / decode.max_batch), 0.0)

    def _decode_parts(self, batch_size: int) -> tuple[float, float]:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        # Memoised per batch size: the simulator asks for every batch membership change.
        parts = self._decode_cache.get(batch_size)
        if parts is None:
            parts = self._engine_parts(batch_size)
            if self.relay_in_decode_step:
                p = self.plumbing
                relay_s = p.decode_per_step_s + p.decode_per_output_token_s * batch_size
                parts = (parts[0] + relay_s, parts[1] + p.decode_per_context_token_s)
            self._decode_cache[batch_size] = parts
        return parts

    def decode_step_fixed_s(self) -> float:
        """The part of a decode step that grows with neither its batch nor its context (a
        measured fit's ``base_s``; 0 from other profiles): what a step pays once when one engine
        runs a prefill chunk and the decode batch in it (``sim.processor``, mixed steps)."""
        decode = self.profile.decode if self.profile is not None else None
        if isinstance(decode, DecodeFit):
            return max(0.0, decode.base_s)
        return 0.0

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        """One decode step for ``batch_size`` requests whose contexts sum to ``context_tokens``."""
        fixed_s, per_token_s = self._decode_parts(batch_size)
        return fixed_s + per_token_s * context_tokens

    def decode_span_s(self, batch_size: int, context_tokens_start: int, num_steps: int) -> float:
        """``num_steps`` steps of a fixed batch, each adding ``batch_size`` context tokens.

        Closed form (the step is linear in context): no stepping token by token.
        """
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        # The memo read inline (a call saved: the simulator asks a few times per request).
        fixed_s, per_token_s = self._decode_cache.get(batch_size) or self._decode_parts(batch_size)
        growth = batch_size * num_steps * (num_steps - 1) / 2
        return num_steps * fixed_s + per_token_s * (num_steps * context_tokens_start + growth)

    def decode_steps_within(self, batch_size: int, context_tokens_start: int, span_s: float) -> int:
        """How many whole steps of a fixed batch fit in ``span_s`` (inverse of decode_span_s)."""
        fixed_s, per_token_s = self._decode_cache.get(batch_size) or self._decode_parts(batch_size)
        if span_s <= 0:
            return 0
        if per_token_s == 0.0:
            return int(span_s / fixed_s + 1e-9)
        # Solve a*n + b*(n*C0 + B*n(n-1)/2) <= span for the largest integer n.
        a = per_token_s * batch_size / 2
        b = fixed_s + per_token_s * context_tokens_start - a
        disc = b * b + 4 * a * span_s
        n = int((-b + disc**0.5) / (2 * a) + 1e-9)
        while n > 0 and self.decode_span_s(batch_size, context_tokens_start, n) > span_s + 1e-12:
            n -= 1
        return n

    def decode_batch_limit(self, step_budget_s: float, context_tokens_per_request: int) -> int:
        """The largest batch whose step fits ``step_budget_s`` at that context (0 if none)."""
        decode = self.profile.decode if self.profile is not None else None
        if decode is not None and not isinstance(decode, DecodeFit):
            return decode.max_batch if decode.step_s <= step_budget_s + 1e-12 else 0
        # The engine's own step (memoised when no relay is added to it).
        p = self.plumbing
        relayed = self.relay_in_decode_step and (
            p.decode_per_output_token_s > 0
            or p.decode_per_step_s > 0
            or p.decode_per_context_token_s > 0
        )
        parts = self._engine_parts if relayed else self._decode_parts
        batch = 0
        while batch < 4096:
            fixed_s, per_token_s = parts(batch + 1)
            if fixed_s + per_token_s * (batch + 1) * context_tokens_per_request > step_budget_s:
                break
            batch += 1
        return batch

    @property
    def max_decode_batch(self) -> int:
        """``BS_max`` at the paper's 40 tok/s SLO (profile's value, or the roofline's at 8K)."""
        return self.decode_batch_limit(DEFAULT_DECODE_STEP_BUDGET_S, DEFAULT_DECODE_CONTEXT_TOKENS)


def cost_model_for(model: ModelSpec | str, hardware: HardwareSpec | str) -> CostModel:
    """The cost model of ``model`` on ``hardware``: shipped profile if any, else roofline.

    Raises ``KeyError`` naming an unknown preset.
    """
    m = get_model(model) if isinstance(model, str) else model
    h = get_hardware(hardware) if isinstance(hardware, str) else hardware
    return CostModel(m, h, find_profile(m.name, h.name))
