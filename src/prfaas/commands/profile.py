"""``prfaas profile``: measure a serving engine and write a profile file (docs/profiles.md).

Three sources: ``--engine torch --model-path DIR`` times ``engine.torch``'s forward passes
in-process; ``--endpoint URL --model NAME`` times any OpenAI-compatible server (TTFT of streamed
``max_tokens: 1`` completions at controlled prompt lengths, cached-prefix points by sending a
shared prefix first, inter-token latency at controlled concurrency); ``--preset MODEL@HARDWARE``
writes a shipped profile. Every point is a median over ``--repeats`` with its spread (max - min).
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path
from typing import Any

from prfaas.commands.profile_passes import PassTimer
from prfaas.commands.profile_points import PointProgress, median_spread
from prfaas.errors import MeasurementError, UsageError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile",
        help="measure an engine (in-process torch or an OpenAI endpoint) into a profile file",
        description=(
            "Measure prefill time over new and cached prompt tokens and decode step time over "
            "batch and context, and write a profile file (YAML, version 1, docs/profiles.md) "
            "that `plan --prfaas-profile/--local-profile`, `kv --profile` and deployment files "
            "read."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--engine", choices=["torch"], help="profile engine.torch in-process")
    src.add_argument("--endpoint", metavar="URL", help="profile an OpenAI-compatible server")
    src.add_argument("--preset", metavar="MODEL@HARDWARE", help="write a shipped profile")
    src.add_argument(
        "--plumbing-of", type=Path, metavar="FILE",
        help="measure a vLLM deployment's plumbing terms (gateway, sidecar) on FILE's home PD "
        "site launched alone, and write the profile that site names with them added (-o may be "
        "that file); stop the plain server the profile was measured on first",
    )  # fmt: skip
    p.add_argument("-o", "--output", type=Path, required=True, help="profile file to write")
    p.add_argument(
        "--remote-path", action="store_true",
        help="--plumbing-of: also measure what an offloaded request pays beyond the other terms "
        "(FILE's first PrfaaS site and its home launched together, every request offloaded, TTFT "
        "against the simulator) into -o's decode_per_request_s and decode_per_kv_byte_s",
    )  # fmt: skip
    p.add_argument("--model-path", type=Path, help="--engine torch: the model folder")
    p.add_argument("--device", default="cpu", help="--engine torch: cpu, cuda, cuda:1 ...")
    p.add_argument("--model", help="--endpoint: the served model name")
    p.add_argument(
        "--model-spec", metavar="PRESET|DIR",
        help="--endpoint: the model's preset or folder (its cache layout goes in the file)",
    )  # fmt: skip
    p.add_argument("--hardware", help="hardware name written in the file [a guess from --device]")
    p.add_argument(
        "--memory-bytes", type=float, default=None,
        help="memory of the instance (sizes KV budgets) [--engine: the device's]",
    )  # fmt: skip
    p.add_argument("--new-tokens", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--cached-tokens", type=int, nargs="+", default=[0, 256])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 1024], help="per request")
    p.add_argument("--decode-steps", type=int, default=8, help="tokens per decode measurement")
    p.add_argument(
        "--pass-tokens", type=int, default=512, metavar="N",
        help="--engine torch: prefill in passes ending at multiples of N tokens, as engine.torch "
        "runs them (it checkpoints the prefix at every engine.block_tokens block: give the "
        "deployment's block_tokens if not the default 512; 0: one pass)",
    )  # fmt: skip
    p.add_argument(
        "--no-plumbing", action="store_true",
        help="--engine torch: skip the plumbing terms (measured by default through a live "
        "one-site deployment of the model: gateway, prefill node, decode node)",
    )  # fmt: skip
    p.add_argument(
        "--plumbing-requests", type=int, default=16, metavar="N",
        help="--engine torch, --plumbing-of: requests per class of the plumbing measurement",
    )  # fmt: skip
    p.add_argument(
        "--sharing-rounds", type=int, default=3, metavar="N",
        help="--engine torch on CPU: rounds (alone, then beside a second pinned process) of the "
        "shared_core_overhead measurement (~3 s each on a tiny model); 0: not measured",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=1,
        help="--engine torch: the plumbing deployment's torch threads per node process",
    )  # fmt: skip
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0, help="--endpoint: seconds per request")
    p.add_argument(
        "--api-key", default=None, help="--endpoint: the server's bearer key [$PRFAAS_API_KEY]"
    )
    p.add_argument(
        "--seed", type=int, default=None,
        help="prompt token seed [--engine torch: 0; --endpoint: a fresh one per run, recorded in "
        "the file: a server's prefix cache still holds an earlier run's prompts, and the same "
        "seed again would time its cache hits]",
    )  # fmt: skip
    p.set_defaults(run=run)


def _check_grid(args: argparse.Namespace) -> None:
    for name in ("new_tokens", "batch_sizes", "contexts"):
        for value in getattr(args, name):
            if value <= 0:
                raise UsageError(f"--{name.replace('_', '-')} values must be > 0, got {value}")
    if any(c < 0 for c in args.cached_tokens):
        raise UsageError(f"--cached-tokens values must be >= 0, got {args.cached_tokens}")
    if len({n for n in args.new_tokens}) < 2:
        raise UsageError("--new-tokens needs at least two distinct lengths (a curve)")
    if len(args.batch_sizes) * len(args.contexts) < 3:
        raise UsageError("--batch-sizes x --contexts needs at least 3 points (a decode fit)")
    if args.pass_tokens < 0:
        raise UsageError(f"--pass-tokens must be >= 0 (0: one pass), got {args.pass_tokens}")
    if args.sharing_rounds < 0:  # before minutes of profiling, not after
        raise UsageError(f"--sharing-rounds must be >= 0, got {args.sharing_rounds}")
    for name in ("repeats", "decode_steps"):
        if getattr(args, name) < (1 if name == "repeats" else 2):
            raise UsageError(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")


# -- model and hardware descriptions -------------------------------------------------------------
def _model_section_from_folder(path: Path, name: str | None = None) -> Any:
    """Cache layout and sizes of a model folder (as ``prfaas model info`` derives them); the
    parameter count from the model built on torch's meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from prfaas.engine.hf_spec import cache_map_from_config, check_architecture
    from prfaas.engine.torch.loader import config_mapping, read_config
    from prfaas.perf.profile_file import ModelSection

    raw = read_config(path)
    check_architecture(raw.get("model_type"))
    config = AutoConfig.from_pretrained(path)
    cmap = cache_map_from_config(config_mapping(config))
    with torch.device("meta"):
        # transformers leaves from_config unannotated.
        meta = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    params = float(sum(p.numel() for p in meta.parameters()))
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return ModelSection(
        name or path.name,
        cmap.spec,
        params,
        params,
        int(config.hidden_size),
        heads,
        head_dim,
        float(cmap.dtype.num_bytes),
        cmap.max_context_tokens,
    )


def _model_section_from_spec(value: str, served: str) -> Any:
    from prfaas.perf.profile_file import ModelSection
    from prfaas.spec import get_model

    folder = Path(value)
    if folder.is_dir():
        return _model_section_from_folder(folder, served)
    try:
        return ModelSection(get_model(value).name)
    except KeyError as exc:
        raise UsageError(f"--model-spec: {exc.args[0]} and no folder {value} exists") from None


def _host_memory_bytes() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


# -- the in-process torch source -----------------------------------------------------------------
def _profile_torch(args: argparse.Namespace) -> Any:
    import torch

    from prfaas.engine.errors import EngineError
    from prfaas.engine.torch.hf_cache import forward, new_cache
    from prfaas.engine.torch.loader import load_model
    from prfaas.perf.profile_file import (
        DecodePoint,
        DecodeSection,
        HardwareSection,
        PrefillPoint,
        PrefillSection,
        ProfileFile,
    )

    if args.model_path is None:
        raise UsageError("--engine torch needs --model-path DIR")
    try:
        loaded = load_model(args.model_path, device=args.device)
        section = _model_section_from_folder(args.model_path)
    except (EngineError, ValueError, OSError) as exc:
        raise UsageError(f"--model-path {args.model_path}: {exc}") from None
    model, limit = loaded.model, loaded.cmap.max_context_tokens
    cuda = args.device.startswith("cuda")
    timer = PassTimer(loaded, device=args.device, pass_tokens=args.pass_tokens, seed=args.seed)
    ids, positions = timer.ids, timer.positions

    grid = [(n, c) for c in args.cached_tokens for n in args.new_tokens if n + c <= limit]
    decode_grid = [(b, x) for b in args.batch_sizes for x in args.contexts if x < limit]
    prefill_points, decode_points = [], []
    with torch.inference_mode(), PointProgress(len(grid) + len(decode_grid), "warm-up") as bar:
        forward(model, ids(1, 16), new_cache(model), positions(1, 0, 16))  # first-call costs
        for n, c in grid:
            samples = [timer.prefill_s(n, c) for _ in range(args.repeats)]
            prefill_points.append(PrefillPoint(n, c, *median_spread(samples), args.repeats))
            bar.step(f"prefill {n} new after {c} cached")
        for b, ctx in decode_grid:
            step = timer.decode_forward(b, ctx)
            samples = [step() for _ in range(args.repeats)]
            decode_points.append(DecodePoint(b, ctx, *median_spread(samples), args.repeats))
            bar.step(f"decode batch {b} at {ctx} tokens")
    device = torch.cuda.get_device_name(args.device) if cuda else f"cpu x{torch.get_num_threads()}"
    memory = args.memory_bytes
    if memory is None:
        memory = float(torch.cuda.get_device_properties(args.device).total_memory) if cuda else (
            _host_memory_bytes()
        )  # fmt: skip
    return ProfileFile(
        section,
        HardwareSection(args.hardware or device.replace(" ", "-").lower(), memory),
        PrefillSection("piecewise-linear", tuple(prefill_points)),
        DecodeSection("linear", points=tuple(decode_points)),
        (
            ("source", "torch"),
            ("model_path", str(args.model_path)),
            ("device", device),
            ("dtype", loaded.cmap.dtype.value),
            ("torch", str(torch.__version__)),
            *((("pass_tokens", str(args.pass_tokens)),) if args.pass_tokens else ()),
            ("timing", "wall per pass" if cuda else "min(wall, process CPU) per pass"),
        ),
        f"engine.torch forward passes, {args.repeats} repeats per point",
    )


# -- entry ---------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    from prfaas.perf.profile_costs import cost_model_from
    from prfaas.perf.profile_file import ProfileFileError
    from prfaas.perf.profile_read import load_profile_text
    from prfaas.perf.profile_write import dump_profile_file
    from prfaas.perf.profiles import shipped_profile_text

    if not args.output.parent.is_dir():
        raise UsageError(f"-o: folder {args.output.parent} does not exist")
    if args.remote_path and args.plumbing_of is None:
        raise UsageError("--remote-path goes with --plumbing-of FILE (the deployment)")
    if args.preset is not None:
        try:
            text = shipped_profile_text(args.preset)
        except KeyError as exc:
            raise UsageError(exc.args[0]) from None
        args.output.write_text(text, encoding="utf-8")
        print(f"wrote the shipped profile {args.preset} to {args.output}")
        return 0
    if args.plumbing_of is None:
        _check_grid(args)
    try:
        if args.plumbing_of is not None:
            from prfaas.commands.profile_deployment import run_plumbing_of

            pf = run_plumbing_of(args)
        else:
            pf = _measure(args)
            for warning in _falling_prefill(pf):
                print(f"warning: {warning}")
        if args.engine == "torch" and not args.no_plumbing:
            from prfaas.commands.profile_plumbing import with_plumbing

            pf = with_plumbing(pf, args)
    except ProfileFileError as exc:
        # What was measured does not make a profile (its fits refuse it): on this machine, a
        # busy core's noise (a --quick profile in fresh-clone CI).
        raise MeasurementError(
            f"the measured profile is not usable: {exc}; nothing written to {args.output}: "
            "profile again on a quiet core (or with more --repeats)"
        ) from None
    dump_profile_file(pf, args.output)
    if pf.prefill is not None and pf.decode is not None:
        print(f"wrote {args.output}: {len(pf.prefill.points)} prefill and "
              f"{len(pf.decode.points)} decode points")  # fmt: skip
    else:
        print(f"wrote {args.output}")
    from prfaas.perf.plumbing import PLUMBING_TERMS

    for name in PLUMBING_TERMS:
        if name not in pf.plumbing.missing:
            print(f"  plumbing {name}: {getattr(pf.plumbing, name):.4g}")
    try:
        cost = cost_model_from(load_profile_text(args.output.read_text(), str(args.output)))
    except ProfileFileError as exc:  # e.g. an endpoint profile without --model-spec
        print(f"note: not usable as it stands: {exc}")
        return 0
    for p in pf.prefill.points if pf.prefill is not None and args.plumbing_of is None else ():
        if p.cached_tokens:  # the cost model's cached rule against what was measured
            model_s = cost.prefill_s(p.new_tokens, p.cached_tokens)
            print(f"  {p.new_tokens} new after {p.cached_tokens} cached: measured "
                  f"{p.median_s * 1e3:.2f} ms, cost model {model_s * 1e3:.2f} ms")  # fmt: skip
    return 0


def _falling_prefill(pf: Any) -> list[str]:
    """Where an uncached prompt timed faster than a shorter one: a prefill costs more the more
    tokens it has, so the core was busy (noise), and the curve extended past its points carries
    the error to every length beyond them (it priced a 4,096-token prompt below 0 s once, in
    fresh-clone CI: a --quick profile on a loaded core)."""
    if pf.prefill is None:
        return []
    points = sorted((p.new_tokens, p.median_s) for p in pf.prefill.points if not p.cached_tokens)
    return [
        f"prefill of {n1} tokens timed {s1 * 1e3:.3g} ms, of {n0} tokens {s0 * 1e3:.3g} ms: the "
        "core was likely busy; profile again on a quiet core"
        for (n0, s0), (n1, s1) in itertools.pairwise(points)
        if s1 < s0
    ]


def _measure(args: argparse.Namespace) -> Any:
    """The profile of ``--engine torch`` or ``--endpoint`` (its plumbing terms added after)."""
    if args.engine == "torch" and args.seed is None:  # in-process caches start empty
        args.seed = 0
    if args.engine == "torch":
        pf = _profile_torch(args)
    else:
        from prfaas.commands.profile_endpoint import profile_endpoint
        from prfaas.perf.profile_file import ModelSection

        if not args.model:
            raise UsageError("--endpoint needs --model NAME (the served model)")
        section = (
            _model_section_from_spec(args.model_spec, args.model)
            if args.model_spec
            else ModelSection(args.model)
        )
        pf = profile_endpoint(args, section)
    return pf
