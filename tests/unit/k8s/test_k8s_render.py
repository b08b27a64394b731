"""``prfaas k8s``: every example deployment file renders into the expected kinds with no key
material; the rendering is deterministic (a golden file for examples/two-site.yaml, regenerated
only for a change meant to alter it, with ``PRFAAS_UPDATE_GOLDEN=1``); keys a pod cannot honour
are stated; bad input is one line naming the field, exit 2."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas.cli import main
from prfaas.config import load_deployment
from prfaas.k8s import RenderOptions, render_deployment
from prfaas.k8s.emit import to_yaml

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GOLDEN = Path(__file__).parent / "golden" / "two-site.yaml"
PLACEHOLDERS = ("change-me-to-a-long-random-secret", "demo-key-not-a-secret-0123456789")


def render_file(path: Path, **kw: Any) -> Any:
    d = load_deployment(path, require_psk=True)
    return render_deployment(d, RenderOptions(name=path.stem, **kw), inference_pool=True)


def kinds(manifests: Any) -> set[str]:
    return {m["kind"] for m in manifests}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_renders_the_expected_kinds_without_keys(path: Path) -> None:
    r = render_file(path)
    d = load_deployment(path, require_psk=True)
    expected = {
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ServiceMonitor",
        "InferencePool",
        "HTTPRoute",
    }
    assert expected <= kinds(r.manifests)
    assert r.secrets == ()
    text = to_yaml(r.manifests, "")
    assert d.psk not in text  # no key material without --with-secrets
    assert "kind: Secret" not in text
    has_prfaas = any(s.kind == "prfaas" for s in d.sites)
    assert ("ScaledObject" in kinds(r.manifests)) == has_prfaas
    # every node of the file is hosted by exactly one group
    hosted = [n for g in r.groups for n in g.node_names]
    assert sorted(hosted) == sorted(n.name for s in d.sites for n in s.nodes)
    for m in r.manifests:
        if m["kind"] in ("StatefulSet", "Deployment"):
            spec = m["spec"]["template"]["spec"]
            c = spec["containers"][0]
            if m["metadata"]["labels"]["app.kubernetes.io/component"] == "epp":
                assert c["readinessProbe"]["grpc"]["service"] == "readiness"
                continue
            assert c["livenessProbe"]["httpGet"]["path"] == "/health"
            assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
            drain = int(
                m["spec"]["template"]
                .get("metadata", {})
                .get("annotations", {})
                .get("prfaas.io/drain-deadline-s", 0)
            )
            assert spec["terminationGracePeriodSeconds"] >= max(drain, d.gateway.request_timeout_s)


def test_rendering_is_deterministic_and_matches_the_golden_file(tmp_path: Path) -> None:
    path = ROOT / "examples" / "two-site.yaml"
    out = [tmp_path / "a", tmp_path / "b"]
    for o in out:
        assert main(["k8s", str(path), "-o", str(o), "--inference-pool"]) == 0
    first = (out[0] / "two-site.yaml").read_bytes()
    assert first == (out[1] / "two-site.yaml").read_bytes()
    text = first.decode().replace(str(path), "examples/two-site.yaml")
    if os.environ.get("PRFAAS_UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8"), (
        "the rendering changed: if meant, regenerate with PRFAAS_UPDATE_GOLDEN=1 and say why"
    )


def test_workloads_follow_sites_and_roles() -> None:
    r = render_file(ROOT / "examples" / "two-site.yaml")
    by_name = {(m["kind"], m["metadata"]["name"]): m for m in r.manifests}
    pf = by_name[("Deployment", "two-site-prfaas-prefill")]
    assert (
        pf["spec"]["template"]["metadata"]["annotations"][
            "controller.kubernetes.io/pod-deletion-cost"
        ]
        == "0"
    )
    decode = by_name[("StatefulSet", "two-site-pd-decode")]
    assert decode["spec"]["replicas"] == 2
    assert decode["spec"]["template"]["metadata"]["labels"]["llm-d.ai/role"] == "decode"
    expr = decode["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "prfaas.io/site", "operator": "In", "values": ["pd"]} in expr
    scaled = by_name[("ScaledObject", "two-site-prfaas-prefill")]
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert (
        'prfaas_stage_queue_depth{stage="prefill_queue",node=~"two-site-prfaas-prefill-.*"}'
        in query
    )
    nodes_file = yaml.safe_load(by_name[("ConfigMap", "two-site-config")]["data"]["nodes.yaml"])
    assert nodes_file["gateway"]["host"] == "two-site-gateway-control.prfaas.svc"
    assert "psk" not in nodes_file


def test_gpu_sites_request_their_hardware_and_topology(tmp_path: Path) -> None:
    from prfaas.k8s.options import SiteTopology

    path = ROOT / "examples" / "vllm-tiny.yaml"
    d = load_deployment(path, require_psk=True)
    opts = RenderOptions(name="v", topology={"prfaas": SiteTopology("us-east1", "us-east1-b")})
    r = render_deployment(d, opts)
    both = next(m for m in r.manifests if m["metadata"]["name"] == "v-pd-both")
    assert both["kind"] == "StatefulSet" and both["spec"]["replicas"] == 1
    container = both["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert "--role" in container["args"] and "node" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["weights"] == "/tmp"  # the claim holds the file's model folder at its path
    pf = next(m for m in r.manifests if m["metadata"]["name"] == "v-prfaas-prefill")
    expr = pf["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    keys = {e["key"]: e["values"] for e in expr}
    assert keys["topology.kubernetes.io/region"] == ["us-east1"]
    assert keys["topology.kubernetes.io/zone"] == ["us-east1-b"]
    assert keys["nvidia.com/gpu.product"] == ["NVIDIA-H200"]


def _file(tmp_path: Path, **changes: Any) -> Path:
    raw = yaml.safe_load((ROOT / "examples" / "two-site.yaml").read_text())
    raw.update(changes)
    raw = {k: v for k, v in raw.items() if v is not None}
    path = tmp_path / "dep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_with_secrets_writes_a_private_file_and_refuses_placeholders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    placeholder = _file(tmp_path)
    assert main(["k8s", str(placeholder), "-o", str(tmp_path / "o"), "--with-secrets"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prfaas k8s: error: psk:") and "placeholder" in err
    assert len(err.splitlines()) == 1
    key = "k8s-test-" + "5f" * 16
    good = _file(tmp_path, psk=key)
    out = tmp_path / "o2"
    assert main(["k8s", str(good), "-o", str(out)]) == 0
    assert not (out / "dep.secrets.yaml").exists()
    assert main(["k8s", str(good), "-o", str(out), "--with-secrets"]) == 0
    secrets = out / "dep.secrets.yaml"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert key not in (out / "dep.yaml").read_text()
    docs = [doc for doc in yaml.safe_load_all(secrets.read_text()) if doc]
    assert [doc["metadata"]["name"] for doc in docs] == ["dep-psk"]


@pytest.mark.parametrize(
    ("argv_extra", "changes", "field"),
    [
        (["--target", "1.12"], {}, "--target"),
        ([], {"psk": None}, "psk: missing"),
        (
            [],
            {
                "sites": [
                    {
                        "name": "pd",
                        "kind": "pd",
                        "hardware": "h20",
                        "nodes": [{"name": "d0", "role": "decode"}],
                        "engine": {"kind": "torch", "device": "cuda", "model_path": "/m"},
                    },
                    {
                        "name": "x",
                        "kind": "prfaas",
                        "hardware": "h20",
                        "nodes": [{"name": "p0", "role": "prefill"}],
                        "engine": {"kind": "torch", "device": "cuda", "model_path": "/m"},
                    },
                ],
                "links": [{"src": "x", "dst": "pd", "gbps": 1}],
            },
            None,
        ),
        (["--site-topology", "nowhere=eu"], {}, "--site-topology"),
        (["--namespace", "Bad_NS"], {}, "--namespace"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv_extra: list[str],
    changes: dict[str, Any],
    field: str | None,
) -> None:
    path = _file(tmp_path, **changes)
    code = main(["k8s", str(path), "-o", str(tmp_path / "o"), *argv_extra])
    err = capsys.readouterr().err.strip()
    if field is None:  # h20 has a mapping: this one renders
        assert code == 0
        return
    assert code == 2, err
    assert len(err.splitlines()) == 1 and field in err, err


def test_hardware_with_no_resource_mapping_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prfaas.k8s import hardware

    with pytest.raises(Exception, match=r"sites\[1\]\.hardware: 'a100' \(site x\) has no"):
        hardware.pod_resources("x", 1, "a100", "vllm", "cuda", 1)
    profile = tmp_path / "prof.yaml"
    raw = yaml.safe_load((ROOT / "examples" / "two-site.yaml").read_text())
    raw["sites"][0]["hardware"] = str(profile)
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(raw))
    from prfaas.k8s.unsupported import refuse_unrenderable

    d = load_deployment(ROOT / "examples" / "two-site.yaml")
    bad = d.model_copy(
        update={"sites": [d.sites[0].model_copy(update={"hardware": "x.yaml"}), *d.sites[1:]]}
    )
    with pytest.raises(Exception, match=r"sites\[0\]\.hardware: profile file 'x.yaml'"):
        refuse_unrenderable(bad)


def test_control_plane_tls_is_refused_for_kubernetes(tmp_path: Path) -> None:
    from prfaas.config import TLSConfig
    from prfaas.k8s.unsupported import refuse_unrenderable

    pem = tmp_path / "x.pem"
    pem.write_text("not read here")
    tls = TLSConfig(cert=str(pem), key=str(pem), ca=str(pem), control_plane=True)
    d = load_deployment(ROOT / "examples" / "two-site.yaml").model_copy(update={"tls": tls})
    with pytest.raises(Exception, match=r"tls\.control_plane: not rendered for Kubernetes"):
        refuse_unrenderable(d)
    refuse_unrenderable(
        d.model_copy(update={"tls": tls.model_copy(update={"control_plane": False})})
    )


def test_keys_kubernetes_cannot_honour_are_stated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, netns=True)
    out = tmp_path / "o"
    assert main(["k8s", str(path), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: netns: ignored on Kubernetes" in err
    assert "netns: ignored" in (out / "dep.warnings.txt").read_text()


def test_with_an_inference_pool_the_picker_is_the_control_plane() -> None:
    r = render_file(ROOT / "examples" / "two-site.yaml")  # rendered with --inference-pool
    by_name = {(m["kind"], m["metadata"]["name"]): m for m in r.manifests}
    assert ("Deployment", "two-site-gateway") not in by_name  # `prfaas epp` is the gateway
    control = by_name[("Service", "two-site-gateway-control")]
    assert control["spec"]["selector"]["app.kubernetes.io/component"] == "epp"
    pool = by_name[("InferencePool", "two-site-pool")]
    assert pool["spec"]["targetPorts"] == [{"number": 8300}]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    decode = by_name[("StatefulSet", "two-site-pd-decode")]["spec"]["template"]
    assert decode["metadata"]["labels"]["prfaas.io/decodes"] == "true"
    sidecar = decode["spec"]["containers"][1]
    assert sidecar["name"] == "sidecar" and sidecar["ports"][0]["containerPort"] == 8300
    prefill = by_name[("StatefulSet", "two-site-pd-prefill")]["spec"]["template"]
    assert [c["name"] for c in prefill["spec"]["containers"]] == ["node"]
    epp = by_name[("Deployment", "two-site-epp")]["spec"]["template"]["spec"]["containers"][0]
    assert epp["args"][:3] == ["epp", "--file", "gateway.yaml"]
    plain = render_deployment(
        load_deployment(ROOT / "examples" / "two-site.yaml"), RenderOptions(name="p")
    )
    assert "InferencePool" not in kinds(plain.manifests)
    assert any(
        m["metadata"]["name"] == "p-gateway" and m["kind"] == "Deployment" for m in plain.manifests
    )
