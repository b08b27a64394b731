"""``prfaas profile --plumbing-of FILE``: the plumbing terms of a vLLM deployment, added to the
profile its PD site already names (one ``prfaas profile --endpoint`` wrote, from a plain server).

An endpoint profile times a plain server from its client: its TTFT and inter-token latency hold
the server's own HTTP, scheduling and steps, and nothing of prfaas. A deployment adds the gateway
(HTTP in and out, tokenizing, routing, every token relayed) and, at a vLLM site, the sidecar (the
node process that calls its server and relays its tokens). Both are measured here as
``commands.profile_plumbing`` measures a torch deployment's: FILE's home PD site alone (its
engine and nodes, its own profile as hardware, ``router: local_only``) is launched with
``serve.Launcher``, and requests go through the gateway, fresh random prompts, in four
classes: short prompts with one output token and with ``K``, one at a time; then ``K`` tokens,
8 and 32 at once (``RELAY_BATCHES``), the server's engine steps counted over each class (the
decode node reports them, ``serve.vllm.metrics``). Each process's own CPU time (``/proc``, idle
rate removed; the sidecar's without its server's, a process of its own) over the classes is
split by least squares (``perf.relay_fit``: per request, per step of the server, per token):

- ``gateway_per_request_s``, ``gateway_per_step_s``, ``gateway_per_output_token_s``: the
  gateway's;
- ``prefill_per_request_s``, ``decode_per_step_s``, ``decode_per_output_token_s``: the
  sidecar's. A vLLM site serves a local request with one call to its server, prefill and decode
  in it; the simulator charges the call's fixed cost at the prefill, where the client waits for
  it, and the relay's per step and per token at the decode;
- ``first_token_wait_s`` and ``first_token_wait_per_decoding_s``: probes sent while batches
  decode, against the simulator with the terms above (``commands.profile_first_token``).

Zero by construction, said so in ``how``: ``decode_per_request_s`` (in ``prefill_per_request_s``),
``decode_per_context_token_s`` (the server's whole step is in the endpoint profile's
inter-token latency) and ``prefill_in_service_excess`` (the endpoint profile's prefills are the
server's in service). Left missing, charged as 0 with the loader's warning:
``decode_per_kv_byte_s`` (the remote path's KV, moved by PrfaasConnector inside the servers; a
one-site deployment sends none), ``prefill_per_token_s`` and ``shared_core_overhead``. With
``--remote-path``, ``commands.profile_remote_path`` measures ``decode_per_request_s`` and
``decode_per_kv_byte_s`` on FILE's two sites (an offloaded request's TTFT beyond the others).

The server must be the only one on its cores and accelerator: stop the plain server the
endpoint profile was measured on first (a GPU holds one of them, and two on a core time-share
it).

Not pure (processes, HTTP, ``/proc``, the clock): a command's helper; ``commands/profile.py``
owns the command and its flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from prfaas.commands.plumbing_classes import (
    OUTPUT_TOKENS,
    RELAY_BATCHES,
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
from prfaas.commands.profile_first_token import probe_live, with_first_token_wait
from prfaas.errors import UsageError

ZERO_HOW = {
    "decode_per_request_s": "0 by construction: a vLLM site's sidecar serves a local request "
    "with one call to its server, whose cost is prefill_per_request_s",
    "decode_per_context_token_s": "0 by construction: the server's whole decode step is in the "
    "endpoint profile's inter-token latency",
    "prefill_in_service_excess": "0 by construction: the endpoint profile times the server's "
    "prefills through its own API, one at a time, as it serves them",
}
MISSING = ("decode_per_kv_byte_s", "prefill_per_token_s", "shared_core_overhead")
"""Not measured on a one-site vLLM deployment: the remote path's KV (moved inside the server)
and the cost of a second process on the server's core."""


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """What ``--plumbing-of`` measures: the one-site deployment's text, the profile it adds to,
    its node process's name."""

    text: str
    profile: Path
    site: str


def one_site_deployment(path: Path) -> Target:
    """FILE's home PD site alone, as ``measure`` launches it: its engine section and nodes, the
    gateway's cores, fresh ports and key, ``router: local_only``; a ``UsageError`` where FILE
    cannot be measured this way (not a vLLM site, no profile file)."""
    from prfaas.config import load_deployment
    from prfaas.perf.profile_file import is_profile_file

    d = load_deployment(path)  # a UsageError naming the field
    home = d.home_site
    if d.engine_for(home.name).kind != "vllm":
        raise UsageError(
            f"--plumbing-of {path}: site {home.name} runs engine kind "
            f"{d.engine_for(home.name).kind!r}; it measures a vLLM site's sidecar and gateway "
            "(`prfaas profile --engine torch` measures a torch deployment's terms itself)"
        )
    if not is_profile_file(home.hardware):
        raise UsageError(
            f"--plumbing-of {path}: site {home.name}'s hardware {home.hardware!r} is a preset, not "
            "a profile file: profile its server first (`prfaas profile --endpoint`, "
            "docs/profiles.md) and name the file"
        )
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    site = next(s for s in raw["sites"] if s["name"] == home.name)
    gateway = {k: v for k, v in (raw.get("gateway") or {}).items() if k in ("host", "cpus")}
    out = {
        "engine": raw.get("engine", {}),
        "gateway": {**gateway, "port": 0, "control_port": 0, "request_timeout_s": 600},
        "policy": {"router": "local_only", "tune_min_samples": 1_000_000},
        "sites": [{**site, "hardware": home.hardware}],  # resolved: the file moves
        "psk": secrets.token_hex(16),
    }
    text = "# Written by prfaas profile --plumbing-of: the deployment it measures.\n"
    return Target(text + yaml.safe_dump(out, sort_keys=False), Path(home.hardware), home.name)


def measure(target: Target, workdir: Path, *, requests: int, seed: int) -> tuple[Any, Any]:
    """``(PlumbingCosts, how)`` measured on ``target``'s deployment (launched in ``workdir``)."""
    from prfaas.commands.launch_checks import check_model_folders
    from prfaas.config import load_deployment
    from prfaas.perf.plumbing import PlumbingCosts
    from prfaas.perf.profile_read import load_profile_file

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "plumbing-deployment.yaml"
    path.write_text(target.text, encoding="utf-8")
    d = load_deployment(path)
    check_model_folders(d)
    say(f"plumbing: starting site {target.site} alone (gateway, sidecar, vLLM server)")
    launcher = started(d, workdir / "plumbing-run", "--plumbing-of")
    try:  # started() stopped what it started if it failed; stop() the rest here
        send = Sender(launcher.url, d.engine.model, seed)
        pids = {"gateway": launcher.child("gateway").proc.pid,
                "sidecar": launcher.child(target.site).proc.pid}  # fmt: skip
        send(SHORT_PROMPT_TOKENS, 2, 2)  # warm-up: the server's first passes, lazy imports
        idle = idle_rates(pids)

        def counters() -> Counters:
            return reported_counters(launcher, d.heartbeat_interval_s)

        # (requests, the server's steps, tokens, CPU seconds per process) per class: one at a
        # time with 1 and K tokens, then K tokens at each batch size.
        classes = []
        for output in (1, OUTPUT_TOKENS):
            say(f"plumbing: {requests} requests of {SHORT_PROMPT_TOKENS} prompt, {output} output "
                "tokens")  # fmt: skip
            at = counters()
            run = functools.partial(send, SHORT_PROMPT_TOKENS, output, requests)
            per_request = class_cpu(pids, idle, requests, run)
            cpu = {p: v * requests for p, v in per_request.items()}
            classes.append((requests, counters().since(at).decode_steps, requests * output, cpu))
        batched = batched_classes(send, pids, idle, requests, counters, say)
        for n, counted, cpu in batched.values():
            classes.append((n, counted.decode_steps, n * OUTPUT_TOKENS, cpu))
        probes = probe_live(send, say)
    finally:
        launcher.stop()
    notes: dict[str, str] = {}

    def floor0(name: str, value: float) -> float:
        if value < 0:
            notes[name] = f"; measured {value:.3g}, stored 0 (below the noise)"
            return 0.0
        return value

    fit_how: dict[str, str] = {}

    def terms(process: str, per_request: str, per_token: str, per_step: str) -> tuple[float, ...]:
        """(per request, per output token, per step) of ``process``, fitted over the classes
        (every token, the first too, comes out of one of the server's steps); per step -1
        where no class made a batch."""
        req, tok, step, how = relay_terms(process, classes)
        for name in (per_request, per_token, per_step):
            fit_how[name] = how
        return floor0(per_request, req), floor0(per_token, tok), -1.0 if step is None else step

    gw_req, gw_tok, gw_step = terms(
        "gateway", "gateway_per_request_s", "gateway_per_output_token_s", "gateway_per_step_s"
    )
    car_req, car_tok, car_step = terms(
        "sidecar", "prefill_per_request_s", "decode_per_output_token_s", "decode_per_step_s"
    )
    unsplit = tuple(n for n, v in (("gateway_per_step_s", gw_step),
                                   ("decode_per_step_s", car_step)) if v < 0)  # fmt: skip
    costs = PlumbingCosts(
        prefill_per_request_s=car_req, decode_per_output_token_s=car_tok,
        gateway_per_request_s=gw_req, gateway_per_output_token_s=gw_tok,
        decode_per_step_s=max(0.0, car_step), gateway_per_step_s=max(0.0, gw_step),
        missing=(*MISSING, *unsplit),
    )  # fmt: skip
    common = (
        f"process CPU (/proc, idle rate removed) of site {target.site} deployed alone, classes "
        f"of {SHORT_PROMPT_TOKENS}-token prompts: {requests} one at a time with 1 and "
        f"{OUTPUT_TOKENS} output tokens, then {OUTPUT_TOKENS} tokens "
        f"{' and '.join(map(str, RELAY_BATCHES))} at once, the server's steps counted by the "
        "decode node"
    )
    sidecar = "the sidecar (not its server)"
    how = {
        **ZERO_HOW,
        "gateway_per_request_s": f"{common}; gateway",
        "gateway_per_output_token_s": f"{common}; gateway",
        "gateway_per_step_s": f"{common}; gateway",
        "prefill_per_request_s": f"{common}; {sidecar}: the call to its server, prefill and decode",
        "decode_per_output_token_s": f"{common}; {sidecar}",
        "decode_per_step_s": f"{common}; {sidecar}: its relay's wake-ups, the server's own step "
        "being in the endpoint profile's inter-token latency",
    }
    for name in unsplit:
        del how[name]
    for name, note in (*fit_how.items(), *notes.items()):
        if name in how:
            how[name] += note
    # Last, read against the simulator with every term above.
    pf = dataclasses.replace(
        load_profile_file(target.profile), plumbing=costs, plumbing_how=tuple(how.items())
    )
    pf = with_first_token_wait(pf, d, probes, say)
    return pf.plumbing, pf.plumbing_how


def run_plumbing_of(args: argparse.Namespace) -> Any:
    """The profile FILE's home PD site names, with the plumbing terms measured on FILE; with
    ``--remote-path``, the remote path's two terms too (``commands.profile_remote_path``)."""
    from prfaas.perf.profile_file import ProfileFileError
    from prfaas.perf.profile_read import load_profile_file

    if args.plumbing_requests < 2:
        raise UsageError(f"--plumbing-requests must be >= 2, got {args.plumbing_requests}")
    if not args.plumbing_of.is_file():
        raise UsageError(f"--plumbing-of: no deployment file {args.plumbing_of}")
    target = one_site_deployment(args.plumbing_of)
    try:
        pf = load_profile_file(target.profile)
    except ProfileFileError as exc:
        raise UsageError(f"--plumbing-of {args.plumbing_of}: {exc}") from None
    remote = None
    if args.remote_path:
        from prfaas.commands.profile_remote_path import two_site_deployment

        remote = two_site_deployment(args.plumbing_of)  # refused before anything starts
    seed = args.seed if args.seed is not None else 0  # a fresh server: no prompt is cached
    with tempfile.TemporaryDirectory(prefix="prfaas-plumbing-") as tmp:
        costs, how = measure(target, Path(tmp), requests=args.plumbing_requests, seed=seed)
        pf = dataclasses.replace(pf, plumbing=costs, plumbing_how=how)
        if remote is None:
            return pf
        from prfaas.commands.profile_remote_path import probe_remote_path, with_remote_path

        d, classes = probe_remote_path(
            remote, Path(tmp) / "remote", requests=args.plumbing_requests, seed=seed + 1,
            say=lambda m: print(m, file=sys.stderr, flush=True),
        )  # fmt: skip
    return with_remote_path(pf, d, classes, remote)
