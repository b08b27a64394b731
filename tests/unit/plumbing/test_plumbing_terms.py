"""The plumbing terms (``perf.plumbing``): stored in a profile file (version 2), a version-1 file
reads with one warning naming every missing term, and the simulator charges each term where the
live system pays it, switched off one by one by ``simulation.plumbing``."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from prfaas.deployment_sections import PlumbingSwitches
from prfaas.perf import profile_costs
from prfaas.perf.plumbing import PLUMBING_TERMS, PlumbingCosts
from prfaas.perf.profile_costs import cost_model_from_profile_file
from prfaas.perf.profile_file import (
    DecodePoint,
    DecodeSection,
    HardwareSection,
    ModelSection,
    PrefillPoint,
    PrefillSection,
    ProfileFile,
    ProfileFileError,
)
from prfaas.perf.profile_read import load_profile_file
from prfaas.perf.profile_write import dump_profile_file
from prfaas.sim import LinkConfig, SimScenario, SimSite, Simulator
from prfaas.sim.kv_bytes import KvBytes
from prfaas.sim.processor import SharedCores
from prfaas.sim.scenario import ScenarioError
from prfaas.spec import get_model
from prfaas.workload import SimRequestSpec

pytestmark = pytest.mark.timeout(60)

PLUMBING = PlumbingCosts(
    0.004, 0.003, 2e-9, 0.0003, 0.002, 0.0001, 0.0007, 0.05, prefill_per_token_s=3e-6,
    decode_per_context_token_s=2e-7, gateway_per_step_s=5e-4, first_token_wait_s=0.0015,
    prefill_in_service_excess=0.25, missing=(),
)  # fmt: skip


def _profile(plumbing: PlumbingCosts = PLUMBING) -> ProfileFile:
    spec = get_model("paper-1t")
    prefill = tuple(PrefillPoint(n, 0, 0.01 + 1e-5 * n) for n in (64, 256, 1024, 4096))
    decode = tuple(
        DecodePoint(b, ctx, 0.002 + 0.0005 * b + 1e-8 * b * ctx)
        for b in (1, 2, 4)
        for ctx in (128, 1024)
    )
    how = tuple((n, "test") for n in PLUMBING_TERMS if n not in plumbing.missing)
    return ProfileFile(
        ModelSection("tiny", spec.cache, 1e6, 1e6, 64, 4, 16, 4.0, 8192),
        HardwareSection("cpu-test", 8e9),
        PrefillSection("piecewise-linear", prefill),
        DecodeSection("linear", points=decode),
        (("source", "torch"),),
        "test",
        plumbing=plumbing,
        plumbing_how=how,
    )


def _write(tmp_path: Path, pf: ProfileFile, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    dump_profile_file(pf, path)
    return path


def test_the_terms_round_trip_and_reach_the_cost_model(tmp_path: Path) -> None:
    path = _write(tmp_path, _profile())
    text = path.read_text()
    assert "version: 2" in text and "plumbing:" in text
    pf = load_profile_file(path)
    assert pf.plumbing == PLUMBING
    assert dict(pf.plumbing_how)["prefill_per_request_s"] == "test"
    cm = cost_model_from_profile_file(path)
    assert cm.plumbing == PLUMBING
    # The engine's own timings (what the timed engine sleeps) carry none of them.
    assert not cm.relay_in_decode_step
    assert cm.decode_step_s(2, 200) == pytest.approx(0.002 + 0.001 + 2e-6)
    relayed = replace(cm, relay_in_decode_step=True)
    # Once per step, per request of the batch, per context token of the batch.
    assert relayed.decode_step_s(2, 200) == pytest.approx(
        cm.decode_step_s(2, 200) + 0.0007 + 2 * 0.0003 + 200 * 2e-7
    )
    assert relayed.decode_step_s(8, 200) == pytest.approx(
        cm.decode_step_s(8, 200) + 0.0007 + 8 * 0.0003 + 200 * 2e-7
    )
    span = relayed.decode_span_s(2, 300, 5)  # the closed form keeps the context term
    assert span == pytest.approx(sum(relayed.decode_step_s(2, 300 + 2 * k) for k in range(5)))
    assert relayed.max_decode_batch == cm.max_decode_batch
    assert relayed.prefill_s(300) == cm.prefill_s(300)


def test_old_profiles_load_with_one_warning_naming_the_missing_terms(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = yaml.safe_load(_write(tmp_path, _profile()).read_text())
    data["version"] = 1
    del data["plumbing"]
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump(data))
    partial = dict(data, version=2, plumbing={"prefill_per_request_s": 0.01})
    part = tmp_path / "partial.yaml"
    part.write_text(yaml.safe_dump(partial))
    profile_costs._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="prfaas.perf"):
        for _ in range(3):  # read many times (find-max-rate does): warned once per file
            assert cost_model_from_profile_file(old).plumbing.missing == PLUMBING_TERMS
            cost_model_from_profile_file(part)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert all(n in messages[0] for n in PLUMBING_TERMS) and str(old) in messages[0]
    assert "prefill_per_request_s" not in messages[1]
    assert "decode_per_kv_byte_s" in messages[1]
    assert cost_model_from_profile_file(part).plumbing.prefill_per_request_s == 0.01


def test_a_profile_from_before_the_split_reads_its_one_figure_for_both_nodes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``node_per_request_s`` (one figure, the mean of both nodes') gives both nodes' terms,
    the warning says they are not measured apart, and writing the profile back keeps it so."""
    data = yaml.safe_load(_write(tmp_path, _profile()).read_text())
    plumbing = data["plumbing"]
    del plumbing["prefill_per_request_s"], plumbing["decode_per_request_s"]
    plumbing["node_per_request_s"] = 0.006
    old = tmp_path / "before-split.yaml"
    old.write_text(yaml.safe_dump(data))
    profile_costs._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="prfaas.perf"):
        p = cost_model_from_profile_file(old).plumbing
    assert (p.prefill_per_request_s, p.decode_per_request_s) == (0.006, 0.006)
    assert p.missing == () and set(p.approximated) == {
        "prefill_per_request_s",
        "decode_per_request_s",
    }
    (message,) = [r.getMessage() for r in caplog.records]
    assert "node_per_request_s" in message and "decode_per_request_s" in message
    rewritten = _write(tmp_path, load_profile_file(old), "rewritten.yaml")
    section = yaml.safe_load(rewritten.read_text())["plumbing"]
    assert section["node_per_request_s"] == 0.006 and "prefill_per_request_s" not in section
    assert load_profile_file(rewritten).plumbing == load_profile_file(old).plumbing


def test_a_bad_plumbing_term_is_named(tmp_path: Path) -> None:
    data = yaml.safe_load(_write(tmp_path, _profile()).read_text())
    data["plumbing"]["gateway_per_request"] = 0.1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileFileError, match=r"plumbing\.gateway_per_request: unknown"):
        load_profile_file(bad)
    data["plumbing"] = {"decode_per_kv_byte_s": -1}
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileFileError, match=r"plumbing\.decode_per_kv_byte_s: must be a non"):
        load_profile_file(bad)
    # The one signed term: a ratio less 1, below 0 where the passes ran faster in service than
    # at the curve, but never -1 or below (the passes would cost nothing).
    data["plumbing"] = {"prefill_in_service_excess": -0.08}
    bad.write_text(yaml.safe_dump(data))
    assert load_profile_file(bad).plumbing.prefill_in_service_excess == -0.08
    data["plumbing"] = {"prefill_in_service_excess": -1}
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileFileError, match=r"in_service_excess: must be a finite number above"):
        load_profile_file(bad)
    with pytest.raises(ValueError, match="shared_core_overhead must be >= 0"):
        PlumbingCosts(shared_core_overhead=-0.1)  # the other ratio is a cost


PROMPT, OUTPUT = 1000, 20


def _isolated(
    tmp_path: Path,
    off: tuple[str, ...],
    one_engine: bool = False,
    plumbing: PlumbingCosts = PLUMBING,
) -> tuple[float, float]:
    """TTFT and decode span of one request on an idle PD site (the first of two far apart);
    ``one_engine``: the site's prefill and decode node are one engine (a vLLM server)."""
    path = _write(tmp_path, _profile(plumbing), "charged.yaml")
    site = SimSite("pd", "pd", str(path), 1, 1, local_kv_in_place=one_engine)
    sc = SimScenario(
        sites=(site,), model="tiny", policy="local_only", prefix_cache=False, duration_s=1e6,
        prefill_token_budget=1, plumbing_off=off,
    )  # fmt: skip
    specs = [SimRequestSpec(i, 100.0 * i, PROMPT, OUTPUT) for i in range(2)]
    sim = Simulator(sc, iter(specs))
    done: dict[int, tuple[float, float]] = {}
    sim.on_finish = lambda r: done.__setitem__(
        r.index, (r.kv_ready_s - r.arrival_s, r.finish_s - r.kv_ready_s)
    )
    sim.run()
    return done[1]


def test_each_term_is_charged_where_it_is_paid_and_switched_off(tmp_path: Path) -> None:
    base_ttft, base_decode = _isolated(tmp_path, PLUMBING_TERMS)
    ttft, decode = _isolated(tmp_path, ())
    kv = KvBytes(get_model("paper-1t").cache).total(PROMPT)
    p = PLUMBING
    # Gateway, prefill node (its passes' in-service excess over the curve too), decode node
    # (fixed + per KV byte) before the first token.
    passes_s = 0.01 + 1e-5 * PROMPT  # the profile's (linear) curve
    extra = (p.gateway_per_request_s + p.prefill_overhead_s(PROMPT, passes_s)
             + p.decode_per_request_s + p.decode_per_kv_byte_s * kv
             + p.first_token_wait_s)  # fmt: skip
    assert p.prefill_overhead_s(PROMPT, passes_s) == pytest.approx(
        p.prefill_per_request_s + p.prefill_per_token_s * PROMPT + 0.25 * passes_s
    )
    assert ttft - base_ttft == pytest.approx(extra, rel=1e-6)
    # The first token's wait is a latency on the TTFT alone: the decode ends when it did, so
    # the span from the first token to the last is that much shorter.
    wait = p.first_token_wait_s
    per_step_and_token = p.decode_per_output_token_s + p.decode_per_step_s  # at batch 1
    # OUTPUT - 1 steps (the prefill sampled the first token) and the engine's copies: each
    # step's context (the prompt and the tokens so far).
    steps = OUTPUT - 1
    copies = p.decode_per_context_token_s * sum(PROMPT + k for k in range(steps))
    assert decode - base_decode + wait == pytest.approx(
        steps * per_step_and_token + copies, rel=1e-3
    )
    for term in PLUMBING_TERMS:  # each switch removes its own term only
        ttft_off, decode_off = _isolated(tmp_path, (term,))
        if term in ("decode_per_output_token_s", "decode_per_step_s"):
            other = per_step_and_token - getattr(p, term)
            assert ttft_off == pytest.approx(ttft)
            assert decode_off - base_decode + wait == pytest.approx(
                steps * other + copies, rel=1e-3
            )
        elif term == "decode_per_context_token_s":
            assert ttft_off == pytest.approx(ttft)
            assert decode_off - base_decode + wait == pytest.approx(
                steps * per_step_and_token, rel=1e-6
            )
        elif term == "first_token_wait_s":
            assert (ttft_off, decode_off) == pytest.approx((ttft - wait, decode + wait))
        elif term in ("gateway_per_output_token_s", "gateway_per_step_s", "shared_core_overhead",
                      "first_token_wait_per_decoding_s"):  # fmt: skip
            # A lone request never waits on the relay or a decoding batch; these nodes have
            # cores of their own.
            assert (ttft_off, decode_off) == pytest.approx((ttft, decode))
        else:
            assert ttft_off < ttft - 1e-6 and decode_off == pytest.approx(decode)


def test_passes_faster_in_service_than_at_the_curve_are_refunded(tmp_path: Path) -> None:
    """A negative ``prefill_in_service_excess`` (the classes' passes ran faster than the curve)
    prices the prefill's passes below the curve, by that fraction of them."""
    faster = replace(PLUMBING, prefill_in_service_excess=-0.2)
    ttft, decode = _isolated(tmp_path, (), plumbing=faster)
    ttft_off, decode_off = _isolated(tmp_path, ("prefill_in_service_excess",), plumbing=faster)
    passes_s = 0.01 + 1e-5 * PROMPT
    assert ttft - ttft_off == pytest.approx(-0.2 * passes_s, rel=1e-6)
    assert decode == pytest.approx(decode_off)


def test_one_engines_local_prefill_installs_nothing(tmp_path: Path) -> None:
    """A vLLM server's local prefill leaves its KV where its decode runs: neither install term
    is charged on it (a link's KV is: ``test_a_remote_requests_kv_is_installed``)."""
    ttft, decode = _isolated(tmp_path, ())
    ttft_one, decode_one = _isolated(tmp_path, (), one_engine=True)
    kv = KvBytes(get_model("paper-1t").cache).total(PROMPT)
    install = PLUMBING.decode_per_request_s + PLUMBING.decode_per_kv_byte_s * kv
    assert ttft - ttft_one == pytest.approx(install, rel=1e-6)
    assert decode_one == pytest.approx(decode)


def test_a_remote_requests_kv_is_installed(tmp_path: Path) -> None:
    """Offloaded to a PrfaaS site, a request's KV crosses the link and is installed at the
    decode node, per request and per byte, one engine or not."""
    path = _write(tmp_path, _profile(), "charged.yaml")
    kv = KvBytes(get_model("paper-1t").cache).total(PROMPT)

    def ttft(off: tuple[str, ...], one_engine: bool) -> float:
        sites = (SimSite("prfaas", "prfaas", str(path), 1),
                 SimSite("pd", "pd", str(path), 1, 1, local_kv_in_place=one_engine))  # fmt: skip
        sc = SimScenario(
            sites=sites, links=(LinkConfig("prfaas", "pd", 100.0),), model="tiny",
            policy="prfaas", threshold_tokens=1, prefix_cache=False, duration_s=1e6,
            prefill_token_budget=1, plumbing_off=off,
        )  # fmt: skip
        sim = Simulator(sc, iter([SimRequestSpec(0, 0.0, PROMPT, OUTPUT)]))
        out: list[tuple[float, str]] = []
        sim.on_finish = lambda r: out.append((r.kv_ready_s - r.arrival_s, r.prefill_node))
        sim.run()
        ((t, node),) = out
        assert node.startswith("prfaas/")
        return t

    for one_engine in (False, True):
        paid = ttft((), one_engine) - ttft(("decode_per_kv_byte_s",), one_engine)
        assert paid == pytest.approx(PLUMBING.decode_per_kv_byte_s * kv, rel=1e-6)
        paid = ttft((), one_engine) - ttft(("decode_per_request_s",), one_engine)
        assert paid == pytest.approx(PLUMBING.decode_per_request_s, rel=1e-6)


def test_a_first_token_waits_per_request_decoding_beside_it(tmp_path: Path) -> None:
    """``first_token_wait_per_decoding_s`` is a latency on the TTFT alone: a request whose KV is
    ready while 3 others decode on its node waits 3 times it, on top of ``first_token_wait_s``,
    which every request waits once; nothing else moves (the decode's steps, the others' TTFT),
    and each switch takes its own term off."""
    wait_s, alone_s = 0.002, 0.0007
    plumbing = replace(PLUMBING, first_token_wait_per_decoding_s=wait_s, first_token_wait_s=alone_s)
    path = _write(tmp_path, _profile(plumbing))
    specs = [SimRequestSpec(i, 0.001 * i, 64, 1000) for i in range(3)]
    specs.append(SimRequestSpec(3, 1.0, 256, 2))

    def run(off: tuple[str, ...]) -> dict[int, tuple[float, float]]:
        sc = SimScenario(
            sites=(SimSite("pd", "pd", str(path), 1, 1),), model="tiny", policy="local_only",
            prefix_cache=False, duration_s=2.0, prefill_token_budget=1, plumbing_off=off,
        )  # fmt: skip
        sim = Simulator(sc, iter(specs))
        done: dict[int, tuple[float, float]] = {}
        sim.on_finish = lambda r: done.__setitem__(
            r.index, (r.kv_ready_s - r.arrival_s, r.finish_s)
        )
        sim.run()
        return done

    on = run(())
    off = run(("first_token_wait_per_decoding_s",))
    alone_off = run(("first_token_wait_s",))
    neither = run(("first_token_wait_s", "first_token_wait_per_decoding_s"))
    assert on[3][0] - off[3][0] == pytest.approx(3 * wait_s, rel=1e-6)
    # The first request found nobody decoding; the next found 1 and 2.
    assert [on[i][0] - off[i][0] for i in range(3)] == pytest.approx([0.0, wait_s, 2 * wait_s])
    assert [on[i][0] - alone_off[i][0] for i in range(4)] == pytest.approx([alone_s] * 4)
    assert [off[i][0] - neither[i][0] for i in range(4)] == pytest.approx([alone_s] * 4)
    for other in (off, alone_off, neither):
        assert [on[i][1] for i in range(4)] == pytest.approx([other[i][1] for i in range(4)])


def test_the_gateway_routes_requests_in_arrival_order(tmp_path: Path) -> None:
    """Requests arriving together wait for the routing work ahead of them, not for the earlier
    requests' token relay (paid in small pieces while they decode); the relay is still booked,
    so the gateway's backlog holds every request's routing and relay."""
    path = _write(tmp_path, _profile(), "gw.yaml")
    sc = SimScenario(
        sites=(SimSite("pd", "pd", str(path), 4, 4),), model="tiny", policy="local_only",
        prefix_cache=False, duration_s=1e6, prefill_token_budget=1,
    )  # fmt: skip
    specs = [SimRequestSpec(i, 0.0, 64, OUTPUT) for i in range(3)]
    sim = Simulator(sc, iter(specs))
    starts: dict[int, float] = {}
    sim.on_finish = lambda r: starts.__setitem__(r.index, r.prefill_start_s)
    sim.run()
    gap = PLUMBING.gateway_per_request_s
    assert starts[1] - starts[0] == pytest.approx(gap)
    assert starts[2] - starts[1] == pytest.approx(gap)
    (gateway,) = sim.gateways.values()
    # Routed before anything decodes: each token its own step.
    each = PLUMBING.gateway_per_request_s + OUTPUT * (
        PLUMBING.gateway_per_output_token_s + PLUMBING.gateway_per_step_s
    )
    assert gateway.backlog_s(0.0) == pytest.approx(3 * each)
    assert gateway.backlog_s(3 * each) == 0.0


def test_time_shared_cores_charge_the_profiles_sharing_overhead(tmp_path: Path) -> None:
    """A site whose nodes share one core: while both are busy each runs at half speed and the
    sharing's own CPU on top (``shared_core_overhead``); alone, at full speed; switched off, 0."""
    path = _write(tmp_path, _profile(), "shared.yaml")

    def world(off: tuple[str, ...]) -> SharedCores:
        sc = SimScenario(
            sites=(SimSite("pd", "pd", str(path), 1, 1, shared_cores=1),), model="tiny",
            policy="local_only", prefix_cache=False, duration_s=1.0, plumbing_off=off,
        )  # fmt: skip
        shared = Simulator(sc, iter(())).world.shared[0]
        assert shared is not None
        return shared

    cores = world(())
    assert cores.overhead == PLUMBING.shared_core_overhead
    cores.busy = 1
    assert cores.slowdown() == 1.0
    cores.busy = 2
    assert cores.slowdown() == pytest.approx(2 * (1 + PLUMBING.shared_core_overhead))
    assert world(("shared_core_overhead",)).overhead == 0.0
    with pytest.raises(ValueError, match="overhead must be >= 0"):
        SharedCores(1, 1, -0.1)


def test_the_deployment_switches_name_the_terms() -> None:
    assert PlumbingSwitches().off() == ()
    off = PlumbingSwitches(decode_per_request=False, gateway_per_output_token=False).off()
    assert off == ("decode_per_request_s", "gateway_per_output_token_s")
    both = PlumbingSwitches(node_per_request=False, prefill_per_request=False).off()
    assert both == ("prefill_per_request_s", "decode_per_request_s")  # a file before the split
    assert PlumbingSwitches(shared_core_overhead=False).off() == ("shared_core_overhead",)
    assert PlumbingSwitches(prefill_in_service_excess=False).off() == ("prefill_in_service_excess",)
    switches = {t.removesuffix("_s"): False for t in PLUMBING_TERMS}  # one per term
    assert set(PlumbingSwitches(**switches).off()) == set(PLUMBING_TERMS)


def test_a_gateway_pinned_to_shared_cores_takes_its_share_first() -> None:
    """The nodes share what the gateway leaves of the cores (its pieces run as they wake), and
    pay the sharing overhead whenever they time-share, with each other or with the gateway; a
    gateway with nothing to do costs nothing; a runaway share is capped."""
    cores = SharedCores(1, 1, 0.1)
    share = [0.2]
    cores.gateway_share = lambda: share[0]
    cores.busy = 1
    assert cores.slowdown() == pytest.approx(1 / 0.8 * 1.1)
    cores.busy = 2
    assert cores.slowdown() == pytest.approx(2 / 0.8 * 1.1)
    share[0] = 0.0
    cores.busy = 1
    assert cores.slowdown() == 1.0
    share[0] = 5.0
    assert cores.slowdown() == pytest.approx(1 / (1 - 0.9) * 1.1)
    two = SharedCores(2, 1)
    two.gateway_share = lambda: 0.5
    two.busy = 1
    assert two.slowdown() == 1.0  # the gateway has the other core's spare time
    two.busy = 2
    assert two.slowdown() == pytest.approx(2 / 1.5)


def test_the_gateways_share_is_its_relay_and_routing_at_the_decode_token_rate() -> None:
    """Per token its home's decode nodes emit now: the relay, and the routing spread over the
    mean output of the requests routed so far; nothing decoding, nothing charged."""
    from types import SimpleNamespace

    from prfaas.sim.plumbing import GatewayCpu

    dec = SimpleNamespace(members=[1], tick_steps=10, span_start_s=1.0, tick_s=1.5, span_batch=4)
    idle = SimpleNamespace(members=[], tick_steps=0, span_start_s=0.0, tick_s=float("inf"),
                           span_batch=0)  # fmt: skip
    g = GatewayCpu(0.006, 0.0007, lambda: [dec, idle])  # type: ignore[arg-type, list-item]
    assert g.share() == pytest.approx(0.0007 * 80)  # 4 x 10 tokens in 0.5 s; nothing routed
    g.route_at(0.0, 30)
    g.route_at(0.0, 10)
    assert g.share() == pytest.approx((0.0007 + 0.006 * 2 / 40) * 80)
    dec.members = []
    assert g.share() == 0.0
    assert GatewayCpu(0.006, 0.0007).share() == 0.0  # not pinned to any node's cores


def test_the_gateways_relay_pays_once_per_decode_step_and_per_token() -> None:
    """``gateway_per_step_s``: one event-loop wake-up relays a whole step's tokens, so the relay
    of a batch of 4 costs it once a step (20 steps/s here), not per token; a request's booked
    relay takes its tokens' share of those steps (a quarter of a step each), and each token a
    whole step while nothing decodes."""
    from types import SimpleNamespace

    from prfaas.sim.plumbing import GatewayCpu

    dec = SimpleNamespace(members=[1], tick_steps=10, span_start_s=1.0, tick_s=1.5, span_batch=4)
    g = GatewayCpu(0.0, 0.0007, lambda: [dec], per_step_s=0.002)  # type: ignore[arg-type, list-item]
    assert g.share() == pytest.approx(0.0007 * 80 + 0.002 * 20)
    g.route_at(0.0, 8)
    assert g.backlog_s(0.0) == pytest.approx(8 * 0.0007 + 0.002 * 8 / 4)
    dec.members = []
    g.route_at(0.0, 8)  # nothing decoding: each token its own step
    assert g.backlog_s(0.0) == pytest.approx(2 * 8 * 0.0007 + 0.002 * (8 / 4 + 8))


def test_a_gateway_on_the_prefill_cores_slows_their_prefills(tmp_path: Path) -> None:
    """A PrfaaS site's core shared by its prefill node and the gateway (``hosts_gateway``): the
    offloaded prefills take longer while the PD site decodes (the gateway relays its tokens),
    by the gateway's share; with the gateway's terms off, as if it had a core of its own."""
    path = _write(tmp_path, _profile(), "gwcores.yaml")

    def prefills(hosts: bool, off: tuple[str, ...] = ()) -> list[float]:
        sc = SimScenario(
            sites=(SimSite("prfaas", "prfaas", str(path), 1, shared_cores=1, hosts_gateway=hosts),
                   SimSite("pd", "pd", str(path), 1, 1)),
            links=(LinkConfig("prfaas", "pd", 100.0, 1.0),), model="tiny", policy="threshold",
            threshold_tokens=0, prefix_cache=False, duration_s=1e6, prefill_token_budget=1,
            plumbing_off=off,
        )  # fmt: skip
        specs = [SimRequestSpec(i, 0.25 * i, 2000, 400) for i in range(12)]
        sim = Simulator(sc, iter(specs))
        done: dict[int, float] = {}
        sim.on_finish = lambda r: done.__setitem__(r.index, r.prefill_end_s - r.prefill_start_s)
        sim.run()
        assert len(done) == len(specs)
        assert {str(r) for r in sim.world.prefill_by_id} == {"prfaas/p0", "pd/p0"}
        return [done[i] for i in range(len(specs))]

    own, pinned = prefills(False), prefills(True)
    assert pinned[0] == pytest.approx(own[0])  # nothing decodes yet: nothing taken
    # Later ones, while one request decodes (batch 1: a step of 0.0025 s plus the charged
    # plumbing per step): slowed by 1 / (1 - share), share = per-token CPU x tokens per s.
    assert all(p > 1.02 * o for p, o in zip(pinned[3:], own[3:], strict=True))
    gw_off = ("gateway_per_request_s", "gateway_per_output_token_s", "gateway_per_step_s")
    assert prefills(True, gw_off) == pytest.approx(prefills(False, gw_off))
    with pytest.raises(ScenarioError, match="hosts_gateway needs shared_cores"):
        SimScenario(sites=(SimSite("pd", "pd", "h20", 1, 1, hosts_gateway=True),)).validate()


def test_the_profiles_own_deployment_simulates_with_the_batch_its_engine_ran(
    tmp_path: Path,
) -> None:
    """A profile whose decode step misses the SLO (a slow or loaded machine: 40 ms at batch 1)
    still has its probes simulated: a torch deployment decodes the torch engine's own batch
    (64), not the SLO's, which is 0 there (`prfaas profile` died on it with a traceback after
    measuring, on a loaded 2-core machine; then the bench's own deployment did, in `make
    test`). An engine that admits by the SLO (timed) is still refused, saying why."""
    import dataclasses

    import yaml

    from prfaas import scenarios
    from prfaas.commands.profile_first_token import simulated_first_tokens
    from prfaas.commands.profile_plumbing import deployment_text
    from prfaas.config import DeploymentConfig
    from prfaas.engine.torch.engine import DEFAULT_MAX_BATCH

    slow = tuple(DecodePoint(b, ctx, 0.04 + 0.0005 * b) for b in (1, 2, 4) for ctx in (128, 1024))
    path = _write(
        tmp_path, dataclasses.replace(_profile(), decode=DecodeSection("linear", points=slow))
    )
    raw = yaml.safe_load(deployment_text("tiny", tmp_path, path, 1))
    d = DeploymentConfig.model_validate(raw)
    sc = scenarios.sim_scenario(d)
    assert sc.sites[0].decode_max_batch == DEFAULT_MAX_BATCH
    probes = [(0.0, 64, 4), (0.01, 256, 4), (0.02, 64, 4)]
    out = simulated_first_tokens(d, path, probes)
    assert len(out) == 3 and all(ttft > 0 and not offloaded for ttft, offloaded in out)
    # an engine admitting by the SLO (a timed one's default): its batch is 0, refused, saying so
    by_slo = dataclasses.replace(
        sc, sites=(dataclasses.replace(sc.sites[0], decode_max_batch=None),)
    )
    with pytest.raises(
        ScenarioError,
        match=r"cannot meet the decode SLO \(.* takes \d+\.\d ms, over 25 ms.*decode_max_batch",
    ):
        Simulator(by_slo, iter([]))


def test_a_one_site_file_with_a_profiled_model_is_planned_without_a_preset(tmp_path: Path) -> None:
    """`prfaas sim` of a file with no PrfaaS site whose model is a profile's own name (not a
    preset) died with a traceback (`unknown model`): the planner looked the absent remote side
    up among the presets. Found by hand, 2026-12-07."""
    from prfaas import scenarios
    from prfaas.config import DeploymentConfig

    path = _write(tmp_path, _profile())
    d = DeploymentConfig.model_validate({
        "engine": {"kind": "torch", "model": "tiny", "model_path": str(tmp_path)},
        "sites": [{"name": "pd", "kind": "pd", "hardware": str(path),
                   "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]}],
    })  # fmt: skip
    planner = scenarios.planner_for(d, n_local=2)
    assert planner.evaluate(None, 0, 1, 1).lambda_max_exact > 0


def test_the_in_service_excess_is_the_nodes_own_passes_over_the_curve() -> None:
    """``prefill_in_service_excess`` from the passes the prefill node's engine counted per
    request of each class (``forward_cpu_s``), summed, over the curve's price summed, less 1;
    said per class in ``how``."""
    from prfaas.perf.plumbing import in_service_excess

    def curve(n: int) -> float:
        return 0.01 + 1e-4 * n

    excess, how = in_service_excess({64: 0.021, 1024: 0.155}, curve)
    assert excess == pytest.approx((0.021 + 0.155) / (0.0164 + 0.1124) - 1)
    assert "64 tokens 21 vs 16.4 ms" in how and "1024 tokens 155 vs 112.4 ms" in how
    assert "forward_cpu_s" in how
    assert excess > 0.36  # the passes ran slower in service than the curve: charged, not lost
    assert in_service_excess({}, curve) == (None, "")  # nothing counted (a GPU): missing
    faster, _ = in_service_excess({1024: 0.09}, curve)
    assert faster == pytest.approx(0.09 / 0.1124 - 1)  # below 0: stored as measured (signed)


def test_no_excess_is_read_against_a_curve_priced_at_or_below_zero() -> None:
    """A noisy profile's curve (a long length timed faster than a short one, its end segment
    extended past its points) can price a class at 0 s or less: the ratio over it is no
    measurement (fresh-clone CI read -38 and the profile command died on a traceback). The term
    is left missing and the how says which class had no price."""
    from prfaas.perf.plumbing import in_service_excess

    def falling(n: int) -> float:  # 20 ms at 128 tokens, 10 at 1,024: negative by 4,096
        return 0.02 - (0.01 / 896) * (n - 128)

    counted = {64: 0.010, 1024: 0.015, 4096: 0.060}
    excess, how = in_service_excess(counted, falling)
    assert excess is None
    assert how.startswith("not measured") and "4096 tokens at -24.29 ms" in how
    assert "64 tokens" not in how  # the classes the curve did price are not named


def test_the_excess_how_says_the_engine_thread_in_service() -> None:
    """Beside the excess, the prefill node's own engine thread per request per class and over the
    curve; with more than one torch thread per node no ratio (the thread times its share only)."""
    from prfaas.perf.plumbing import engine_in_service_how

    def curve(n: int) -> float:
        return 0.01 + 1e-4 * n

    engine = {64: 0.020, 1024: 0.150}
    said = engine_in_service_how(engine, curve, threads=1)
    assert "per request: 64 tokens 20 ms, 1024 tokens 150 ms; 1.320x the curve" in said
    assert "x the curve" not in engine_in_service_how(engine, curve, threads=2)
    assert "the engine thread's share only" in engine_in_service_how(engine, curve, threads=2)
    assert engine_in_service_how({}, curve, threads=1) == ""
