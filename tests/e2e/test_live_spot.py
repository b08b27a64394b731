"""A pool node taken away under load loses no request (emulated timed nodes, live processes):

- SIGKILL (no notice): the prefills it held fail at the gateway, which serves them by local
  prefill (counted: ``retries_total``, the route log's attempts);
- a spot notice (SIGTERM to a node of a spot group, with the group's ``notice_s``): the node
  takes no new prefill, keeps those it expects to end (prefill and KV stream) before the
  deadline, and hands the rest back; the gateway serves those on another PrfaaS node, none
  locally, and the node's process ends.

Counts and events, never durations. Every process is stopped however a test ends."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from live_helpers import launched, routes, timed_deployment

from prfaas.serve.launcher import Launcher

pytestmark = pytest.mark.timeout(120)
NUM_PROMPTS = 8
SPOT, ON_DEMAND = "prfaas-spot-0", "prfaas-od-0"


def long_prompt(i: int, salt: str) -> str:
    # byte tokens: over the 8192-token threshold; the salt first, so that no test finds the
    # prefix of another's prompts cached (a cached prefix would send it local)
    return f"{salt}{i:04d}" + "z" * 10_000


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    # time_scale 1: a 10k-token prefill holds an emulated H200 for ~0.8 s, so a node holds a
    # queue of them long enough to be killed or noticed with work in hand.
    d = timed_deployment(time_scale=1.0)
    auto = {"groups": [{"name": "spot", "spot": True, "usd_per_hour": 12, "notice_s": 1.5},
                       {"name": "od"}]}  # fmt: skip
    d = d.model_validate({**d.model_dump(mode="json"), "autoscale": auto})
    with launched(d, tmp_path_factory.mktemp("spot")) as launcher:
        launcher.add_node("prfaas", SPOT)
        launcher.add_node("prfaas", ON_DEMAND)
        until(lambda: {SPOT, ON_DEMAND} <= in_rotation(launcher), "the added nodes serve")
        yield launcher


def in_rotation(live: Launcher) -> set[str]:
    return {r["node"] for r in live.nodes() if r["in_rotation"]}


def until(check: Callable[[], object], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)


def only_serving(live: Launcher, node: str) -> None:
    """Only ``node`` takes the PrfaaS site's prefills (the others drained at the gateway)."""
    for other in ("pf0", SPOT, ON_DEMAND):
        with contextlib.suppress(Exception):  # a node killed before may be gone
            (live.control.resume if other == node else live.control.drain)(other)


def burst(live: Launcher, pool: ThreadPoolExecutor, salt: str) -> list[Future[httpx.Response]]:
    body = {"model": "paper-1t", "max_tokens": 4}
    return [
        pool.submit(
            httpx.post,
            f"{live.url}/v1/completions",
            json={**body, "prompt": long_prompt(i, salt)},
            timeout=90,
        )
        for i in range(NUM_PROMPTS)
    ]


def holding(live: Launcher, node: str) -> int:
    return next((int(r["in_flight"]) for r in live.nodes() if r["node"] == node), 0)


def held_at_node(live: Launcher, node: str) -> int:
    """Prefills the node itself holds, as its last report said (waiting, plus those it runs); not
    the gateway's queue depth, which counts a request from its dispatch, before the command
    reaches the node (a notice then finds it not there yet: refused, never handed back)."""
    rows = [r for r in live.nodes() if r["node"] == node]
    return sum(int(r["reported_queue_depth"]) + int(r["batch_size"]) for r in rows)


def retries(live: Launcher, reason: str = "") -> float:
    """``retries_total`` for ``reason`` (every reason summed when "")."""
    text = httpx.get(f"{live.url}/metrics", timeout=10).text
    which = re.escape(reason) if reason else "[a-z_]+"
    found = re.findall(rf'prfaas_retries_total\{{reason="{which}"\}} ([0-9.e+]+)', text)
    return sum(float(x) for x in found)


def records_of(live: Launcher, answers: list[httpx.Response]) -> list[dict[str, object]]:
    assert [a.status_code for a in answers] == [200] * NUM_PROMPTS  # every request completed
    ids = {a.json()["id"] for a in answers}
    found = [r for r in routes(live) if r["request_id"] in ids]
    assert len(found) == NUM_PROMPTS, (ids, found)
    return found


def test_sigkill_of_a_pool_node_under_load_loses_no_request(live: Launcher) -> None:
    only_serving(live, ON_DEMAND)
    before, unreachable = retries(live), retries(live, "prefill_unreachable")
    with ThreadPoolExecutor(NUM_PROMPTS) as pool:
        sent = burst(live, pool, "kill")
        until(lambda: holding(live, ON_DEMAND) >= 3, "the node holds prefills")
        live.kill(ON_DEMAND)  # SIGKILL, no notice; no restart policy: it stays down
        answers = [f.result() for f in sent]
    found = records_of(live, answers)
    # Those it held were tried again by local prefill (any dispatched after the kill went local
    # at once: the site had no other pool node in rotation).
    retried = [r for r in found if int(str(r["attempts"])) >= 2]
    assert retried and all(r["prefill_site"] == "pd" for r in retried)
    assert retries(live) - before >= len(retried)  # counted
    assert retries(live, "prefill_unreachable") > unreachable  # as the pool node's loss


def test_a_spot_notice_finishes_some_and_hands_the_rest_to_another_pool_node(
    live: Launcher,
) -> None:
    only_serving(live, SPOT)
    before = {r: retries(live, r) for r in ("prefill_handed_back", "prefill_refused")}
    with ThreadPoolExecutor(NUM_PROMPTS) as pool:
        sent = burst(live, pool, "spot")
        until(lambda: held_at_node(live, SPOT) >= NUM_PROMPTS // 2, "the spot node holds the burst")
        live.control.resume("pf0")  # another pool node to hand them to
        (member,) = [m for m in live.status() if m.name == SPOT]
        assert member.pid is not None
        os.killpg(member.pid, signal.SIGTERM)  # the spot notice: the group's notice_s, 1.5 s
        answers = [f.result() for f in sent]
    found = records_of(live, answers)
    where = [(r["prefill_node"], r["attempts"]) for r in found]
    local = [str(r["request_id"]) for r in found if r["prefill_site"] != "prfaas"]
    said = [
        ln for ln in live.child("gateway").log_tail(400).splitlines() if any(i in ln for i in local)
    ]
    assert not local, (where, said)  # none sent local
    finished = [r for r in found if r["prefill_node"] == SPOT]
    elsewhere = [r for r in found if r["prefill_node"] == "pf0"]
    assert len(finished) > 0 and len(elsewhere) > 0
    assert len(finished) + len(elsewhere) == NUM_PROMPTS
    again = [r for r in elsewhere if int(str(r["attempts"])) >= 2]  # the rest went to pf0 first
    # Counted: handed back by the node (held at the notice), or refused by it (409: arrived
    # after the notice); both served by pf0, none locally.
    handed_back = retries(live, "prefill_handed_back") - before["prefill_handed_back"]
    refused = retries(live, "prefill_refused") - before["prefill_refused"]
    assert handed_back > 0 and handed_back + refused == len(again), (handed_back, refused)
    until(lambda: any(m.name == SPOT and m.pid is None for m in live.status()),
          "the noticed node's process ended", timeout_s=30)  # fmt: skip
