"""``prfaas bench``: replay a synthetic or trace workload against any OpenAI-compatible endpoint
(streaming ``/v1/completions``) and report throughput, TTFT and per-token latency percentiles."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prfaas.errors import UsageError

if TYPE_CHECKING:
    # Type-only: the load client is imported when the command runs (a quick `prfaas --help`).
    from prfaas.config import DeploymentConfig
    from prfaas.serve.loadgen import BenchRequest, PromptSynth, RequestResult

PREFLIGHT_TIMEOUT_S = 5.0
DEFAULT_URL = "http://127.0.0.1:8000"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="load-test an OpenAI-compatible endpoint (throughput, TTFT, per-token latency)",
        description=(
            "Sends streaming /v1/completions requests at their arrival times (Poisson or uniform "
            "at --rate with truncated log-normal prompt lengths, or a Mooncake --trace) with at "
            "most --concurrency in flight, and reports throughput, TTFT, per-token and end-to-end "
            "latency (P50/P90/P99) and failures by reason. Prompts are synthesised "
            "deterministically from --seed (trace blocks from their hash ids, so shared prefixes "
            "are real). Exit status: 0 when any request completed, 1 when none did, 2 on bad "
            "flags or an unreachable URL."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--url",
        help="server base URL, with or without /v1 (default: the --deployment's gateway, else "
        f"{DEFAULT_URL})",
    )
    p.add_argument(
        "--deployment",
        type=Path,
        metavar="FILE",
        help="a prfaas deployment file with its key (the resolved one `prfaas up` writes): the "
        "gateway's signed route log fills the route columns of --requests-csv / --perfetto",
    )
    p.add_argument(
        "--requests-csv",
        type=Path,
        metavar="FILE",
        help="write one row per request (the columns of `prfaas sim --requests-csv`: arrival, "
        "route, nodes, TTFT, end to end, bytes crossed, prefix hit, outcome)",
    )
    p.add_argument(
        "--perfetto",
        type=Path,
        metavar="FILE",
        help="write a Chrome / Perfetto trace (JSON): a track per node, per request a span from "
        "send to first token and one for decode",
    )
    p.add_argument("--model", help="model id (default: the first one /v1/models lists)")
    p.add_argument("--rate", type=float, default=1.0, help="synthetic arrival rate, requests/s")
    p.add_argument(
        "--arrival", choices=("poisson", "uniform"), default="poisson", help="arrival process"
    )
    p.add_argument(
        "--num-requests",
        type=int,
        help="requests to send (default 100 unless --duration; --find-max-rate: per step, 300)",
    )
    p.add_argument("--duration", type=float, help="stop sending after this many seconds")
    p.add_argument(
        "--trace", type=Path, help="Mooncake JSONL trace to replay instead of a synthetic load"
    )
    p.add_argument("--rate-scale", type=float, default=1.0, help="trace: speed-up of arrival times")
    p.add_argument("--mu", type=float, default=9.90, help="log-normal mu of prompt lengths")
    p.add_argument("--sigma", type=float, default=1.00, help="log-normal sigma of prompt lengths")
    p.add_argument("--min-tokens", type=int, default=128, help="shortest prompt (tokens)")
    p.add_argument("--max-tokens", type=int, default=131072, help="longest prompt (tokens)")
    p.add_argument(
        "--output-tokens",
        type=int,
        help="max_tokens per request (default 64; trace: its output_length)",
    )
    p.add_argument("--concurrency", type=int, default=64, help="most requests in flight")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals, lengths and prompts")
    p.add_argument(
        "--vocab-size", type=int, default=256, help="prompt token ids are drawn below this"
    )
    p.add_argument(
        "--prompt-format",
        choices=("tokens", "text"),
        default="tokens",
        help="tokens: exact lengths (vLLM, prfaas); text: ~1 word per token, any server",
    )
    p.add_argument(
        "--no-clip",
        action="store_true",
        help="send prompts longer than the server's max_model_len as they are",
    )
    p.add_argument(
        "--ignore-eos", action="store_true",
        help="ask for exactly max_tokens tokens (vLLM's and prfaas's ignore_eos): realistic "
        "output lengths from a random-weight model",
    )  # fmt: skip
    p.add_argument(
        "--extra-body", metavar="JSON", default=None,
        help='fields added to every request body, e.g. \'{"ignore_eos": true, "temperature": 0}\'',
    )  # fmt: skip
    p.add_argument(
        "--api-key", default=None,
        help="bearer key for the server (a prfaas gateway with gateway.api_keys, vLLM "
        "--api-key) [default: $PRFAAS_API_KEY]",
    )  # fmt: skip
    p.add_argument(
        "--find-max-rate", action="store_true",
        help="measure the endpoint's capacity live by the simulator's rule (steps of constant "
        "open-loop rate from --rate, each of --num-requests: a few hundred, a short step reads "
        "low; a step fails when the requests' latencies grow with their send times, one fails, "
        "or --slo-tpot is missed): serve/loadgen/maxrate.py",
    )  # fmt: skip
    p.add_argument(
        "--slo-tpot", type=float, default=None, metavar="S",
        help="--find-max-rate: the decode SLO, seconds per output token (P90)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)  # fmt: skip


def _check_flags(args: argparse.Namespace) -> None:
    from prfaas.commands.common import positive

    positive("--rate", args.rate)
    positive("--rate-scale", args.rate_scale)
    positive("--timeout", args.timeout)
    positive("--sigma", args.sigma)
    if args.duration is not None:
        positive("--duration", args.duration)
    for flag, value in (
        ("--num-requests", args.num_requests),
        ("--output-tokens", args.output_tokens),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.vocab_size < 2:
        raise UsageError(f"--vocab-size must be >= 2, got {args.vocab_size}")
    if not 0 < args.min_tokens < args.max_tokens:
        raise UsageError(
            f"need 0 < --min-tokens < --max-tokens, got {args.min_tokens}, {args.max_tokens}"
        )
    from prfaas.commands.outputs import check_output

    check_output("--requests-csv", args.requests_csv)
    check_output("--perfetto", args.perfetto)
    if args.deployment is not None and not args.deployment.is_file():
        raise UsageError(f"--deployment: {args.deployment} does not exist")
    if args.url is not None and not args.url.startswith(("http://", "https://")):
        raise UsageError(f"--url must start with http:// or https://, got {args.url!r}")
    if args.trace is not None and not args.trace.is_file():
        raise UsageError(f"trace file {args.trace} does not exist")


def api_key_of(args: argparse.Namespace) -> str | None:
    """``--api-key``, else ``$PRFAAS_API_KEY`` (the variable a prfaas gateway reads its key
    from), else None."""
    import os

    from prfaas.serve.api.api_keys import API_KEY_ENV

    return getattr(args, "api_key", None) or os.environ.get(API_KEY_ENV) or None


def extra_body_of(args: argparse.Namespace) -> dict[str, Any]:
    """``--extra-body`` (a JSON object) with ``--ignore-eos`` over it."""
    body: dict[str, Any] = {}
    if args.extra_body is not None:
        try:
            body = json.loads(args.extra_body)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--extra-body: not JSON: {exc.msg}") from None
        if not isinstance(body, dict):
            raise UsageError("--extra-body: want a JSON object, e.g. '{\"ignore_eos\": true}'")
        clash = sorted(set(body) & {"model", "prompt", "stream", "max_tokens"})
        if clash:
            raise UsageError(f"--extra-body: {', '.join(clash)} are set by bench itself")
    if args.ignore_eos:
        body["ignore_eos"] = True
    return body


def base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def preflight(url: str, model: str | None, api_key: str | None = None) -> tuple[str, int | None]:
    """The model to use and its context length (if the server says), or UsageError."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(url + "/v1/models", timeout=PREFLIGHT_TIMEOUT_S, headers=headers)
    except httpx.HTTPError as exc:
        raise UsageError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from None
    cards: list[dict[str, Any]] = []
    if resp.status_code == 401:
        raise UsageError(f"{url} wants an API key: give --api-key or set $PRFAAS_API_KEY")
    if resp.status_code == 200:
        try:
            cards = [c for c in resp.json().get("data", []) if isinstance(c, dict)]
        except (ValueError, AttributeError):
            cards = []
    by_id = {str(c.get("id")): c for c in cards}
    if model is None:
        if not cards:
            raise UsageError(
                f"{url}/v1/models lists no model (status {resp.status_code}); give --model"
            )
        model = str(cards[0].get("id"))
    elif by_id and model not in by_id:
        raise UsageError(f"model {model!r} is not served at {url} (it serves: {', '.join(by_id)})")
    limit = by_id.get(model, {}).get("max_model_len")
    return model, limit if isinstance(limit, int) else None


def run(args: argparse.Namespace) -> int:
    from prfaas.commands.bench_workload import build_workload, clip_to_context
    from prfaas.serve.loadgen import PromptSynth, summarize

    _check_flags(args)
    extra = extra_body_of(args)
    api_key = api_key_of(args)
    deployment = _deployment(args.deployment)
    url = base_url(args.url or (deployment.gateway.url if deployment else DEFAULT_URL))
    if args.find_max_rate:
        from prfaas.commands.bench_maxrate import run_find_max_rate

        model, max_model_len = preflight(url, args.model, api_key)
        return run_find_max_rate(args, url, model, max_model_len, extra, api_key)
    requests = build_workload(args)
    model, max_model_len = preflight(url, args.model, api_key)
    if deployment is not None:
        _routes(deployment, args.deployment)  # the key and the control port work: before the load
    num_clipped = 0
    if max_model_len is not None and not args.no_clip:
        requests, num_clipped = clip_to_context(requests, max_model_len)
    synth = PromptSynth(args.seed, args.vocab_size, args.prompt_format)
    meta = {
        "url": url,
        "model": model,
        "workload": {
            "source": str(args.trace) if args.trace else f"{args.arrival} x lognormal",
            "rate_rps": None if args.trace else args.rate,
            "rate_scale": args.rate_scale if args.trace else None,
            "seed": args.seed,
            "concurrency": args.concurrency,
            "prompt_format": args.prompt_format,
            "num_clipped_to_context": num_clipped,
            "extra_body": extra,
        },
    }
    results, wall_s = _run_with_progress(args, requests, url, model, synth, extra, api_key)
    summary = summarize(results, wall_s, meta)
    if args.requests_csv is not None or args.perfetto is not None:
        routes: list[dict[str, Any]] = []
        if deployment is not None:
            try:
                routes = _routes(deployment, args.deployment)
            except UsageError as exc:  # the gateway went away during the load: keep the timings
                print(f"prfaas bench: no route log ({exc}); rows without routes", file=sys.stderr)
        _export(args, requests, results, routes, synth)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        from rich.console import Console

        from prfaas.serve.loadgen.report import render

        Console().print(render(summary))
    return 0 if summary["completed"] > 0 or not results else 1


def _deployment(path: Path | None) -> DeploymentConfig | None:
    if path is None:
        return None
    from prfaas.commands.gateway_access import load_with_ports

    return load_with_ports(path)  # a bad file: UsageError naming it and the field


def _routes(deployment: DeploymentConfig, path: Path) -> list[dict[str, Any]]:
    """The gateway's route log (signed, on its control listener); a refused key or an
    unreachable control port is a ``UsageError``."""
    from prfaas.commands.gateway_access import refusal_error
    from prfaas.serve.control_client import ControlClient, ControlRefused, GatewayUnreachable

    try:
        with ControlClient(deployment, timeout_s=PREFLIGHT_TIMEOUT_S) as client:
            return client.routes()
    except ControlRefused as exc:
        raise (refusal_error(path, exc) or UsageError(str(exc))) from None
    except GatewayUnreachable as exc:
        raise UsageError(f"--deployment {path}: {exc}") from None


def _export(
    args: argparse.Namespace,
    requests: list[BenchRequest],
    results: list[RequestResult],
    routes: list[dict[str, Any]],
    synth: PromptSynth,
) -> None:
    from prfaas.commands.outputs import write_requests_csv, write_trace
    from prfaas.serve.loadgen.export import live_spans, match_routes, request_rows
    from prfaas.sim.perfetto import build_trace

    matched = match_routes(requests, results, routes, synth)
    rows = request_rows(results, matched)
    where = []
    if args.requests_csv is not None:
        write_requests_csv(args.requests_csv, rows)
        where.append(str(args.requests_csv))
    if args.perfetto is not None:
        write_trace(args.perfetto, build_trace(live_spans(rows), title="prfaas bench"))
        where.append(str(args.perfetto))
    why = ""
    if len(matched) < len(rows) and args.deployment is None:
        why = " (give --deployment for the gateway's routes)"
    elif len(matched) < len(rows) and args.prompt_format != "tokens":
        why = " (text prompts: their token ids are the server's)"
    elif len(matched) < len(rows):
        why = " (the rest failed before their prefill, or the log dropped them: route_log_size)"
    print(f"prfaas bench: {len(rows)} requests, {len(matched)} with their route, written to "
          f"{' and '.join(where)}{why}", file=sys.stderr)  # fmt: skip


def _run_with_progress(
    args: argparse.Namespace,
    requests: list[BenchRequest],
    url: str,
    model: str,
    synth: PromptSynth,
    extra: dict[str, Any] | None = None,
    api_key: str | None = None,
) -> tuple[list[RequestResult], float]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from prfaas.serve.loadgen import run_workload

    console = Console(stderr=True)
    show = not args.no_progress and console.is_terminal
    with Progress(
        TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), console=console, transient=True, disable=not show,
    ) as progress:  # fmt: skip
        task = progress.add_task("bench", total=len(requests), status="")
        failed = 0

        def on_done(result: RequestResult) -> None:
            nonlocal failed
            failed += not result.ok
            progress.update(task, advance=1, status=f"{failed} failed")

        coro = run_workload(
            requests, base_url=url, model=model, synth=synth, concurrency=args.concurrency,
            timeout_s=args.timeout, duration_s=args.duration, on_done=on_done, extra_body=extra,
            api_key=api_key,
        )  # fmt: skip
        try:
            return asyncio.run(coro)
        except KeyboardInterrupt:
            print("prfaas bench: interrupted", file=sys.stderr)
            raise
