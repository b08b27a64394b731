"""The inter-site link loses capacity underneath a running deployment and nobody tells prfaas.

The PrfaaS site runs in its own network namespace (``netns: true``); its KV crosses a veth that
tbf shapes to the link's emulated rate. Mid-run the test changes that tbf rate with ``tc``
directly. The sender is not paced in a namespaced deployment (tbf is the link) and the PrfaaS
node produces KV faster than the lowered rate, so the only way the gateway can learn the new
capacity is from what the senders observe (``core.link_estimate``): acknowledged bytes while a
queue stands. The estimate falls, the tuner raises ``t``, fewer requests offload, all complete;
the rate comes back, the estimate rises from the goodput the link then carries, and offloading
resumes. Assertions are on directions and shares, never on wall time.
"""

from __future__ import annotations

import random
import subprocess
from typing import Any

import pytest
from link_helpers import link_deployment
from link_helpers import wave as send_wave
from live_helpers import control, launched, routes

from prfaas.netlab import unavailable_reason

pytestmark = pytest.mark.timeout(150)

LINK_GBPS = 10.0
"""Modelled. At time_scale 0.2 and byte_divisor 1000 the veth carries 50 Mbit/s (6.25 MB/s)."""
DEGRADED_GBPS = 1.0
"""Modelled (5 Mbit/s on the veth). The H200 node emits ~3 Gbps (modelled) of KV while it
prefills, so the offered KV rate is above this, and the sender is not paced at all."""
SCALE = 1000 * 0.2  # byte_divisor x time_scale: modelled bytes/s per wall payload byte/s
MAX_TOKENS = 32


def _set_tbf(namespace: str, gbps: float) -> None:
    """Change the veth's shaper behind prfaas's back (the launcher set it up with this form)."""
    mbit = gbps * 1000 / SCALE
    burst = max(64 << 10, int(mbit * 1e6 / 8 * 0.001))
    subprocess.run(
        ["ip", "netns", "exec", namespace, "tc", "qdisc", "change", "dev", "a0", "root", "tbf",
         "rate", f"{mbit}mbit", "burst", str(burst), "latency", "25ms"],
        check=True, capture_output=True, timeout=10,
    )  # fmt: skip


def _link(live: Any) -> dict[str, Any]:
    (link,) = control(live, "/internal/control")["links"]
    assert isinstance(link, dict)
    return link


def _share(done: list[dict[str, Any]]) -> float:
    return sum(1 for r in done if r["offloaded"]) / len(done)


def test_tbf_lowered_underneath_is_measured_and_the_tuner_follows(tmp_path: Any) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    rng = random.Random(11)
    # One mix for every measured wave (its own prompts each time: no prefix reuse), so the
    # offloaded shares compare t's, not draws; two long prompts first: they offload under any t
    # below the window's longest. A t at or above it keeps every request off the link; then the
    # senders' estimate, with nothing crossing, steps up every 10 s of quiet (core.link_estimate)
    # until t lets some through again (without that step a host loaded enough to under-read the
    # degraded link left t at 120,000 and the link unused for good: fresh-clone CI, 2026-12-07).
    mix = [120_000, 110_000]
    mix += [int(min(100_000, rng.lognormvariate(9.9, 1.0))) + 200 for _ in range(38)]
    half = len(mix) // 2

    with launched(link_deployment(LINK_GBPS, netns=True), tmp_path) as live:
        ns = live.testbed.ns_a

        def wave(lengths: list[int], start_tag: int) -> float:
            """Send a wave, wait for all of it; its offloaded share (routes are recorded as
            requests finish, and a wave ends only when all of its requests have)."""
            n_before = len(routes(live))
            statuses = send_wave(live.url, lengths, start_tag, MAX_TOKENS)
            assert statuses == [200] * len(lengths)  # none fails
            done = routes(live)[n_before:]
            assert len(done) == len(lengths)
            return _share(done)

        def updates() -> list[dict[str, Any]]:
            return list(control(live, "/internal/control")["threshold_updates"])

        # 1. Nominal link: the window fills, the tuner settles t.
        shared_nominal = wave(mix, 0)
        nominal = _link(live)
        t_nominal = control(live, "/internal/control")["threshold_tokens"]
        # 2. The veth drops to a tenth; prfaas is not told. A first half-wave lets the senders
        # measure it and the tuner react; the next wave runs under the t that follows. The
        # phase is read by its lowest estimate and highest t: with only the longest prompts
        # offloaded, the link may carry nothing for 10 s, and the estimate then steps up
        # (probing, core.link_estimate) until the next request measures it again.
        _set_tbf(ns, DEGRADED_GBPS)
        n_before = len(updates())
        wave(mix[:half], 40)
        degraded_half = _link(live)
        shared_degraded = wave(mix, 60)
        degraded = min(degraded_half, _link(live), key=lambda x: x["capacity_bytes_per_s"])
        t_degraded = max([t_nominal] + [int(u["threshold_tokens"]) for u in updates()[n_before:]])
        # 3. The rate comes back: what still offloads (the long prompts) shows the link carries
        # more again; the next wave runs under the t that follows. Read by its highest estimate,
        # lowest t and larger offloaded share, as the degraded phase by its worst: on a loaded
        # host the sender itself can fall behind and be measured as the link (a fresh-clone CI
        # beside the tiny fidelity bench: t back to 43,628 after the restore, then 110,000 at an
        # estimate of 60 MB/s with the link idle, and the last wave all local).
        _set_tbf(ns, LINK_GBPS)
        n_restore = len(updates())
        shared_restored_half = wave(mix[:half], 100)
        restored_half = _link(live)
        shared_restored = max(shared_restored_half, wave(mix, 120))
        restored = max(restored_half, _link(live), key=lambda x: x["capacity_bytes_per_s"])
        t_now = int(control(live, "/internal/control")["threshold_tokens"])
        all_updates = updates()
        t_restored = min([t_now] + [int(u["threshold_tokens"]) for u in all_updates[n_restore:]])
    figures = {
        "nominal": nominal, "degraded": degraded, "restored": restored,
        "t": (t_nominal, t_degraded, t_restored),
        "offloaded": (shared_nominal, shared_degraded, shared_restored), "updates": all_updates,
    }  # fmt: skip
    print(figures)
    configured = LINK_GBPS * 1e9 / 8
    low = DEGRADED_GBPS * 1e9 / 8
    # The estimate measured the lowered link: far under the configured rate, near the tbf rate.
    # It may read above it by at most tbf's burst (64 KiB) over one 0.1 s reporting interval
    # (+100% at this rate; seen: +15%), never the configured or the nominal rate.
    # Nominal: the KV does not outrun the link, so the configured capacity stands; on a host so
    # loaded that the sender itself falls behind (seen with two suites at once: 0.29 of the
    # configured rate), a measured one, still well above what the degraded link reads.
    assert (
        nominal["capacity_basis"] == "configured"
        or nominal["capacity_bytes_per_s"] > 2 * degraded["capacity_bytes_per_s"]
    ), figures
    assert degraded["capacity_basis"] == "measured", figures
    assert degraded["capacity_bytes_per_s"] < 2.2 * low < 0.25 * configured, figures
    assert t_degraded > t_nominal, figures
    assert "link capacity changed" in [u["reason"] for u in all_updates], figures
    assert shared_degraded < shared_nominal, figures
    # Back up: the estimate rose from what the link carried, t came down, offloading resumed.
    assert restored["capacity_bytes_per_s"] > 2 * degraded["capacity_bytes_per_s"], figures
    assert t_restored < t_degraded, figures
    assert shared_restored > shared_degraded, figures
