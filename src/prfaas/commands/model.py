"""``prfaas model``: tiny random-weight models for tests and benchmarks, and a model's cache spec.

``make-tiny --arch ARCH --out DIR`` writes a random-weight model of a supported architecture with a
byte-level BPE tokenizer trained on local text (nothing is downloaded); ``--for-vllm`` sizes it
so vLLM on CPU loads it too. ``info DIR`` prints the
cache layout ``engine.torch`` derives from a model folder. torch is imported only inside ``run``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError


def register(subparsers: Any) -> None:
    from prfaas.engine.hf_spec import SUPPORTED_ARCHITECTURES

    p = subparsers.add_parser(
        "model",
        help="make tiny random-weight models; show a model folder's cache layout",
        description="Local model folders for engine.torch. Architectures: "
        + ", ".join(SUPPORTED_ARCHITECTURES)
        + ".",
    )
    sub = p.add_subparsers(dest="model_command", required=True, metavar="SUBCOMMAND")
    mk = sub.add_parser(
        "make-tiny",
        help="write a tiny random-weight model with a locally trained tokenizer",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    mk.add_argument("--arch", required=True, help="architecture (Hugging Face model_type)")
    mk.add_argument("--out", required=True, type=Path, help="output folder")
    mk.add_argument("--seed", type=int, default=0, help="weight seed")
    mk.add_argument("--vocab-size", type=int, default=512, help="tokenizer vocabulary")
    mk.add_argument(
        "--max-position-embeddings", type=int, default=None, metavar="N",
        help="the model's context, tokens (default 2048): long workloads need a longer one",
    )  # fmt: skip
    mk.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16"],
        help="weight dtype (default: float32; with --for-vllm the one vLLM needs)",
    )
    mk.add_argument(
        "--for-vllm",
        action="store_true",
        help="size it for vLLM on CPU (head dims >= 32; Qwen3-Next in bf16); refuses "
        "architectures vLLM cannot load",
    )
    mk.set_defaults(run=run_make_tiny)
    info = sub.add_parser("info", help="print the cache layout derived from a model folder")
    info.add_argument("model_dir", type=Path)
    info.add_argument("--json", action="store_true")
    info.set_defaults(run=run_info)


def _arch(name: str) -> str:
    from prfaas.engine.hf_spec import SUPPORTED_ARCHITECTURES

    arch = name.replace("-", "_").lower()
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UsageError(
            f"unknown architecture {name!r} (known: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def run_make_tiny(args: argparse.Namespace) -> int:
    arch = _arch(args.arch)
    if args.vocab_size < 300:
        raise UsageError(f"--vocab-size must be >= 300 (bytes + merges), got {args.vocab_size}")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} exists and is not a folder")
    if args.max_position_embeddings is not None and args.max_position_embeddings < 16:
        raise UsageError(
            f"--max-position-embeddings must be >= 16, got {args.max_position_embeddings}"
        )
    from prfaas.engine.errors import UnknownArchitecture
    from prfaas.engine.torch.tiny import make_tiny, vllm_variant

    overrides: dict[str, Any] = {}
    dtype = args.dtype or "float32"
    if args.for_vllm:
        try:
            overrides, vllm_dtype = vllm_variant(arch)
        except UnknownArchitecture as exc:
            raise UsageError(str(exc)) from None
        if vllm_dtype is not None:
            if args.dtype not in (None, vllm_dtype):
                raise UsageError(
                    f"--dtype {args.dtype}: vLLM on CPU runs {arch} in {vllm_dtype} only"
                )
            dtype = vllm_dtype
    if args.max_position_embeddings is not None:
        overrides = {**overrides, "max_position_embeddings": args.max_position_embeddings}
    out = make_tiny(
        arch, args.out, seed=args.seed, vocab_size=args.vocab_size, dtype=dtype,
        overrides=overrides,
    )  # fmt: skip
    print(f"wrote a tiny {arch} model ({dtype}{', for vLLM' if args.for_vllm else ''}) to {out}")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from prfaas.engine.hf_spec import cache_map_from_config, check_architecture
    from prfaas.engine.torch.loader import config_mapping, read_config

    raw = read_config(args.model_dir)  # clear errors for a missing folder / config
    check_architecture(raw.get("model_type"))
    cmap = cache_map_from_config(config_mapping(AutoConfig.from_pretrained(args.model_dir)))
    rows: list[dict[str, Any]] = [  # one JSON object per cache layer
        {
            "position": pos,
            "model_layer": cmap.model_layers[pos],
            "kind": la.kind.value,
            "tensors": [
                {"name": t.name, "shape": list(t.shape), "dtype": t.dtype.value}
                for t in (*la.per_token, *la.fixed)
            ],
            "bytes_per_token": la.bytes_per_token,
            "fixed_bytes": la.fixed_bytes,
        }
        for pos, la in enumerate(cmap.spec.layers)
    ]
    if args.json:
        print(
            json.dumps({"model_type": cmap.model_type, "dtype": cmap.dtype.value, "layers": rows})
        )
        return 0
    print(f"{cmap.model_type} ({cmap.dtype.value}), max context {cmap.max_context_tokens} tokens")
    for r in rows:
        shapes = ", ".join(f"{t['name']}{tuple(t['shape'])}:{t['dtype']}" for t in r["tensors"])
        print(f"  {r['position']:3d} (layer {r['model_layer']:3d}) {r['kind']:6s} {shapes}")
    spec = cmap.spec
    per_token, fixed = spec.full_attention_bytes_per_token, spec.fixed_bytes
    print(f"full-attention bytes/token {per_token}, fixed bytes {fixed}")
    return 0
