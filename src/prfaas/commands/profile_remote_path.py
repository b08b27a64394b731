"""``prfaas profile --plumbing-of FILE --remote-output PATH``: the remote path's terms of a vLLM
deployment, which the one-site measurement (``commands.profile_deployment``) cannot see.

An offloaded request's KV is moved by PrfaasConnector inside both vLLM servers: the PrfaaS
site's server copies each layer out of its cache, frames, MACs and sends it; the PD site's server
receives, verifies and installs it. Neither shows in an endpoint profile (a plain server), and
both sit on the servers' cores. Measured here on FILE's home PD site and its first PrfaaS site
(the one with a link to the home) launched together, ``router: prfaas`` at a threshold below
every class (each request offloads; the route log checks it) and the tuner off, with classes of
fresh random prompts of ``CLASS_PROMPT_TOKENS`` tokens (capped by the model's context), one
output token, one at a time. Each class's CPU per request (``/proc``, idle rate removed) of:

- the PrfaaS site's sidecar and its server (every process of it: API server, engine core), less the
  PrfaaS profile's own prefill time for the prompt (the plain server's): a line in the prompt's
  tokens (``perf.plumbing.line_fit``) gives that profile's ``prefill_per_request_s`` (its
  intercept) and ``prefill_per_token_s`` (its slope), written to ``PATH``;
- the PD site's server and sidecar: a line in the KV bytes the request carried
  (``sim.kv_bytes.KvBytes``, the simulator's own count) gives ``decode_per_kv_byte_s``, added to
  the PD site's profile (``-o``); its intercept (the decode's own step, the sidecar's call) is
  said, not stored (``prefill_per_request_s`` holds a local request's call).

The servers must be the only ones on their cores: stop the plain servers first.

Not pure (processes, HTTP, ``/proc``, the clock): a command's helper; ``commands/profile.py``
owns the command and its flags.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
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
"""The classes' prompts: the long one pins the per-token slope, the short one the intercept."""
THRESHOLD_TOKENS = 128
"""The router's ``t``: below every class, so each request offloads."""
PRFAAS_TERMS = ("prefill_per_request_s", "prefill_per_token_s")
PD_TERM = "decode_per_kv_byte_s"


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteTarget:
    """The two-site deployment ``measure_remote_path`` launches and the profiles it adds to."""

    text: str
    prfaas_site: str
    prfaas_profile: Path
    pd_site: str


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteTerms:
    """What was measured: the PrfaaS profile's two terms, the PD profile's one, each said."""

    prfaas_per_request_s: float
    prfaas_per_token_s: float
    pd_per_kv_byte_s: float
    prfaas_how: str
    pd_how: str


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
            f"--remote-output: {path} has no PrfaaS site with a link to its home {home.name}"
        )
    for s in (remote, home):
        if d.engine_for(s.name).kind != "vllm":
            raise UsageError(
                f"--remote-output: site {s.name} runs engine kind "
                f"{d.engine_for(s.name).kind!r}; it measures vLLM servers' KV path"
            )
        if not is_profile_file(s.hardware):
            raise UsageError(
                f"--remote-output: site {s.name}'s hardware {s.hardware!r} is a preset, not a "
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
        "sites": sites,
        "links": [link],
        "psk": secrets.token_hex(16),
    }  # fmt: skip
    text = "# Written by prfaas profile --remote-output: the deployment it measures.\n"
    return RemoteTarget(
        text + yaml.safe_dump(out, sort_keys=False), remote.name, Path(remote.hardware), home.name
    )


def class_lengths(max_prompt_tokens: int | None) -> tuple[int, ...]:
    """``CLASS_PROMPT_TOKENS`` that fit the model's context (with its output token)."""
    if max_prompt_tokens is None:
        return CLASS_PROMPT_TOKENS
    fit = tuple(n for n in CLASS_PROMPT_TOKENS if n < max_prompt_tokens)
    if len(fit) < 2:
        raise UsageError(
            f"--remote-output: the model's context ({max_prompt_tokens} tokens) holds fewer "
            f"than two of the classes' prompts {list(CLASS_PROMPT_TOKENS)}"
        )
    return fit


def measure_remote_path(
    target: RemoteTarget, pd_profile: Path, workdir: Path, *, requests: int, seed: int,
    say: Callable[[str], None],
) -> RemoteTerms:  # fmt: skip
    """The remote path's terms, measured on ``target``'s deployment (launched in ``workdir``)."""
    from prfaas.commands.launch_checks import check_model_folders
    from prfaas.config import load_deployment
    from prfaas.scenarios import model_context_tokens

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "remote-path-deployment.yaml"
    path.write_text(target.text, encoding="utf-8")
    d = load_deployment(path)
    check_model_folders(d)
    lengths = class_lengths(model_context_tokens(d))
    say(f"remote path: starting sites {target.prfaas_site} and {target.pd_site} (gateway, "
        "sidecars, vLLM servers)")  # fmt: skip
    launcher = started(d, workdir / "remote-path-run", "--remote-output")
    try:  # started() stopped what it started if it failed; stop() the rest here
        send = Sender(launcher.url, d.engine.model, seed)
        # Each site's node process with its descendants: a vLLM site's sidecar and its server.
        pids = {site: process_tree(launcher.child(site).proc.pid)
                for site in (target.prfaas_site, target.pd_site)}  # fmt: skip
        for site, tree in pids.items():
            if d.engine_for(site).kind == "vllm" and len(tree) < 2:
                raise UsageError(f"--remote-output: site {site}'s vLLM server not found")
        send(SHORT_PROMPT_TOKENS + THRESHOLD_TOKENS, 2, 2)  # warm-up: first passes, imports
        for n in lengths:
            send(n, 1, 1)  # each size's first pass (a compiled server's shapes)
        routed = len(launcher.control.routes())
        idle = idle_rates(pids)
        cpu: dict[int, dict[str, float]] = {}
        for n in lengths:
            say(f"remote path: {requests} requests of {n} prompt tokens, offloaded")
            cpu[n] = class_cpu(pids, idle, requests, functools.partial(send, n, 1, requests))
        routes = launcher.control.routes()[routed:]
    finally:
        launcher.stop()
    offloaded = sum(1 for r in routes if r.get("offloaded"))
    if offloaded != len(lengths) * requests:
        raise UsageError(
            f"--remote-output: {offloaded} of {len(lengths) * requests} requests offloaded "
            "(the router kept the rest home): nothing measured"
        )
    return remote_terms(target, pd_profile, cpu, requests)


def remote_terms(
    target: RemoteTarget, pd_profile: Path, cpu: dict[int, dict[str, float]], requests: int
) -> RemoteTerms:
    """The terms from each class's CPU seconds per request (``cpu[prompt tokens][process]``)."""
    from prfaas.perf.plumbing import line_fit
    from prfaas.perf.profile_costs import cost_model_from_profile_file
    from prfaas.sim.kv_bytes import KvBytes

    pf_cost = cost_model_from_profile_file(target.prfaas_profile)
    pd_cost = cost_model_from_profile_file(pd_profile)
    kv = KvBytes(pd_cost.model.cache)
    pf, pd = target.prfaas_site, target.pd_site

    beyond = {n: c[pf] - pf_cost.prefill_s(n, 0) for n, c in cpu.items()}
    per_request, per_token = line_fit(beyond)
    note = "; a slope below 0 (noise): stored 0, the mean as the intercept" if not per_token else ""
    if per_request < 0:
        note += f"; intercept {per_request * 1e3:.3g} ms stored 0 (noise)"
        per_request = 0.0
    classes = ", ".join(
        f"{n} tokens {c[pf] * 1e3:.1f} ms against {pf_cost.prefill_s(n, 0) * 1e3:.1f} ms"
        for n, c in cpu.items()
    )
    common = (f"process CPU (/proc, idle rate removed) per request, {requests} requests a class "
              "one at a time, 1 output token, each offloaded")  # fmt: skip
    prfaas_how = (
        f"{common}; site {pf}'s sidecar and server against this profile's prefill: {classes}; "
        f"least squares in the prompt's tokens{note}"
    )
    carried = {kv.total(n): c[pd] for n, c in cpu.items()}
    pd_fixed, per_byte = line_fit(carried)
    pd_classes = ", ".join(f"{b / 1e6:.2f} MB {s * 1e3:.1f} ms" for b, s in carried.items())
    pd_how = (
        f"{common}; site {pd}'s sidecar and server by the KV bytes received: {pd_classes}; "
        f"least squares in the bytes (intercept {pd_fixed * 1e3:.3g} ms a request: the decode's "
        "own step and the sidecar's call, not stored)"
        + ("; a slope below 0 (noise): stored 0" if not per_byte else "")
    )
    return RemoteTerms(per_request, per_token, per_byte, prfaas_how, pd_how)


def with_remote_path(pd: Any, prfaas: Any, terms: RemoteTerms) -> tuple[Any, Any]:
    """The PD profile with ``decode_per_kv_byte_s`` and the PrfaaS profile with its two terms,
    each measured and said (no longer missing)."""

    def added(pf: Any, values: dict[str, float], how: str) -> Any:
        missing = tuple(t for t in pf.plumbing.missing if t not in values)
        costs = dataclasses.replace(pf.plumbing, **values, missing=missing)
        said = tuple((t, h) for t, h in pf.plumbing_how if t not in values)
        return dataclasses.replace(
            pf, plumbing=costs, plumbing_how=(*said, *((t, how) for t in values))
        )

    prfaas_values = dict(zip(PRFAAS_TERMS, (terms.prfaas_per_request_s,
                                            terms.prfaas_per_token_s), strict=True))  # fmt: skip
    return (
        added(pd, {PD_TERM: terms.pd_per_kv_byte_s}, terms.pd_how),
        added(prfaas, prfaas_values, terms.prfaas_how),
    )
