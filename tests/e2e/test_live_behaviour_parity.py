"""Behavioural parity (issue 11, item 2b): one deployment file under the ``prfaas`` router, with
prefix reuse, a link dip and rebalancing on, run live (emulated ``timed`` nodes in real processes,
the link's rate cut through the PrfaaS process's ``POST /link/rate`` at the modelled time the
file's link schedule names) and in the simulator (which reads that schedule): at least 95% of
requests take the same route, at least 90% get the same decode node, and both make the same role
changes (number and direction). Wall times are not compared; the figures and the differing
requests are printed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import control, launched

from prfaas.config import DeploymentConfig
from prfaas.scenarios import sim_scenario
from prfaas.serve.auth import SignedAuth
from prfaas.serve.gateway.hashing import prompt_digest
from prfaas.serve.launcher import Launcher
from prfaas.serve.loadgen import BenchRequest, PromptSynth, run_workload
from prfaas.sim import Simulator
from prfaas.sim.request import SimRequest
from prfaas.workload import SimRequestSpec

pytestmark = pytest.mark.timeout(240)

TIME_SCALE = 0.2
DIP = ((30.0, 0.3), (60.0, 100.0))
"""Modelled (time_s, gbps): the link drops to 0.3 Gbps at 30 s and is back at 100 at 60 s (a
shallower dip changes no decision here: the link still carries the offloaded share)."""
BLOCK = 512
SHARED_BLOCKS = 18  # past checkpoint_every_blocks (16): a prefix hit is worth 16 blocks
NUM_REQUESTS = 60
GAP_S = 1.5
"""Modelled seconds between arrivals (uniform): 90 s of arrivals across the dip."""


def _deployment() -> DeploymentConfig:
    # fmt: off
    raw: dict[str, Any] = {
        "engine": {"kind": "timed", "model": "paper-1t", "time_scale": TIME_SCALE,
                   "byte_divisor": 1000, "token_chunk": 16},
        "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 120},
        "policy": {"router": "prfaas", "rebalance": True, "tune_min_samples": 8,
                   "control_interval_s": 1.0},
        "heartbeat_interval_s": 0.1,
        "sites": [
            {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "p1", "role": "prefill"},
                       {"name": "d0", "role": "decode"}, {"name": "d1", "role": "decode"}]},
        ],
        "links": [{"src": "prfaas", "dst": "pd", "gbps": 100, "rtt_ms": 10,
                   "schedule": [list(step) for step in DIP]}],
        "psk": "test-key-0123456789abcdef",
    }
    # fmt: on
    return DeploymentConfig.model_validate(raw)


def _specs() -> list[SimRequestSpec]:
    """Lengths on both sides of any threshold; every third request repeats one shared prefix."""
    specs = []
    for i in range(NUM_REQUESTS):
        n = 1500 + (i * 7919) % 50000
        blocks = -(-n // BLOCK)
        own = [10_000 * (i + 1) + b for b in range(blocks)]
        if i % 3 == 0:
            n = max(n, (SHARED_BLOCKS + 1) * BLOCK + 100)
            blocks = -(-n // BLOCK)
            own = list(range(1, SHARED_BLOCKS + 1)) + [10_000 * (i + 1) + b for b in range(blocks)]
        specs.append(SimRequestSpec(i, 0.5 + GAP_S * i, n, 32, tuple(own[:blocks])))
    return specs


def _sim_node_names(d: DeploymentConfig) -> dict[str, str]:
    """Live node name -> the simulator's id for it (``site/p<k>``, ``site/d<k>`` in file order)."""
    names: dict[str, str] = {}
    for site in d.sites:
        for role, letter in (("prefill", "p"), ("decode", "d")):
            mine = [n.name for n in site.nodes if n.role == role]
            names.update({name: f"{site.name}/{letter}{k}" for k, name in enumerate(mine)})
    return names


def _run_sim(d: DeploymentConfig, specs: list[SimRequestSpec]) -> dict[str, Any]:
    sc = sim_scenario(d)
    sc = replace(
        sc,
        # One prefix store per site process live: the simulator's per-node pools share its size.
        sites=tuple(
            replace(s, cache_bytes_per_node=1e12 / max(1, s.num_prefill)) for s in sc.sites
        ),
        duration_s=specs[-1].arrival_s + 1e-6,
        drain_s=3600.0,
        prefix_cache=True,
    )
    sim = Simulator(sc, iter(specs))
    done: dict[int, SimRequest] = {}
    sim.on_finish = lambda r: done.__setitem__(r.index, r)
    sim.run()
    return {
        "route": {i: bool(r.offloaded) for i, r in done.items()},
        "decode": {i: r.decode_node for i, r in done.items()},
        "cached": {i: r.num_cached for i, r in done.items()},
        "roles": [(c["node"], c["to"]) for c in sim.metrics.role_changes],
        "thresholds": [(u["t_s"], u["threshold_tokens"]) for u in sim.metrics.threshold_updates],
    }


async def _dip(live: Launcher, url: str) -> None:
    """The file's link schedule, carried out live on the PrfaaS process's sender."""
    start = time.monotonic()
    auth = SignedAuth(live.deployment.psk.encode())  # worker APIs take signed calls only
    async with httpx.AsyncClient(auth=auth, timeout=5.0, trust_env=False) as client:
        for t_s, gbps in DIP:
            await asyncio.sleep(max(0.0, start + t_s * TIME_SCALE - time.monotonic()))
            r = await client.post(f"{url}/link/rate", json={"gbps": gbps})
            r.raise_for_status()


def _run_live(d: DeploymentConfig, specs: list[SimRequestSpec], work: Path) -> dict[str, Any]:
    bench = [
        BenchRequest(s.index, s.arrival_s * TIME_SCALE, s.num_prompt_tokens, s.num_output_tokens,
                     s.block_hashes)
        for s in specs
    ]  # fmt: skip
    synth = PromptSynth(seed=0)
    with launched(d, work) as live:
        endpoints = control(live, "/internal/endpoints")
        pf0 = next(f"http://{e['host']}:{e['http_port']}" for e in endpoints if e["node"] == "pf0")

        async def both() -> tuple[Any, None]:
            return await asyncio.gather(
                run_workload(
                    bench, base_url=live.url, model="paper-1t", synth=synth, concurrency=256,
                    timeout_s=120, extra_body={"return_token_ids": True},
                ),
                _dip(live, pf0),
            )  # fmt: skip

        (results, _), _ = asyncio.run(both())
        routes = live.routes()
        state = control(live, "/internal/control")
        roles = state["role_changes"]
    assert all(r.ok for r in results), [(r.reason, r.message) for r in results if not r.ok][:3]
    by_digest = {r["prompt_digest"]: r for r in routes}
    names = _sim_node_names(d)
    out: dict[str, Any] = {"route": {}, "decode": {}, "cached": {}}
    for b in bench:
        rec = by_digest[prompt_digest(synth.token_ids(b))]
        out["route"][b.index] = bool(rec["offloaded"])
        out["decode"][b.index] = names[rec["decode_node"]]
        out["cached"][b.index] = rec["num_cached_tokens"]
    out["roles"] = [(names[c["node"]], c["to"]) for c in roles]
    # Modelled seconds since the first threshold update would be on another origin: kept as
    # given (the gateway's modelled clock), for the printout only.
    out["thresholds"] = [(u["t_s"], u["threshold_tokens"]) for u in state["threshold_updates"]]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], ...]]:
    d = _deployment()
    specs = _specs()
    sim = _run_sim(d, specs)
    flat = [replace(lk, schedule=()) for lk in d.links]
    undipped = _run_sim(d.model_copy(update={"links": flat}), specs)
    live = _run_live(d, specs, tmp_path_factory.mktemp("behaviour"))
    yield live, sim, undipped


def _agreement(live: dict[int, Any], sim: dict[int, Any]) -> float:
    return sum(live[i] == sim.get(i) for i in live) / len(live)


def _decode_agreement(live: dict[str, Any], sim: dict[str, Any]) -> tuple[float, str]:
    """Decode-node agreement, and how it was read. Where the two made one role change, the same
    way, on different nodes (the rebalancer's pick between two equal decode nodes is a near-tie
    their loads settle: a loaded run converted d1 where the simulator converted d0, and every
    later placement was the mirror image, 8% agreeing), the requests after both stopped
    decoding on their converted node are compared with the two names swapped; before, as they
    are. Which of two equal nodes converts is then not compared, only where requests go."""
    ld, sd = live["decode"], sim["decode"]
    lr, sr = live["roles"], sim["roles"]
    if len(lr) != 1 or len(sr) != 1 or lr[0][1] != sr[0][1] or lr[0][0] == sr[0][0]:
        return _agreement(ld, sd), "names as they are"
    a, b = lr[0][0], sr[0][0]
    last = max([i for i, n in ld.items() if n == a] + [i for i, n in sd.items() if n == b])
    swap = {a: b, b: a}
    mapped = {i: swap.get(n, n) if i > last else n for i, n in ld.items()}
    return _agreement(mapped, sd), f"live's {a} and {b} swapped after request {last}"


def test_live_and_simulated_runs_behave_alike(runs: tuple[dict[str, Any], ...]) -> None:
    live, sim, undipped = runs
    assert len(live["route"]) == len(sim["route"]) == NUM_REQUESTS
    route = _agreement(live["route"], sim["route"])
    decode, read = _decode_agreement(live, sim)
    print(
        f"route agreement {route:.1%}, decode-node agreement {decode:.1%}; "
        f"role changes live {live['roles']} sim {sim['roles']} (decode nodes: {read}); "
        f"offloaded live {sum(live['route'].values())} sim {sum(sim['route'].values())}; "
        f"prefix hits live {sum(1 for v in live['cached'].values() if v)} "
        f"sim {sum(1 for v in sim['cached'].values() if v)}"
    )
    print(f"thresholds live {live['thresholds']}\n           sim {sim['thresholds']}")
    for kind in ("route", "decode"):
        differ = {
            i: (live[kind][i], sim[kind][i]) for i in live[kind] if live[kind][i] != sim[kind][i]
        }
        print(f"{kind} differs (live, sim): {differ}")
    # The scenario exercises what it claims: both routes, prefix hits, a role change.
    assert 0 < sum(sim["route"].values()) < NUM_REQUESTS
    assert any(sim["cached"].values()) and any(live["cached"].values())
    assert sim["roles"], "the simulator made no role change: the scenario does not rebalance"
    dip_routes = [i for i in sim["route"] if sim["route"][i] != undipped["route"][i]]
    assert dip_routes, "the dip changed no route in the simulator: it tests nothing"
    print(f"routes the dip changes in the simulator: {dip_routes}")
    # Decode nodes: the gateway counts a decode until its stream ends, which a loaded machine
    # delays past the cost model's instant at which the simulator frees the node; near a tie
    # between the two decode nodes, one request placed the other way swaps the
    # alternation of the next few requests until the loads meet again (seen on a loaded
    # machine: #3-#7, 91.7%; 95-100% on an idle one).
    assert decode >= 0.90
    # Routes: the live link state is measured as the simulator's link measures its own (backlog
    # = KV accepted for the link and not yet delivered, a transfer counted whole from its first
    # layer; goodput = delivered bytes through the same filter; loss only over enough segments),
    # so the dip's congestion reads the same in both. What still differs, one or two requests
    # (typically #31, #37, routed while the link is scarce): the simulator keeps a long request
    # local only onto an idle home prefill node (``max_local_wait_s`` 0), and its node frees at
    # the cost model's instant, while the gateway sees the node busy until the prefill's answer
    # returns: live overheads, magnified by 1/time_scale, push that past the next arrival.
    assert route >= 0.95
    assert sorted(to for _, to in live["roles"]) == sorted(to for _, to in sim["roles"])
    assert len(live["roles"]) == len(sim["roles"])
