"""The deployment and load the live link tests share (``test_live_link_measured.py``: tbf lowered
underneath a namespaced deployment; ``test_live_shaping.py``: the sender's pacer lowered through
the node API).

One timed two-site deployment: a PrfaaS site of one H200 prefill node, a PD site of three H20
prefill and two decode nodes, the ``prfaas`` router with the tuner (20 samples, a 1 s control
interval), 0.1 s heartbeats; at time_scale 0.2 and byte_divisor 1000 a modelled Gbps is 5 Mbit/s
of payload on the wire. Requests go out in waves of about two per modelled second, each prompt
tagged so that no wave reuses another's prefix.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from prfaas.config import DeploymentConfig


def link_deployment(link_gbps: float, netns: bool = False) -> DeploymentConfig:
    """The shared deployment over a ``link_gbps`` (modelled) link; ``netns`` puts the PrfaaS
    site in its own network namespace behind a tbf-shaped veth (the launcher's testbed)."""
    raw: dict[str, Any] = {
        "engine": {"kind": "timed", "model": "paper-1t", "time_scale": 0.2,
                   "byte_divisor": 1000, "token_chunk": 64},
        "gateway": {"port": 0, "control_port": 0, "request_timeout_s": 120},
        "policy": {"router": "prfaas", "tune_min_samples": 20, "control_interval_s": 1.0},
        "heartbeat_interval_s": 0.1,
        "sites": [
            {"name": "prfaas", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "h20",
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "p1", "role": "prefill"},
                       {"name": "p2", "role": "prefill"}, {"name": "d0", "role": "decode"},
                       {"name": "d1", "role": "decode"}]},
        ],
        "links": [{"src": "prfaas", "dst": "pd", "gbps": link_gbps}],
        "psk": "test-key-0123456789abcdef",
    }  # fmt: skip
    if netns:
        raw["netns"] = True
    return DeploymentConfig.model_validate(raw)


def send(url: str, n: int, tag: int, max_tokens: int) -> int:
    """A prompt of ``n`` tokens whose first token is ``tag * 31 % 200``: tags 0..199 share no
    prefix (31 is prime to 200), so no wave reuses another's cache. The HTTP status."""
    prompt = [(tag * 31 + i) % 200 + 1 for i in range(n)]
    body = {"model": "paper-1t", "prompt": prompt, "max_tokens": max_tokens}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code


def wave(url: str, lengths: list[int], start_tag: int, max_tokens: int) -> list[int]:
    """One request per length, ``start_tag`` on, 0.1 s apart (~2 per modelled second), 8 at a
    time at most; every status, in order, once all have answered."""
    with ThreadPoolExecutor(8) as pool:
        futures = []
        for i, n in enumerate(lengths):
            futures.append(pool.submit(send, url, n, start_tag + i, max_tokens))
            time.sleep(0.1)
        return [f.result() for f in futures]
