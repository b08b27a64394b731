"""Every manifest rendered from every example validates offline: built-in kinds against the
strict Kubernetes OpenAPI schemas ``kubernetes-validate`` ships for the pinned version (no
network), custom resources (InferencePool, ScaledObject, ServiceMonitor) against the upstream
CRDs kept in ``../shared/k8s-crds`` (skipped, saying so, where that folder is absent); a
deliberately broken manifest fails naming the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from prfaas.config import load_deployment
from prfaas.k8s import RenderOptions, render_deployment
from prfaas.k8s.options import DEFAULT_TARGET
from prfaas.k8s.validate import validate_all

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
CRDS = ROOT.parent / "shared" / "k8s-crds"

pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")


def crds_or_skip() -> Path:
    if not (CRDS / "keda.sh_scaledobjects.yaml").is_file():
        pytest.skip(f"no upstream CRDs at {CRDS} (../shared absent): custom resources unchecked")
    return CRDS


def rendered(path: Path) -> list[dict[str, Any]]:
    d = load_deployment(path, require_psk=True)
    r = render_deployment(d, RenderOptions(name=path.stem), inference_pool=True)
    return list(r.manifests)


def test_every_example_validates_against_the_pinned_kubernetes_schemas() -> None:
    for path in EXAMPLES:
        assert validate_all(rendered(path), DEFAULT_TARGET) == [], path.name


def test_custom_resources_validate_against_the_upstream_crds() -> None:
    crds = crds_or_skip()
    for path in EXAMPLES:
        manifests = rendered(path)
        custom = [
            m for m in manifests if m["kind"] in ("InferencePool", "ScaledObject", "ServiceMonitor")
        ]
        assert {m["kind"] for m in custom} >= {"InferencePool", "ServiceMonitor"}
        assert validate_all(custom, DEFAULT_TARGET, crds) == [], path.name


def _find(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(m for m in manifests if m["kind"] == kind)


def test_a_broken_manifest_fails_naming_the_field() -> None:
    manifests = copy.deepcopy(rendered(ROOT / "examples" / "two-site.yaml"))
    sts = _find(manifests, "StatefulSet")
    name = sts["metadata"]["name"]
    sts["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = 80.5
    del sts["spec"]["selector"]
    problems = validate_all([sts], DEFAULT_TARGET)
    assert f"StatefulSet/{name}: spec: 'selector' is a required property" in problems
    probe = f"StatefulSet/{name}: spec.template.spec.containers[0].livenessProbe.httpGet.port: "
    assert any(p.startswith(probe) for p in problems), problems
    svc = copy.deepcopy(_find(manifests, "Service"))
    svc["spec"]["ports"][0]["port"] = "http"  # a Service port is a number
    assert any("spec.ports[0].port" in p for p in validate_all([svc], DEFAULT_TARGET))
    svc["spec"]["bogus"] = 1  # strict: an unknown field is refused
    assert any("bogus" in p for p in validate_all([svc], DEFAULT_TARGET))


def test_a_broken_custom_resource_fails_naming_the_field() -> None:
    crds = crds_or_skip()
    manifests = copy.deepcopy(rendered(ROOT / "examples" / "two-site.yaml"))
    scaled = _find(manifests, "ScaledObject")
    del scaled["spec"]["scaleTargetRef"]["name"]
    pool = _find(manifests, "InferencePool")
    pool["spec"]["targetPorts"] = [{"number": "http"}]
    problems = validate_all([scaled, pool], DEFAULT_TARGET, crds)
    assert any("spec.scaleTargetRef: 'name' is a required property" in p for p in problems)
    assert any("spec.targetPorts[0].number: 'http' is not of type 'integer'" in p for p in problems)
