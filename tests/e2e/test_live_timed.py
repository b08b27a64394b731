"""A live two-site deployment of emulated nodes (engine "timed"), as real processes on loopback:
both routes through the official openai client, a client that disconnects frees its KV."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from live_helpers import launched, routes, timed_deployment, wait_idle

from prfaas.serve.launcher import Launcher
from prfaas.spec import get_model

pytestmark = pytest.mark.timeout(180)

SHORT = "the quick brown fox " * 10  # 200 byte tokens: local prefill
LONG = "x" * 20_000  # 20,000 tokens > t = 8192: PrfaaS prefill


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    with launched(timed_deployment(), tmp_path_factory.mktemp("live")) as launcher:
        yield launcher


@pytest.fixture()
def client(live: Launcher) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_openai_client_served_through_both_routes(live: Launcher, client: openai.OpenAI) -> None:
    short = client.completions.create(model="paper-1t", prompt=SHORT, max_tokens=20)
    assert short.choices[0].finish_reason == "length"
    assert short.usage is not None and short.usage.completion_tokens == 20
    chunks = list(
        client.completions.create(model="paper-1t", prompt=LONG, max_tokens=48, stream=True)
    )
    assert chunks[-1].choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="paper-1t", messages=[{"role": "user", "content": SHORT}], max_tokens=8
    )
    assert chat.choices[0].finish_reason == "length"
    done = {r["request_id"]: r for r in routes(live)}
    assert done[short.id]["prefill_site"] == "pd" and not done[short.id]["offloaded"]
    long_route = done[chunks[0].id]
    assert long_route["prefill_site"] == "prfaas" and long_route["offloaded"]
    # Exactly this request's KV crossed: S_kv(20,000 tokens) of the 1T model (payloads are sent
    # at 1/1000 of the size, rounded up per tensor, and counted back up).
    s_kv = get_model("paper-1t").cache.bytes_for(20_000)
    assert s_kv <= long_route["kv_bytes"] < s_kv * 1.001
    assert wait_idle(live)[0]["kv_used_bytes"] == 0


def test_models_and_metrics(live: Launcher) -> None:
    models = httpx.get(f"{live.url}/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "paper-1t"
    text = httpx.get(f"{live.url}/metrics", timeout=5).text
    assert "prfaas_route_decisions_total" in text and "prfaas_ttft_seconds_bucket" in text
    for family in ("prfaas_prefix_hit_rate", "prfaas_link_utilisation", "prfaas_stage_queue_depth"):
        assert family in text, family
    # Where the requests served above spent their time, state by state (each left once at
    # least: three requests finished; a long one's KV crossed, so it was transferring or
    # decoding when its prefill answered).
    counts = {
        m[0]: float(m[1])
        for m in re.findall(
            r'^prfaas_request_state_seconds_count\{state="(\w+)"\} (\S+)', text, re.M
        )
    }
    for state in ("queued", "routed", "prefilling", "decoding"):
        assert counts.get(state, 0) >= 3, (state, counts)
    bad = httpx.post(
        f"{live.url}/v1/completions", json={"model": "gpt-9", "prompt": "hi"}, timeout=5
    )
    assert bad.status_code == 404 and "gpt-9" in bad.json()["error"]["message"]


def test_client_disconnect_aborts_and_frees_kv(live: Launcher) -> None:
    body = {"model": "paper-1t", "prompt": LONG, "max_tokens": 2000, "stream": True}
    with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                break  # first tokens arrived: the request holds KV at a decode node; hang up
    nodes = wait_idle(live)
    assert all(n["kv_used_bytes"] == 0 and n["batch_size"] == 0 for n in nodes), nodes


def test_nodes_registered_with_roles(live: Launcher) -> None:
    nodes = {n["node"]: n for n in live.nodes()}
    assert {k: v["role"] for k, v in nodes.items()} == {
        "pf0": "prefill", "p0": "prefill", "d0": "decode", "d1": "decode",
    }  # fmt: skip
    assert all(n["healthy"] for n in nodes.values())


def test_workdir_has_logs(live: Launcher) -> None:
    assert {p.name for p in Path(live.workdir).glob("*.log")} == {
        "gateway.log", "prfaas.log", "pd.log",
    }  # fmt: skip


def test_only_what_the_decode_site_lacks_crosses(live: Launcher) -> None:
    # A local request leaves its 3 full blocks (and a checkpoint at the last one) in the PD
    # site's store, which the PD site's decode nodes share; a long continuation is offloaded and
    # only its KV past those blocks crosses.
    base = [(7 * i) % 250 + 1 for i in range(3 * 512 + 100)]
    body = {"model": "paper-1t", "prompt": base, "max_tokens": 4}
    assert httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).status_code == 200
    longer = base[: 3 * 512] + [(11 * i) % 250 + 1 for i in range(20_000)]
    body = {"model": "paper-1t", "prompt": longer, "max_tokens": 4}
    assert httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).status_code == 200
    route = routes(live)[-1]
    assert route["offloaded"]
    spec = get_model("paper-1t").cache
    incremental = spec.transfer_bytes(len(longer), 3 * 512)
    assert incremental <= route["kv_bytes"] < incremental * 1.001
    assert route["kv_bytes"] < spec.bytes_for(len(longer))
