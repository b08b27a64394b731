"""``prfaas tokenizer export DEPLOYMENT.yaml -o DIR``: the served model's tokenizer as a Hugging
Face folder, so clients (aiperf, guidellm, ``vllm bench serve``) count tokens as the gateway does.

Engine ``torch``: the model folder's tokenizer files, copied. Engine ``timed``: the emulated byte
tokenizer rebuilt as a Hugging Face one (``serve.api.hf_export``). Either way the command then
loads ``DIR`` with ``AutoTokenizer`` and checks it encodes a probe text to the gateway's ids,
saying so (or how it differs). transformers is imported only inside ``run``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from prfaas.errors import UsageError

PROBE_TEXT = "Hello, world!  héllo wörld 😀 <eos>\n\tend"
"""ASCII, Latin-1, a 4-byte character, a special token's text and whitespace runs."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tokenizer",
        help="export the served model's tokenizer for benchmark clients",
        description="Tokenizer tools for clients of a deployment's OpenAI endpoint.",
    )
    sub = p.add_subparsers(dest="tokenizer_command", required=True, metavar="SUBCOMMAND")
    export = sub.add_parser(
        "export",
        help="write the served model's tokenizer as a Hugging Face folder",
        description=(
            "Write the tokenizer the gateway of DEPLOYMENT uses as a Hugging Face folder, for "
            "clients that count tokens themselves (aiperf --tokenizer DIR, guidellm 0.8 "
            "--tokenizer kind=huggingface_auto,model=DIR, vllm bench serve --tokenizer DIR)."
        ),
    )
    export.add_argument("deployment", type=Path, metavar="DEPLOYMENT.yaml")
    export.add_argument("-o", "--output", type=Path, required=True, metavar="DIR")
    export.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    from prfaas.config import load_deployment
    from prfaas.serve.api import hf_export

    d = load_deployment(args.deployment)
    out: Path = args.output
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out} exists and is not a folder")
    if d.engine.kind in ("torch", "vllm"):  # a real model folder's own tokenizer
        assert d.engine.model_path is not None
        try:
            files = hf_export.copy_tokenizer(Path(d.engine.model_path), out)
        except FileNotFoundError as exc:
            raise UsageError(f"engine.model_path: {exc}") from None
        what = f"the tokenizer of {d.engine.model_path}"
    else:
        from prfaas.perf import cost_model_for_hardware

        limit = cost_model_for_hardware(
            d.engine.model, d.home_site.hardware
        ).model.max_context_tokens
        files = hf_export.export_byte_tokenizer(out, limit)
        what = "the emulated byte tokenizer (engine timed)"
    print(f"wrote {what} to {out}: {', '.join(sorted(f.name for f in files))}")
    verdict = _check(d, out)
    print(verdict)
    return 0


def _check(d: Any, out: Path) -> str:
    """Whether ``AutoTokenizer.from_pretrained(out)`` encodes like the gateway, in one line."""
    from transformers import AutoTokenizer

    from prfaas.serve.run import gateway_tokenizer_and_model

    try:
        gateway_tok, _ = gateway_tokenizer_and_model(d)
        client_tok = AutoTokenizer.from_pretrained(out)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{out}: cannot be loaded back: {exc}") from None
    want = list(gateway_tok.encode(PROBE_TEXT))
    if list(client_tok.encode(PROBE_TEXT)) == want:
        return f"check: AutoTokenizer.from_pretrained({str(out)!r}).encode gives the gateway's ids"
    if list(client_tok.encode(PROBE_TEXT, add_special_tokens=False)) == want:
        return (
            "check: this tokenizer adds special tokens by default and the gateway does not: "
            "count with encode(text, add_special_tokens=False) to match the gateway"
        )
    return "check: WARNING: this tokenizer does not encode a probe text as the gateway does"
