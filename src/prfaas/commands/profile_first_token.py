"""``first_token_wait_s`` and ``first_token_wait_per_decoding_s`` (``perf.plumbing``): how much
longer a new request's first token takes than the simulator says with every other term, alone and
per request decoding beside it.

Measured on the one-site deployment a plumbing measurement launched (``commands.profile_plumbing``
for torch, ``commands.profile_deployment`` for vLLM), after its classes: for each size ``B`` of
``PROBE_BATCHES``, ``B`` background requests (short prompts, ``BACKGROUND_OUTPUT_TOKENS`` each)
start together and ``PROBES`` probes (``PROBE_PROMPT_TOKENS``-token prompts, 2 output tokens)
follow one at a time while they decode; each probe's TTFT is read at the client
(``probe_live``). The same requests at the same offsets are then simulated on the deployment
with the profile just measured (every other term), twice: with the term at 0 and at 1 ms, which
gives each probe's simulated TTFT and the number of requests decoding at its decode node when
its KV was ready (the term's multiplier, the simulator's own count). The probes'
live-minus-simulated TTFT gives both terms (``perf.first_token_fit``, on each class's medians):
``first_token_wait_s`` from the class with nobody decoding, ``first_token_wait_per_decoding_s``
from the others. Both missing when no class met a decode batch (the background finished first:
a fast engine) or none met nobody.

A class of the profile, not the workload being predicted: synthetic prompts, fixed sizes.

Not pure (HTTP, the simulator run on files, the clock): a command's helper.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prfaas.perf.first_token_fit import ProbeGaps, fit_first_token_waits

PROBE_BATCHES = (0, 8, 16)
PROBES = 6
PROBE_PROMPT_TOKENS = 256
BACKGROUND_PROMPT_TOKENS = 64
BACKGROUND_OUTPUT_TOKENS = 600
PROBE_START_S = 0.5
"""The first probe's offset: the background's prefills are done, its decode batch whole."""
PROBE_GAP_S = 0.25
"""Between probes: each is alone with the background (a probe's prefill takes tens of ms)."""
TERM = "first_token_wait_per_decoding_s"
FIXED_TERM = "first_token_wait_s"
TERMS = (FIXED_TERM, TERM)


@dataclass(frozen=True, slots=True)
class ProbeClass:
    """One background size's requests, ``(offset s, prompt tokens, output tokens)``, the
    background first, and each request's live TTFT (seconds)."""

    batch: int
    requests: tuple[tuple[float, int, int], ...]
    ttft_s: tuple[float, ...]


def probe_requests(batch: int) -> list[tuple[float, int, int]]:
    background = [(0.0, BACKGROUND_PROMPT_TOKENS, BACKGROUND_OUTPUT_TOKENS)] * batch
    probes = [(PROBE_START_S + k * PROBE_GAP_S, PROBE_PROMPT_TOKENS, 2) for k in range(PROBES)]
    return background + probes


def probe_live(send: Any, say: Callable[[str], None]) -> tuple[ProbeClass, ...]:
    """The probe classes sent through ``send`` (a ``plumbing_classes.Sender``)."""
    out = []
    for batch in PROBE_BATCHES:
        say(f"plumbing: {PROBES} probes of {PROBE_PROMPT_TOKENS} prompt tokens while {batch} "
            f"requests decode ({BACKGROUND_OUTPUT_TOKENS} tokens each)")  # fmt: skip
        reqs = probe_requests(batch)
        results = send.at_times(reqs, concurrency=len(reqs))
        out.append(ProbeClass(batch, tuple(reqs), tuple(float(r.ttft_s) for r in results)))
    return tuple(out)


def simulated_first_tokens(
    d: Any, profile: Path, requests: Sequence[tuple[float, int, int]]
) -> list[tuple[float, bool]]:
    """Each request's ``(TTFT, offloaded)`` in the simulator: deployment ``d`` with ``profile``
    as its home site's hardware (the plumbing measurements' deployments: one site, or the
    remote path's two)."""
    from prfaas import scenarios
    from prfaas.sim.simulator import Simulator
    from prfaas.workload.requests import SimRequestSpec

    sc = scenarios.sim_scenario(d)
    home = d.home_site.name
    sites = tuple(
        dataclasses.replace(s, hardware=str(profile)) if s.name == home else s for s in sc.sites
    )
    last = max(at for at, _, _ in requests)
    sc = dataclasses.replace(sc, sites=sites, duration_s=last + 1e-6, warmup_s=0.0)
    order = sorted(range(len(requests)), key=lambda i: requests[i][0])  # the simulator's order
    specs = [SimRequestSpec(n, requests[i][0], requests[i][1], requests[i][2])
             for n, i in enumerate(order)]  # fmt: skip
    sim = Simulator(sc, iter(specs))
    out: dict[int, tuple[float, bool]] = {}
    sim.on_finish = lambda req: out.__setitem__(
        order[req.index], (req.kv_ready_s - req.arrival_s, req.transfer_bytes > 0)
    )
    sim.run()
    if len(out) != len(requests):
        raise RuntimeError(f"the simulator finished {len(out)} of {len(requests)} probe requests")
    return [out[i] for i in range(len(requests))]


def fit_first_token_wait(
    d: Any, pf: Any, classes: Sequence[ProbeClass]
) -> tuple[tuple[float, float] | None, str]:
    """``((first_token_wait_s, first_token_wait_per_decoding_s) or None, how)`` from the live
    ``classes`` against the simulator on deployment ``d`` with profile ``pf`` (its other terms
    measured, these two 0)."""
    from prfaas.perf.profile_write import dump_profile_file

    gaps: list[ProbeGaps] = []
    per_class = []
    with tempfile.TemporaryDirectory(prefix="prfaas-first-token-") as tmp:
        paths = {}
        for name, value in (("zero", 0.0), ("unit", 1e-3)):
            costs = dataclasses.replace(pf.plumbing, **{FIXED_TERM: 0.0, TERM: value})
            costs = dataclasses.replace(costs, missing=())  # scratch: charged as 0, unsaid
            paths[name] = Path(tmp) / f"{name}.yaml"
            dump_profile_file(dataclasses.replace(pf, plumbing=costs), paths[name])
        for c in classes:
            zero = [t for t, _ in simulated_first_tokens(d, paths["zero"], c.requests)]
            unit = [t for t, _ in simulated_first_tokens(d, paths["unit"], c.requests)]
            probes = range(c.batch, len(c.requests))
            live_ms = [c.ttft_s[i] * 1e3 for i in probes]
            sim_ms = [zero[i] * 1e3 for i in probes]
            decoding = tuple(round((unit[i] - zero[i]) / 1e-3) for i in probes)
            gaps.append(ProbeGaps(decoding, tuple(c.ttft_s[i] - zero[i] for i in probes)))
            per_class.append(
                f"{c.batch} decoding: live {np.median(live_ms):.1f} ms, simulated "
                f"{np.median(sim_ms):.1f} ms, {np.median(decoding):.0f} decoding at the KV"
            )
    what = (
        f"{PROBES} probes of {PROBE_PROMPT_TOKENS} prompt tokens while {list(PROBE_BATCHES)} "
        f"requests decode ({BACKGROUND_PROMPT_TOKENS}-token prompts, "
        f"{BACKGROUND_OUTPUT_TOKENS} tokens), TTFT live against the simulator with every other "
        "term (medians: " + "; ".join(per_class) + ")"
    )
    try:
        waits = fit_first_token_waits(gaps)
    except ValueError as e:
        return None, f"{what}: {e}"
    how = f"{what}; live minus simulated, {waits.how}"
    return (waits.alone_s, waits.per_decoding_s), how


def with_first_token_wait(
    pf: Any,
    d: Any,
    classes: Sequence[ProbeClass],
    say: Callable[[str], None],
    *,
    store: bool = True,
) -> Any:
    """``pf`` (every other term measured) with ``first_token_wait_s`` and
    ``first_token_wait_per_decoding_s`` fitted (``fit_first_token_wait``) and said in its
    ``plumbing_how``, or named missing. Without ``store`` (``prfaas profile --engine torch``,
    whose one-site deployment runs its gateway on its nodes' cores, where a deployment's
    gateway need not be) both are said in the per-decoding term's how and left missing: they
    are the waits of that measurement's own layout, not of the deployment's."""
    say("plumbing: the probes against the simulator")
    fitted, how = fit_first_token_wait(d, pf, classes)
    others = tuple(t for t in pf.plumbing.missing if t not in TERMS)
    if fitted is None or not store:
        if fitted is None:
            say(f"plumbing: {FIXED_TERM} and {TERM} not measured: {how}")
        else:
            how += "; neither stored: this deployment's gateway shares its nodes' cores"
        costs = dataclasses.replace(
            pf.plumbing, **dict.fromkeys(TERMS, 0.0), missing=(*others, *TERMS)
        )
        said = ((TERM, how),) if fitted is not None else ()
        return dataclasses.replace(pf, plumbing=costs, plumbing_how=(*pf.plumbing_how, *said))
    fixed, slope = fitted
    costs = dataclasses.replace(pf.plumbing, **{FIXED_TERM: fixed, TERM: slope}, missing=others)
    read_alone = f"from {TERM}'s probes (its how): those sent with nobody decoding"
    how_each = ((FIXED_TERM, read_alone), (TERM, how))
    return dataclasses.replace(pf, plumbing=costs, plumbing_how=(*pf.plumbing_how, *how_each))
