"""core: request state machine, clocks, incrementally updated views."""

from __future__ import annotations

import pytest

from prfaas.core import (
    InvalidTransition,
    LinkState,
    LoopClock,
    MutableClusterView,
    NodeId,
    NodeLoad,
    NodeRole,
    RequestId,
    RequestLifecycle,
    RequestState,
    RequestView,
    SiteId,
    SiteKind,
    VirtualClock,
)
from prfaas.core.ids import link_id_for
from prfaas.core.request import TERMINAL_STATES, TRANSITIONS, advance, can_transition

A, B = SiteId("pd"), SiteId("prfaas")


def test_every_state_has_a_row_and_terminal_states_have_no_way_out() -> None:
    assert set(TRANSITIONS) == set(RequestState)
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()


def test_lifecycle_happy_path_and_retry_counts_attempts() -> None:
    r = RequestLifecycle("r1", 0.0)
    assert r.state is RequestState.QUEUED and not r.is_terminal
    r.advance(RequestState.ROUTED, 0.1)
    r.advance(RequestState.PREFILLING, 0.2)
    r.advance(RequestState.ROUTED, 0.3)  # lost remote prefill: fall back to local prefill
    r.advance(RequestState.PREFILLING, 0.4)
    r.advance(RequestState.TRANSFERRING, 0.45)
    r.advance(RequestState.DECODING, 0.5)
    r.advance(RequestState.FINISHED, 0.9)
    assert r.is_terminal and r.num_attempts == 2 and r.since_s == 0.9


def test_lifecycle_tells_each_state_left_and_its_time() -> None:
    """The gateway's per-state histogram: every state left, once per stay, with its seconds (a
    retry's second stay in ROUTED counts again); a refused move tells nothing."""
    left: list[tuple[RequestState, float]] = []
    r = RequestLifecycle("r1", 0.0, lambda state, s: left.append((state, round(s, 9))))
    for state, at in ((RequestState.ROUTED, 0.1), (RequestState.PREFILLING, 0.3),
                      (RequestState.ROUTED, 0.35), (RequestState.PREFILLING, 0.4),
                      (RequestState.DECODING, 0.5), (RequestState.FINISHED, 0.9)):  # fmt: skip
        r.advance(state, at)
    with pytest.raises(InvalidTransition):
        r.advance(RequestState.QUEUED, 1.0)
    assert left == [
        (RequestState.QUEUED, 0.1), (RequestState.ROUTED, 0.2), (RequestState.PREFILLING, 0.05),
        (RequestState.ROUTED, 0.05), (RequestState.PREFILLING, 0.1), (RequestState.DECODING, 0.4),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (RequestState.QUEUED, RequestState.DECODING),
        (RequestState.FINISHED, RequestState.QUEUED),
        (RequestState.DECODING, RequestState.PREFILLING),
        (RequestState.DECODING, RequestState.ROUTED),  # tokens streamed: no retry
        (RequestState.ABORTED, RequestState.FAILED),
    ],
)
def test_forbidden_transitions_raise(src: RequestState, dst: RequestState) -> None:
    r = RequestLifecycle("r", 0.0)
    r.state = src
    with pytest.raises(InvalidTransition, match=f"request r: {src.value} -> {dst.value}"):
        r.advance(dst, 1.0)
    assert r.state is src and r.since_s == 0.0  # a refused move changes nothing
    with pytest.raises(InvalidTransition):
        advance("r", src, dst)
    assert not can_transition(src, dst)


def test_every_allowed_transition_is_taken_by_advance() -> None:
    for src, dsts in TRANSITIONS.items():
        for dst in dsts:
            assert advance("r", src, dst) is dst


def test_virtual_clock_never_goes_back_and_loop_clock_scales() -> None:
    clock = VirtualClock()
    clock.advance_to(2.0)
    clock.advance_by(0.5)
    assert clock.now() == 2.5
    with pytest.raises(ValueError):
        clock.advance_to(1.0)
    ticks = iter([10.0, 10.0, 11.0])
    fast = LoopClock(source=lambda: next(ticks), speed=4.0)
    assert fast.now() == 0.0
    assert fast.now() == 4.0


def test_cluster_view_updates_incrementally_including_role_changes() -> None:
    view = MutableClusterView({A: SiteKind.PD, B: SiteKind.PRFAAS}, threshold_tokens=19_400)
    view.update_node(NodeLoad(NodeId("n1"), A, NodeRole.PREFILL, queue_depth=2))
    view.update_node(NodeLoad(NodeId("n2"), A, NodeRole.DECODE, batch_size=5))
    assert [n.node_id for n in view.nodes(A, NodeRole.PREFILL)] == ["n1"]
    first = view.nodes(A, NodeRole.PREFILL)
    assert view.nodes(A, NodeRole.PREFILL) is first  # cached between membership changes
    view.update_node(NodeLoad(NodeId("n1"), A, NodeRole.DECODE, draining=False))  # P -> D
    assert view.nodes(A, NodeRole.PREFILL) == ()
    assert {n.node_id for n in view.nodes(A, NodeRole.DECODE)} == {"n1", "n2"}
    view.remove_node(NodeId("n2"))
    assert [n.node_id for n in view.nodes(A, NodeRole.DECODE)] == ["n1"]
    view.update_link(LinkState(link_id_for(B, A), 12.5e9, backlog_bytes=25 * 10**9))
    assert view.link(B, A).drain_time_s() == pytest.approx(2.0)  # type: ignore[union-attr]
    assert view.threshold_tokens == 19_400
    with pytest.raises(KeyError, match="unknown site"):
        view.update_node(NodeLoad(NodeId("x"), SiteId("mars"), NodeRole.DECODE))


def test_request_view_cached_lookups() -> None:
    rv = RequestView(RequestId("r"), 5000, {A: 1024})
    assert rv.cached_tokens_at(A) == 1024 and rv.uncached_tokens_at(B) == 5000


@pytest.mark.timeout(10)
def test_fast_constructors_build_what_the_frozen_classes_build() -> None:
    """``core.frozen``: each hot path's fast constructor gives an object equal to, of the same
    class as, and as frozen as the dataclass's own ``__init__``'s, field by field."""
    import dataclasses
    from types import MappingProxyType

    from prfaas.core.frozen import writable_twin
    from prfaas.core.views import new_link_state, new_node_load, new_request_view
    from prfaas.policy.decisions import CacheMove, RouteDecision, new_route_decision

    cases = [
        (new_request_view, RequestView,
         (RequestId("r1"), 9, MappingProxyType({A: 512}), (1, 2), 7)),
        (new_node_load, NodeLoad,
         (NodeId("pd/p0"), A, NodeRole.PREFILL, 1, 2, 3, 4, 5, False, True, 6.5)),
        (new_link_state, LinkState,
         (link_id_for(B, A), 1e9, 0.5, 5e8, 10, 0.005, 0.0, True, 3.0, "configured")),
        (new_route_decision, RouteDecision,
         (B, NodeId("prfaas/p1"), 1024, True, "why", CacheMove(A, B, 512), True)),
    ]  # fmt: skip
    for fast, cls, args in cases:
        got, want = fast(*args), cls(*args)
        assert type(got) is cls and got == want
        if not isinstance(got, RequestView):  # its mapping field is unhashable
            assert hash(got) == hash(want)
        for f in dataclasses.fields(cls):
            assert getattr(got, f.name) is getattr(want, f.name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(got, dataclasses.fields(cls)[0].name, None)
        assert dataclasses.replace(got) == want

    # Only classes whose layout a twin can copy qualify.
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithPost:
        x: int

        def __post_init__(self) -> None: ...

    for bad in (NoSlots, WithPost):
        with pytest.raises(TypeError):
            writable_twin(bad)
