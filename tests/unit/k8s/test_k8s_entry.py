"""A pod's entry (``python -m prfaas.k8s.entry``): it composes its deployment file from the
ConfigMap's variant and the Secret's key (mode 0600), picks the nodes it hosts (a StatefulSet
pod's index, a Deployment pod's own name) and builds the ``prfaas serve`` command; the composed
file loads as a deployment. The node API's ``/ready`` is open and follows draining."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from prfaas.config import load_deployment
from prfaas.errors import UsageError
from prfaas.k8s import RenderOptions, entry, render_deployment
from prfaas.serve.auth import SignedAuth

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[3]
KEY = "k8s-entry-test-" + "ab" * 16


def pod_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, example: str) -> None:
    d = load_deployment(ROOT / "examples" / example, require_psk=True)
    r = render_deployment(d, RenderOptions(name="t"))
    config = next(m for m in r.manifests if m["kind"] == "ConfigMap")
    root = tmp_path / "pod"
    (root / "etc/prfaas/config").mkdir(parents=True)
    (root / "etc/prfaas/secret").mkdir(parents=True)
    for name, text in config["data"].items():
        (root / "etc/prfaas/config" / name).write_text(text)
    (root / "etc/prfaas/secret/psk").write_text(KEY + "\n")
    monkeypatch.setenv("PRFAAS_K8S_ROOT", str(root) + "/")


def test_a_statefulset_pod_hosts_its_index_node(tmp_path: Path, monkeypatch: Any) -> None:
    pod_root(tmp_path, monkeypatch, "two-site.yaml")
    args = entry.parser().parse_args(
        [
            "node",
            "--file",
            "nodes.yaml",
            "--site",
            "pd",
            "--role",
            "decode",
            "--pod-group",
            "statefulset",
            "--host",
            "10.0.0.7",
        ]
    )
    composed, nodes = entry.prepare(args, {"POD_INDEX": "1"})
    assert nodes == ["d1"]
    assert stat.S_IMODE(composed.stat().st_mode) == 0o600
    d = load_deployment(composed, require_psk=True)
    assert d.psk == KEY
    assert d.control_url == "http://t-gateway-control.prfaas.svc:8001"
    assert d.node("d1").port == 8100 and d.node("d1").transfer_port == 8200
    argv = entry.serve_argv(args, composed, nodes)
    assert argv[:4] == ["prfaas", "serve", "--role", "decode"]
    assert argv[-4:] == ["--host", "10.0.0.7", "--node", "d1"]
    with pytest.raises(UsageError, match="pod index 2: site pd has 2 decode"):
        entry.prepare(args, {"POD_INDEX": "2"})


def test_a_deployment_pod_is_a_node_named_after_it(tmp_path: Path, monkeypatch: Any) -> None:
    pod_root(tmp_path, monkeypatch, "two-site.yaml")
    args = entry.parser().parse_args(
        [
            "node",
            "--file",
            "nodes.yaml",
            "--site",
            "prfaas",
            "--role",
            "prefill",
            "--pod-group",
            "deployment",
            "--host",
            "10.0.0.8",
        ]
    )
    composed, nodes = entry.prepare(args, {"POD_NAME": "t-prfaas-prefill-7d9f-x2"})
    assert nodes == ["t-prfaas-prefill-7d9f-x2"]
    d = load_deployment(composed, require_psk=True)
    assert d.site_of("t-prfaas-prefill-7d9f-x2").name == "prfaas"
    assert (tmp_path / "pod/run/prfaas/nodes").read_text() == "t-prfaas-prefill-7d9f-x2\n"


def test_the_gateway_listens_everywhere(tmp_path: Path, monkeypatch: Any) -> None:
    pod_root(tmp_path, monkeypatch, "vllm-tiny.yaml")
    args = entry.parser().parse_args(["gateway", "--file", "gateway.yaml"])
    composed, nodes = entry.prepare(args, {})
    d = load_deployment(composed, require_psk=True)
    assert (d.gateway.host, d.gateway.port, d.gateway.control_port) == ("0.0.0.0", 8000, 8001)
    assert nodes == []
    assert entry.serve_argv(args, composed, nodes)[:4] == ["prfaas", "serve", "--role", "gateway"]


async def test_node_ready_is_open_and_follows_draining() -> None:
    from prfaas.serve.node.app import create_node_app

    d = load_deployment(ROOT / "examples" / "two-site.yaml")
    node = SimpleNamespace(draining=False)
    host = SimpleNamespace(
        deployment=d,
        auth=SignedAuth(b"k" * 32),
        process_name="p",
        nodes={"d0": node},
        reports=lambda: [],
        health_details=lambda: {},
    )
    app = create_node_app(host)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
        r = await client.get("/ready")  # unsigned
        assert (r.status_code, r.json()) == (200, {"ready": True, "nodes": ["d0"]})
        node.draining = True
        r = await client.get("/ready")
        assert (r.status_code, r.json()["ready"]) == (503, False)
        assert (await client.get("/link/rate")).status_code in (401, 405)  # the rest is signed


def test_a_decode_pods_sidecar_serves_its_decode_node(tmp_path: Path, monkeypatch: Any) -> None:
    pod_root(tmp_path, monkeypatch, "vllm-tiny.yaml")
    args = entry.parser().parse_args(
        [
            "sidecar",
            "--file",
            "nodes.yaml",
            "--site",
            "pd",
            "--role",
            "node",
            "--pod-group",
            "statefulset",
            "--port",
            "8300",
        ]
    )
    composed, nodes = entry.prepare(args, {"POD_INDEX": "0"})
    assert composed.name == "sidecar.yaml" and nodes == ["p0", "d0"]
    argv = entry.serve_argv(args, composed, nodes)
    assert argv == [
        "prfaas",
        "epp-sidecar",
        "--config",
        str(composed),
        "--port",
        "8300",
        "--node",
        "d0",
    ]


def test_keys_still_accepted_in_a_rotation_stay_in_the_secret(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """``accept_psks`` are keys: never in the ConfigMap, in the psk Secret with --with-secrets,
    and composed back into the pod's file by the entry (the rotation works in a pod)."""
    from prfaas.k8s.names import Names
    from prfaas.k8s.secrets import secret_manifests

    old = "k8s-entry-old-key-" + "cd" * 16
    d = load_deployment(ROOT / "examples" / "two-site.yaml", require_psk=True)
    d = d.model_copy(update={"psk": KEY, "accept_psks": [old]})
    r = render_deployment(d, RenderOptions(name="t"))
    assert old not in repr(r.manifests)
    (psk_secret,) = [m for m in secret_manifests(d, Names("t"), "default")
                     if "psk" in m["data"]]  # fmt: skip
    assert set(psk_secret["data"]) == {"psk", "accept_psks"}
    pod_root(tmp_path, monkeypatch, "two-site.yaml")
    (tmp_path / "pod/etc/prfaas/secret/accept_psks").write_text(old + "\n")
    raw = entry.compose("nodes.yaml")
    assert raw["psk"] == KEY and raw["accept_psks"] == [old]
