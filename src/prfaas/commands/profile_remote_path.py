"""``prfaas profile --plumbing-of FILE --remote-path``: what an offloaded request pays on a vLLM
deployment's remote path beyond the simulator's other terms, which the one-site measurement
(``commands.profile_deployment``) never sends.

An offloaded request's KV is moved by PrfaasConnector inside both vLLM servers: the PrfaaS
site's server copies each layer out of its cache, frames, MACs and sends it; the PD site's server
receives, verifies and installs it, then recomputes the prompt's last token and decodes. Neither
is in a plain server's endpoint profile. Measured here on FILE's home PD site and its first
PrfaaS site (the one with a link to the home) launched together, ``router: prfaas`` at a
threshold below every class (each request offloads: the route log is checked) and the tuner off,
with classes of fresh random prompts of ``CLASS_PROMPT_TOKENS`` tokens (those the context holds),
one output token, one at a time. Each class's live TTFT (median) against the simulator's for the
same prompt on the same deployment with every other term (the PD profile as just measured, these
two at 0): the gap is a line in the KV bytes the request carried (``sim.kv_bytes.KvBytes``, the
simulator's own count; ``perf.plumbing.line_fit``), whose intercept and slope are the PD
profile's ``decode_per_request_s`` and ``decode_per_kv_byte_s``, charged where the simulator
charges a decode node's install (a vLLM site's only on KV that came over a link:
``SimSite.local_kv_in_place``).

Why latency, not CPU: the PD server keeps its core busy while its request waits for the KV
(here 27.0, 36.3 and 185.1 ms of CPU at 256, 1,024 and 4,096 tokens, tracking the PrfaaS
server's prefill, while its own counters show one token computed per request: no recompute), so
a CPU line would charge that wait as an install. Each site's CPU (its node process and every
descendant) is still read and said in the ``how``. Where the gap is spent along the path (the
PrfaaS server's sending or the PD server's receiving) a TTFT cannot tell: it is charged at the
decode node, where the KV lands.

The servers must be the only ones on their cores: stop the plain servers first.

Not pure (processes, HTTP, ``/proc``, the clock, the simulator run on files): a command's helper;
``commands/profile.py`` owns the command and its flags.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from prfaas.commands.plumbing_classes import (
    SHORT_PROMPT_TOKENS,
    Sender,
    class_cpu,
    idle_rates,
    process_tree,
    started,
)
from prfaas.errors import UsageError

CLASS_PROMPT_TOKENS = (256, 1024, 4096)
"""The classes' prompts: the long one pins the per-byte slope, the short one the intercept."""
THRESHOLD_TOKENS = 128
"""The router's ``t``: below every class, so each request offloads."""
TERMS = ("decode_per_request_s", "decode_per_kv_byte_s")
APART_S = 30.0
"""The simulated requests' spacing: each alone, as the live ones were sent."""


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteTarget:
    """The two-site deployment ``measure_remote_path`` launches."""

    text: str
    prfaas_site: str
    pd_site: str


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteClass:
    """One class as measured live: the prompt's tokens, each request's TTFT, each site's CPU
    seconds per request (idle rate removed)."""

    prompt_tokens: int
    ttft_s: tuple[float, ...]
    cpu_s: dict[str, float]


def two_site_deployment(path: Path) -> RemoteTarget:
    """FILE's home PD site and its first PrfaaS site, as ``measure_remote_path`` launches them;
    a ``UsageError`` where FILE has no such pair of vLLM sites with profile files."""
    from prfaas.config import load_deployment
    from prfaas.perf.profile_file import is_profile_file

    d = load_deployment(path)
    home = d.home_site
    linked = {lk.src for lk in d.links if lk.dst == home.name}
    remote = next((s for s in d.sites if s.kind == "prfaas" and s.name in linked), None)
    if remote is None:
        raise UsageError(
            f"--remote-path: {path} has no PrfaaS site with a link to its home {home.name}"
        )
    for s in (remote, home):
        if d.engine_for(s.name).kind != "vllm":
            raise UsageError(
                f"--remote-path: site {s.name} runs engine kind "
                f"{d.engine_for(s.name).kind!r}; it measures vLLM servers' KV path"
            )
        if not is_profile_file(s.hardware):
            raise UsageError(
                f"--remote-path: site {s.name}'s hardware {s.hardware!r} is a preset, not a "
                "profile file: profile its server first (`prfaas profile --endpoint`)"
            )
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    by_name = {s["name"]: s for s in raw["sites"]}
    sites = [{**by_name[s.name], "hardware": s.hardware} for s in (remote, home)]
    link = next(lk for lk in raw["links"] if lk["src"] == remote.name and lk["dst"] == home.name)
    gateway = {k: v for k, v in (raw.get("gateway") or {}).items() if k in ("host", "cpus")}
    out = {
        "engine": raw.get("engine", {}),
        "gateway": {**gateway, "port": 0, "control_port": 0, "request_timeout_s": 600},
        "policy": {"router": "prfaas", "threshold_tokens": THRESHOLD_TOKENS,
                   "tune_min_samples": 1_000_000},
        "simulation": {"tune": False},
        "sites": sites,
        "links": [link],
        "psk": secrets.token_hex(16),
    }  # fmt: skip
    text = "# Written by prfaas profile --remote-path: the deployment it measures.\n"
    return RemoteTarget(text + yaml.safe_dump(out, sort_keys=False), remote.name, home.name)


def class_lengths(max_prompt_tokens: int | None) -> tuple[int, ...]:
    """``CLASS_PROMPT_TOKENS`` that fit the model's context (with its output token)."""
    if max_prompt_tokens is None:
        return CLASS_PROMPT_TOKENS
    fit = tuple(n for n in CLASS_PROMPT_TOKENS if n < max_prompt_tokens)
    if len(fit) < 2:
        raise UsageError(
            f"--remote-path: the model's context ({max_prompt_tokens} tokens) holds fewer "
            f"than two of the classes' prompts {list(CLASS_PROMPT_TOKENS)}"
        )
    return fit


def probe_remote_path(
    target: RemoteTarget, workdir: Path, *, requests: int, seed: int, say: Callable[[str], None]
) -> tuple[Any, tuple[RemoteClass, ...]]:
    """The deployment (loaded) and its classes, measured live (launched in ``workdir``)."""
    from prfaas.commands.launch_checks import check_model_folders
    from prfaas.config import load_deployment
    from prfaas.scenarios import model_context_tokens

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "remote-path-deployment.yaml"
    path.write_text(target.text, encoding="utf-8")
    d = load_deployment(path)
    check_model_folders(d)
    lengths = class_lengths(model_context_tokens(d))
    say(f"remote path: starting sites {target.prfaas_site} and {target.pd_site} together")
    launcher = started(d, workdir / "remote-path-run", "--remote-path")
    try:  # started() stopped what it started if it failed; stop() the rest here
        send = Sender(launcher.url, d.engine.model, seed)
        # Each site's node process with its descendants: a vLLM site's sidecar and its server.
        pids = {site: process_tree(launcher.child(site).proc.pid)
                for site in (target.prfaas_site, target.pd_site)}  # fmt: skip
        for site, tree in pids.items():
            if d.engine_for(site).kind == "vllm" and len(tree) < 2:
                raise UsageError(f"--remote-path: site {site}'s vLLM server not found")
        send(SHORT_PROMPT_TOKENS + THRESHOLD_TOKENS, 2, 2)  # warm-up: first passes, imports
        for n in lengths:
            send(n, 1, 1)  # each size's first pass (a compiled server's shapes)
        routed = len(launcher.control.routes())
        idle = idle_rates(pids)
        classes = []
        for n in lengths:
            say(f"remote path: {requests} requests of {n} prompt tokens, offloaded")
            results: list[Any] = []
            run = functools.partial(_send_into, results, send, n, requests)
            cpu = class_cpu(pids, idle, requests, run)
            classes.append(RemoteClass(n, tuple(float(r.ttft_s) for r in results), cpu))
        routes = launcher.control.routes()[routed:]
    finally:
        launcher.stop()
    offloaded = sum(1 for r in routes if r.get("offloaded"))
    if offloaded != len(lengths) * requests:
        raise UsageError(
            f"--remote-path: {offloaded} of {len(lengths) * requests} requests offloaded "
            "(the router kept the rest home): nothing measured"
        )
    return d, tuple(classes)


def _send_into(results: list[Any], send: Sender, prompt_tokens: int, count: int) -> None:
    """``count`` requests of ``prompt_tokens`` tokens and 1 output token, one at a time; their
    results appended to ``results``."""
    results.extend(send.at_times([(0.0, prompt_tokens, 1)] * count))


def simulated_ttft_s(d: Any, pd_profile: Path, prompt_tokens: int) -> float:
    """One request of ``prompt_tokens`` alone on deployment ``d`` (offloaded: its ``t`` is below
    it), the PD site's hardware ``pd_profile``: its TTFT in the simulator."""
    from prfaas.commands.profile_first_token import simulated_first_tokens

    # The second of two far apart: the first pays nothing the second does not.
    _, (ttft, offloaded) = simulated_first_tokens(
        d, pd_profile, [(0.0, prompt_tokens, 1), (APART_S, prompt_tokens, 1)]
    )
    if not offloaded:
        raise RuntimeError(f"the simulator kept a {prompt_tokens}-token request home")
    return ttft


def fit_remote_path(
    d: Any, pd: Any, classes: tuple[RemoteClass, ...], prfaas_site: str, pd_site: str
) -> tuple[tuple[float, float], str]:
    """``((decode_per_request_s, decode_per_kv_byte_s), how)`` from the live ``classes``
    against the simulator on ``d`` with the PD profile ``pd`` (every other term measured)."""
    from prfaas.perf import cost_model_for_hardware
    from prfaas.perf.plumbing import line_fit
    from prfaas.perf.profile_write import dump_profile_file
    from prfaas.sim.kv_bytes import KvBytes

    with tempfile.TemporaryDirectory(prefix="prfaas-remote-path-") as tmp:
        scratch = Path(tmp) / "pd.yaml"
        costs = dataclasses.replace(pd.plumbing, **dict.fromkeys(TERMS, 0.0))
        dump_profile_file(dataclasses.replace(pd, plumbing=costs), scratch)
        simulated = {c.prompt_tokens: simulated_ttft_s(d, scratch, c.prompt_tokens)
                     for c in classes}  # fmt: skip
        kv = KvBytes(cost_model_for_hardware(d.engine.model, str(scratch)).model.cache)
    live = {c.prompt_tokens: statistics.median(c.ttft_s) for c in classes}
    gaps = {kv.total(n): live[n] - simulated[n] for n in live}
    fixed, per_byte = line_fit(gaps)
    notes = "; a slope below 0 (noise): stored 0, the mean as the intercept" if not per_byte else ""
    if fixed < 0:
        notes += f"; intercept {fixed * 1e3:.3g} ms stored 0 (noise)"
        fixed = 0.0
    described = "; ".join(
        f"{c.prompt_tokens} tokens ({kv.total(c.prompt_tokens) / 1e6:.2f} MB of KV): live "
        f"{live[c.prompt_tokens] * 1e3:.1f} ms, simulated {simulated[c.prompt_tokens] * 1e3:.1f} "
        f"ms; CPU a request {c.cpu_s[prfaas_site] * 1e3:.1f} ms at {prfaas_site}, "
        f"{c.cpu_s[pd_site] * 1e3:.1f} ms at {pd_site}"
        for c in classes
    )
    how = (
        f"FILE's sites {prfaas_site} and {pd_site} launched together, {len(classes[0].ttft_s)} "
        "requests a class one at a time, 1 output token, each offloaded; TTFT (medians) against "
        f"the simulator with every other term: {described}; live minus simulated, least squares "
        f"in the KV bytes: {fixed * 1e3:.3g} ms a request, {per_byte * 1e9:.3g} ns a byte{notes}"
    )
    return (fixed, per_byte), how


def with_remote_path(
    pd: Any, d: Any, classes: tuple[RemoteClass, ...], target: RemoteTarget
) -> Any:
    """The PD profile ``pd`` with the remote path's two terms measured and said (no longer
    missing)."""
    (fixed, per_byte), how = fit_remote_path(d, pd, classes, target.prfaas_site, target.pd_site)
    values = dict(zip(TERMS, (fixed, per_byte), strict=True))
    costs = dataclasses.replace(
        pd.plumbing, **values, missing=tuple(t for t in pd.plumbing.missing if t not in TERMS)
    )
    said = tuple((t, h) for t, h in pd.plumbing_how if t not in TERMS)
    return dataclasses.replace(pd, plumbing=costs, plumbing_how=(*said, *((t, how) for t in TERMS)))
