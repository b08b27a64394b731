"""``prfaas demo``: the paper's PrfaaS-PD deployment, live on this machine, beside the simulator.

Two deployments of emulated nodes of the paper's 1T model (``engine.timed``: H200 PrfaaS nodes,
H20 PD nodes) run as real processes with real KV bytes on real sockets, one after the other, under
the same workload: PrfaaS-PD (4 H200 + 3 PD-P + 5 PD-D, the planner's t, the ``threshold`` router)
and the homogeneous baseline (12 H20 at 9 P / 3 D, ``local_only``). Time runs ``1/time_scale``
times faster than the hardware and payloads are ``1/byte_divisor`` of the real size, so the
100 Gbps link is paced at 100 / byte_divisor / time_scale Gbps; every figure is reported back in
modelled units (seconds of the emulated hardware, real bytes). The simulator runs the same requests
through the same policy objects, and the report sets the two side by side.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from prfaas.config import DeploymentConfig, load_deployment
from prfaas.scenarios import planned_threshold
from prfaas.serve.gateway.hashing import prompt_digest
from prfaas.serve.launcher import Launcher
from prfaas.serve.loadgen import BenchRequest, PromptSynth, run_workload, summarize
from prfaas.sim.report import summary as sim_summary
from prfaas.sim.scenario import SimScenario
from prfaas.sim.simulator import Simulator
from prfaas.workload.arrivals import ArrivalSpec
from prfaas.workload.lengths import TruncatedLogNormal
from prfaas.workload.requests import SimRequestSpec, synthetic_requests, trace_requests

MODEL = "paper-1t"
BLOCK_TOKENS = 512
PREFIX_CACHE_BYTES = 1e12
"""Modelled bytes of prefix cache per site (host memory of the site's nodes; an assumption)."""


@dataclass(frozen=True, slots=True)
class DemoSettings:
    num_requests: int = 120
    rate_rps: float = 2.6
    """Modelled arrivals per second: above the homogeneous capacity (2.11), below PrfaaS-PD's."""
    output_tokens: int = 1024
    time_scale: float = 0.5
    byte_divisor: int = 1000
    token_chunk: int = 64
    seed: int = 0
    trace: Path | None = None
    rate_scale: float = 1.0
    link_gbps: float = 100.0


EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DEPLOYMENT_FILES = ("paper-prfaas-pd.yaml", "paper-homogeneous.yaml")
"""The demo's two deployments, as the deployment files a user can run, simulate and plan."""


@dataclass(frozen=True, slots=True)
class Deployment:
    name: str
    policy: str
    n_prfaas: int
    n_p: int
    n_d: int
    threshold_tokens: int
    config: DeploymentConfig
    """The deployment file it was read from (before the demo's settings apply)."""


def deployments(link_gbps: float, folder: Path = EXAMPLES) -> list[Deployment]:
    """The demo's deployments, read from ``folder`` (the repository's ``examples/``)."""
    out = []
    for filename in DEPLOYMENT_FILES:
        d = load_deployment(folder / filename)
        if link_gbps != 100.0:
            links = [dataclasses.replace(lk, gbps=link_gbps) for lk in d.links]
            d = d.model_copy(update={"links": links})
        roles = [n.role for n in d.home_site.nodes]
        n_prfaas = sum(len(s.nodes) for s in d.sites if s.kind == "prfaas")
        out.append(
            Deployment(
                filename.removesuffix(".yaml").removeprefix("paper-"), d.policy.router, n_prfaas,
                roles.count("prefill"), roles.count("decode"), planned_threshold(d), d,
            )
        )  # fmt: skip
    return out


def workload(s: DemoSettings) -> list[SimRequestSpec]:
    if s.trace is not None:
        from prfaas.workload.mooncake import read_mooncake

        records = read_mooncake(s.trace, limit=s.num_requests)
        return list(trace_requests(records, rate_scale=s.rate_scale))
    duration = s.num_requests / s.rate_rps
    gen = synthetic_requests(
        ArrivalSpec("uniform", s.rate_rps),
        TruncatedLogNormal(),  # the paper's workload: mu 9.90, sigma 1.00 on [128, 131072]
        s.output_tokens,
        duration,
        random.Random(s.seed),
    )
    return list(gen)[: s.num_requests]


def deployment_config(dep: Deployment, s: DemoSettings) -> DeploymentConfig:
    """The deployment file with the demo's settings over it (scales, seedable threshold)."""
    d = dep.config
    engine = d.engine.model_copy(update={
        "time_scale": s.time_scale, "byte_divisor": s.byte_divisor, "token_chunk": s.token_chunk,
    })  # fmt: skip
    policy = d.policy.model_copy(update={"threshold_tokens": dep.threshold_tokens})
    return d.model_copy(update={"engine": engine, "policy": policy})


def sim_scenario(dep: Deployment, s: DemoSettings, specs: Sequence[SimRequestSpec]) -> SimScenario:
    """The same deployment file as the simulator's scenario, for exactly the live requests."""
    from dataclasses import replace

    from prfaas import scenarios

    sc = scenarios.sim_scenario(deployment_config(dep, s))
    # The live prefix store is one per site process: the simulator's per-node pool shares it.
    sites = tuple(
        replace(site, cache_bytes_per_node=PREFIX_CACHE_BYTES / max(1, site.num_prefill))
        for site in sc.sites
    )
    last = max(spec.arrival_s for spec in specs)
    return replace(
        sc, sites=sites, duration_s=last + 1e-6, drain_s=3600.0, seed=s.seed,
        prefix_cache=s.trace is not None, tune=False,
    )  # fmt: skip


def run_sim(dep: Deployment, s: DemoSettings, specs: Sequence[SimRequestSpec]) -> dict[str, Any]:
    sim = Simulator(sim_scenario(dep, s, specs), iter(specs))
    offloaded: dict[int, bool] = {}
    sim.on_finish = lambda req: offloaded.__setitem__(req.index, bool(req.offloaded))
    sim.run()
    out = sim_summary(sim)
    link = next(iter(out["links"].values()), None)
    end = max(out["simulated_s"], 1e-9)
    return {
        "requests": out["requests"]["arrived"],
        "completed": out["requests"]["completed"],
        "failed": out["requests"]["failed"],
        "offloaded": out["requests"]["offloaded"],
        "throughput_rps": out["requests"]["completed"] / end,
        "ttft_p50_s": out["ttft_s"]["p50"],
        "ttft_p90_s": out["ttft_s"]["p90"],
        "cross_site_bytes": link["bytes_moved"] if link else 0,
        "link_utilisation": link["mean_utilisation"] if link else 0.0,
        "prefix_hit_rate": {k: v["prefix_hit_rate"] for k, v in out["sites"].items()},
        "offloaded_by_request": [offloaded.get(sp.index) for sp in specs],
    }


def _bench_requests(specs: Sequence[SimRequestSpec], time_scale: float) -> list[BenchRequest]:
    return [
        BenchRequest(
            sp.index, sp.arrival_s * time_scale, sp.num_prompt_tokens, sp.num_output_tokens,
            sp.block_hashes,
        )
        for sp in specs
    ]  # fmt: skip


def run_live(
    dep: Deployment,
    s: DemoSettings,
    specs: Sequence[SimRequestSpec],
    workdir: Path,
    on_done: Callable[[], None] | None = None,
) -> dict[str, Any]:
    config = deployment_config(dep, s)
    with Launcher(config, workdir / dep.name) as launcher:
        results, wall_s = asyncio.run(
            run_workload(
                _bench_requests(specs, s.time_scale),
                base_url=launcher.url,
                model=MODEL,
                synth=PromptSynth(seed=s.seed),
                concurrency=1024,
                timeout_s=600,
                on_done=(lambda _r: on_done()) if on_done else None,
                # token ids in every chunk: TTFT is the first token, whatever text it makes
                extra_body={"return_token_ids": True},
            )
        )
        routes = launcher.routes()  # signed, on the control listener
    report = summarize(results, wall_s, {})
    synth = PromptSynth(seed=s.seed)
    by_digest = {r["prompt_digest"]: r for r in routes}
    offloaded_by_request = []
    for req in _bench_requests(specs, s.time_scale):
        route = by_digest.get(prompt_digest(synth.token_ids(req)))
        offloaded_by_request.append(None if route is None else bool(route["offloaded"]))
    ok = [r for r in results if r.ok]
    end_wall = max((r.sent_s + (r.latency_s or 0.0) for r in ok), default=1e-9)
    ts = s.time_scale
    moved = sum(r["kv_bytes"] for r in routes if r["offloaded"])
    capacity_bytes = s.link_gbps * 1e9 / 8 * (end_wall / ts)
    return {
        "requests": report["requests"],
        "completed": report["completed"],
        "failed": report["failed"],
        "offloaded": sum(1 for r in routes if r["offloaded"]),
        "throughput_rps": len(ok) / (end_wall / ts),
        "ttft_p50_s": (report["ttft_s"]["p50"] or 0.0) / ts,
        "ttft_p90_s": (report["ttft_s"]["p90"] or 0.0) / ts,
        "cross_site_bytes": moved,
        "link_utilisation": moved / capacity_bytes if dep.n_prfaas else 0.0,
        "prefix_hit_rate": _hit_rates(routes),
        "offloaded_by_request": offloaded_by_request,
    }


def _hit_rates(routes: list[dict[str, Any]]) -> dict[str, float]:
    """Per prefill site: prefix tokens reused over prompt tokens looked up (as the simulator)."""
    looked: dict[str, int] = {}
    hit: dict[str, int] = {}
    for r in routes:
        site = r["prefill_site"]
        looked[site] = looked.get(site, 0) + r["num_prompt_tokens"]
        hit[site] = hit.get(site, 0) + r["num_cached_tokens"]
    return {site: hit[site] / looked[site] for site in looked}


TORCH_PROMPTS = (
    # Long enough (in the tiny model's tokens) to exceed the showcase threshold: PrfaaS prefill.
    "Prefill-as-a-Service runs the long, uncached prefills of hybrid-attention models in a "
    "remote cluster of compute-dense accelerators, and streams their key-value cache and "
    "recurrent states layer by layer over ordinary Ethernet to a local cluster that decodes. "
    "Only a few layers keep full attention, so the cache is small enough to cross datacenters.",
    # Short: prefilled locally by the PD-P node.
    "What does the decode node do?",
)
TORCH_THRESHOLD_TOKENS = 48
TORCH_MAX_TOKENS = 16


def torch_showcase(workdir: Path) -> dict[str, Any]:
    """A real (tiny, random-weight) Qwen3-Next hybrid answering real prompts through both paths;
    each answer is checked token for token against single-process generation."""
    import torch
    from transformers.utils import logging as hf_logging

    from prfaas.engine import PrefillRequest, SamplingParams
    from prfaas.engine.torch import TorchEngine
    from prfaas.engine.torch.tiny import make_tiny

    torch.set_num_threads(1)
    # No notes about GPU kernels a CPU run does not have (transformers leaves these unannotated).
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model_dir = make_tiny("qwen3_next", workdir / "tiny-qwen3-next")
    config = DeploymentConfig.model_validate(
        {
            "engine": {"kind": "torch", "model": "tiny-qwen3-next", "model_path": str(model_dir),
                       "block_tokens": 16, "checkpoint_every_blocks": 1},
            "gateway": {"port": 0, "request_timeout_s": 120},
            "policy": {"router": "threshold", "threshold_tokens": TORCH_THRESHOLD_TOKENS},
            "sites": [
                {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
                 "nodes": [{"name": "pf0", "role": "prefill"}]},
                {"name": "pd", "kind": "pd", "hardware": "h20",
                 "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
            ],
            "links": [{"src": "prfaas", "dst": "pd", "gbps": 100}],
        }
    )  # fmt: skip
    reference = TorchEngine.from_folder(model_dir)
    answers = []
    with Launcher(config, workdir / "torch") as launcher:
        for i, prompt in enumerate(TORCH_PROMPTS):
            body = {"model": "tiny-qwen3-next", "prompt": prompt, "max_tokens": TORCH_MAX_TOKENS,
                    "temperature": 0, "return_token_ids": True}  # fmt: skip
            r = httpx.post(f"{launcher.url}/v1/completions", json=body, timeout=120)
            r.raise_for_status()
            choice = r.json()["choices"][0]
            rid = r.json()["id"]
            route = next(x for x in launcher.routes()
                         if x["request_id"] == rid)  # fmt: skip
            ids = reference_ids = list(choice["token_ids"])
            prompt_ids = launcher_tokenizer(model_dir).encode(prompt, add_special_tokens=False)
            sampling = SamplingParams(max_new_tokens=TORCH_MAX_TOKENS)
            reference_ids = reference.generate(
                PrefillRequest(f"ref-{i}", tuple(prompt_ids), sampling)
            )
            if choice["finish_reason"] == "stop":
                reference_ids = reference_ids[:-1]
            answers.append(
                {
                    "prompt_tokens": len(prompt_ids),
                    "prefill_site": route["prefill_site"],
                    "text": choice["text"],
                    "identical_to_single_process": ids == reference_ids,
                }
            )
    return {"threshold_tokens": TORCH_THRESHOLD_TOKENS, "answers": answers}


def launcher_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def add_money(dep: Deployment, run: dict[str, Any], specs: Sequence[SimRequestSpec]) -> None:
    """Put the deployment's $/hour and $ per million output tokens at the throughput this run
    reached into ``run`` (prices from the deployment file's ``prices:``, else the assumption)."""
    from prfaas.analytic.prices import instances_by_hardware, money

    d = dep.config
    instances = instances_by_hardware(
        d.engine.model, ((site.hardware, len(site.nodes)) for site in d.sites)
    )
    n = max(1, len(specs))
    mean_prompt = sum(sp.num_prompt_tokens for sp in specs) / n
    mean_output = sum(sp.num_output_tokens for sp in specs) / n
    rate = run["throughput_rps"]
    m = money(instances, d.prices, rate * mean_prompt, rate * mean_output)
    run["money"] = None if m is None else m.as_dict()
