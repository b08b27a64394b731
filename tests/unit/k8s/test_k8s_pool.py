"""``prfaas k8s`` of a pool file and of its tenants' files: every example renders the expected
kinds, validates offline (built-in kinds against the pinned schemas, custom resources against
the upstream CRDs where ``../shared/k8s-crds`` exists), holds no key material without
``--with-secrets`` (the examples' key variables are set to a recognisable value that must never
appear), is deterministic (a golden file for examples/pool/pool.yaml, regenerated only for a
change meant to alter it, with ``PRFAAS_UPDATE_GOLDEN=1``); bad input is one line naming the
field, exit 2; a pool pod's entry composes the workdir ``prfaas up pool.yaml`` writes and runs
the launcher's own command."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas.cli import main
from prfaas.config import load_deployment
from prfaas.k8s import RenderOptions, entry, pool_entry
from prfaas.k8s.emit import to_yaml
from prfaas.k8s.files import render_file
from prfaas.k8s.options import DEFAULT_TARGET
from prfaas.k8s.validate import validate_all
from prfaas.pool.launcher import front_door_args, node_group_args
from prfaas.pool.resolved import KEY_NAME, POOL_NAME, nodes_name
from prfaas.pool_file import load_pool
from prfaas.pool_sections import PoolFileConfig

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[3]
POOL = ROOT / "examples" / "pool" / "pool.yaml"
TENANTS = sorted((ROOT / "examples" / "pool").glob("tenant-*.yaml"))
GOLDEN = Path(__file__).parent / "golden" / "pool.yaml"
CRDS = ROOT.parent / "shared" / "k8s-crds"
LEAK = "LEAK-CHECK-pool-key-"
"""What the examples' key variables hold in these tests: never in a manifest."""
INTERNAL = "k8s-pool-internal-" + "cd" * 16


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for tenant in "ABC":
        monkeypatch.setenv(f"PRFAAS_POOL_KEY_{tenant}", f"{LEAK}{tenant}-0123456789abcdef")


def kinds(manifests: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in manifests:
        out[m["kind"]] = out.get(m["kind"], 0) + 1
    return out


def by_name(manifests: Any) -> dict[tuple[str, str], Any]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def assert_valid(manifests: Any) -> None:
    assert validate_all(list(manifests), DEFAULT_TARGET) == []
    if (CRDS / "keda.sh_scaledobjects.yaml").is_file():
        assert validate_all(list(manifests), DEFAULT_TARGET, CRDS) == []


def test_the_pool_renders_its_front_door_and_groups_without_keys() -> None:
    r = render_file(POOL, RenderOptions(name="pool"))
    assert kinds(r.manifests) == {
        "ConfigMap": 1,
        "Deployment": 1,  # the front door
        "Service": 4,  # its API and control Services, a headless one per group
        "StatefulSet": 2,  # one per node group
        "PodDisruptionBudget": 2,
        "NetworkPolicy": 2,
        "ServiceMonitor": 1,  # the front door's /metrics
    }
    assert r.secrets == ()
    text = to_yaml(r.manifests, "")
    assert LEAK not in text and "kind: Secret" not in text
    assert_valid(r.manifests)
    objs = by_name(r.manifests)
    door = objs[("Deployment", "pool-front-door")]
    assert door["spec"]["replicas"] == 1 and door["spec"]["strategy"]["type"] == "Recreate"
    c = door["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["pool-front-door", "--file", "pool.yaml"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "control"}
    assert objs[("Service", "pool-front-door")]["spec"]["ports"][0]["port"] == 8100
    assert objs[("Service", "pool-front-door-control")]["spec"]["ports"][0]["port"] == 8101
    pool = load_pool(POOL)
    for g in pool.groups:
        sts = objs[("StatefulSet", f"pool-{g.name}-prefill")]
        assert sts["spec"]["replicas"] == len(g.node_names)
        node = sts["spec"]["template"]["spec"]["containers"][0]
        assert node["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert node["args"][:5] == ["pool-node", "--file", "pool.yaml", "--group", g.name]
        assert "pool-front-door-control.prfaas.svc" in node["args"]
        assert node["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}  # timed
        vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        sources = [s["secret"]["name"] for s in vols["tenant-keys"]["projected"]["sources"]]
        assert sources == [f"pool-tenant-{t.name}" for t in pool.tenants]
        assert (
            objs[("PodDisruptionBudget", f"pool-{g.name}-prefill")]["spec"]["maxUnavailable"] == 1
        )
        assert sts["spec"]["template"]["metadata"]["labels"]["prfaas.io/site"] == g.name
    # the pool file as the pods read it: key references are the mounted Secrets' files
    pod_file = PoolFileConfig.model_validate(
        yaml.safe_load(objs[("ConfigMap", "pool-config")]["data"]["pool.yaml"])
    )
    assert pod_file.front_door.host == "0.0.0.0"
    refs = {k.id: (k.env, k.file) for t in pod_file.tenants for k in t.keys}
    assert refs["b-2026-11"] == (None, "/etc/prfaas/tenant-keys/tenant-b/b-2026-11")
    assert all(env is None for env, _ in refs.values())
    # the operator's control port: the namespace and monitoring only; the tenant API: anyone
    policy = objs[("NetworkPolicy", "pool-front-door")]["spec"]["ingress"]
    assert policy[0] == {"ports": [{"protocol": "TCP", "port": "api"}]}
    assert {"podSelector": {}} in policy[1]["from"]
    assert "ScaledObject" not in kinds(r.manifests)
    # Prometheus scrapes the front door's /metrics on its control Service
    monitor = objs[("ServiceMonitor", "pool")]["spec"]
    control = objs[("Service", "pool-front-door-control")]
    assert monitor["endpoints"][0]["port"] == "control"
    assert monitor["endpoints"][0]["port"] in {p["name"] for p in control["spec"]["ports"]}
    assert monitor["selector"]["matchLabels"].items() <= control["metadata"]["labels"].items()


@pytest.mark.parametrize("path", TENANTS, ids=lambda p: p.stem)
def test_each_tenant_renders_its_pd_site_with_the_pool_key_by_reference(path: Path) -> None:
    r = render_file(path, RenderOptions(name=path.stem))
    d = load_deployment(path)
    assert d.pool is not None
    got = kinds(r.manifests)
    assert {"ConfigMap", "Deployment", "StatefulSet", "Service", "PodDisruptionBudget"} <= set(got)
    assert {"NetworkPolicy", "ServiceMonitor"} <= set(got) and "ScaledObject" not in got
    assert r.secrets == ()
    text = to_yaml(r.manifests, "")
    assert LEAK not in text and "kind: Secret" not in text
    assert_valid(r.manifests)
    hosted = sorted(n for g in r.groups for n in g.node_names)
    assert hosted == sorted(n.name for s in d.sites for n in s.nodes)  # no prfaas site
    assert {g.site_kind for g in r.groups} == {"pd"}
    objs = by_name(r.manifests)
    nodes_file = yaml.safe_load(objs[("ConfigMap", f"{path.stem}-config")]["data"]["nodes.yaml"])
    assert nodes_file["pool"]["key"] == {
        "id": d.pool.key.id,
        "file": f"/etc/prfaas/pool-key/{d.pool.key.id}",
    }
    for m in r.manifests:
        if m["kind"] in ("Deployment", "StatefulSet"):
            vols = {v["name"]: v for v in m["spec"]["template"]["spec"]["volumes"]}
            assert vols["pool-key"]["secret"]["secretName"] == f"{path.stem}-pool-key"
    pool_kv = objs[("NetworkPolicy", f"{path.stem}-pool-kv")]["spec"]
    assert pool_kv["podSelector"]["matchLabels"]["prfaas.io/decodes"] == "true"
    # The pool's KV arrives on one fixed port, which every rendered node names and decode pods open.
    assert pool_kv["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8201}]}]
    for site in nodes_file["sites"]:
        assert {n["pool_transfer_port"] for n in site["nodes"]} == {8201}
    decode_ports = [
        {p["name"]: p["containerPort"] for p in c["ports"]}
        for m in r.manifests
        if m["kind"] in ("Deployment", "StatefulSet")
        and m["spec"]["template"]["metadata"]["labels"].get("prfaas.io/decodes") == "true"
        for c in m["spec"]["template"]["spec"]["containers"]
        if c["name"] == "node"
    ]
    assert decode_ports and all(p.get("pool-kv") == 8201 for p in decode_ports)
    assert any("pool.url" in w for w in r.warnings)  # the examples' URL is loopback


def test_the_pool_rendering_is_deterministic_and_matches_the_golden_file(tmp_path: Path) -> None:
    out = [tmp_path / "a", tmp_path / "b"]
    for o in out:
        assert main(["k8s", str(POOL), "-o", str(o)]) == 0
    first = (out[0] / "pool.yaml").read_bytes()
    assert first == (out[1] / "pool.yaml").read_bytes()
    text = first.decode().replace(str(POOL), "examples/pool/pool.yaml")
    if os.environ.get("PRFAAS_UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8"), (
        "the rendering changed: if meant, regenerate with PRFAAS_UPDATE_GOLDEN=1 and say why"
    )
    assert (out[0] / "pool.warnings.txt").is_file()


def test_with_secrets_the_pool_writes_one_private_secret_per_tenant(tmp_path: Path) -> None:
    raw = yaml.safe_load(POOL.read_text())
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "tenant-b-old.key").write_text(LEAK + "B-old-0123456789\n")
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nca\n")
    raw["tenants"][0]["receivers_tls"] = {"ca": "ca.pem", "server_hostname": "a.example"}
    raw["front_door"]["tls"] = {"cert": "ca.pem", "key": "ca.pem"}
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "o"
    assert main(["k8s", str(path), "-o", str(out), "--validate"]) == 0
    assert not (out / "pool.secrets.yaml").exists()
    main_text = (out / "pool.yaml").read_text()
    assert "pool-front-door-tls" in main_text and "receivers-ca.crt" in main_text
    assert main(["k8s", str(path), "-o", str(out), "--with-secrets", "--validate"]) == 0
    secrets = out / "pool.secrets.yaml"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert LEAK not in (out / "pool.yaml").read_text()
    docs = [doc for doc in yaml.safe_load_all(secrets.read_text()) if doc]
    names = [doc["metadata"]["name"] for doc in docs]
    assert names == [
        "pool-psk",
        "pool-tenant-tenant-a",
        "pool-tenant-tenant-b",
        "pool-tenant-tenant-c",
        "pool-front-door-tls",
    ]
    assert sorted(docs[2]["data"]) == ["b-2026-11", "b-2026-12"]
    assert sorted(docs[1]["data"]) == ["a-2026-12", "receivers-ca.crt"]
    assert docs[4]["type"] == "kubernetes.io/tls"


def test_with_secrets_a_tenant_writes_its_pool_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = TENANTS[0]
    out = tmp_path / "o"
    assert main(["k8s", str(path), "-o", str(out), "--with-secrets"]) == 0
    assert LEAK not in (out / f"{path.stem}.yaml").read_text()
    docs = [d for d in yaml.safe_load_all((out / f"{path.stem}.secrets.yaml").read_text()) if d]
    assert [d["metadata"]["name"] for d in docs] == [f"{path.stem}-psk", f"{path.stem}-pool-key"]
    monkeypatch.delenv("PRFAAS_POOL_KEY_A")
    capsys.readouterr()
    assert main(["k8s", str(path), "-o", str(out), "--with-secrets"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pool.key.env" in err, err


def _pool_file(tmp_path: Path, **group: Any) -> Path:
    raw = yaml.safe_load(POOL.read_text())
    raw["groups"][0].update(group)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("group", "field"),
    [
        ({"hardware": "prof.yaml"}, "groups[0].hardware: profile file"),
        ({"kind": "vllm", "model_path": "/m"}, "groups[0].kind"),
        ({"kind": "torch", "model_path": "/m"}, "units.time_scale: 0.1 with timed and torch"),
    ],
)
def test_bad_pool_input_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], group: dict[str, Any], field: str
) -> None:
    path = _pool_file(tmp_path, **group)
    assert main(["k8s", str(path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err, err


def test_a_group_hardware_with_no_resource_mapping_names_its_field() -> None:
    from prfaas.k8s import hardware

    with pytest.raises(Exception, match=r"groups\[1\]\.hardware: 'a100' \(group g\) has no"):
        hardware.pod_resources("g", 1, "a100", "torch", "cuda", 1, "groups[1].hardware")


def test_a_tenant_with_an_inference_pool_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["k8s", str(TENANTS[0]), "-o", str(tmp_path), "--inference-pool"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--inference-pool" in err


# -- the pool pods' entry ----------------------------------------------------------------------
def pod_root(path: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pod's filesystem for ``path``'s rendering: its ConfigMap's files and the psk Secret."""
    r = render_file(path, RenderOptions(name=name))
    config = next(m for m in r.manifests if m["kind"] == "ConfigMap")
    root = tmp_path / "pod"
    (root / "etc/prfaas/config").mkdir(parents=True)
    (root / "etc/prfaas/secret").mkdir(parents=True)
    for file_name, text in config["data"].items():
        (root / "etc/prfaas/config" / file_name).write_text(text)
    (root / "etc/prfaas/secret/psk").write_text(INTERNAL + "\n")
    monkeypatch.setenv("PRFAAS_K8S_ROOT", str(root) + "/")
    return root


def pool_pod_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return pod_root(POOL, "pool", tmp_path, monkeypatch)


def test_a_front_door_pod_runs_the_launchers_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pool_pod_root(tmp_path, monkeypatch)
    args = entry.parser().parse_args(["pool-front-door", "--file", "pool.yaml"])
    argv = entry.pool_argv(args, dict(os.environ))
    workdir = root / "run/prfaas/pool"
    assert argv == [sys.executable, *front_door_args(workdir)]
    assert (workdir / KEY_NAME).read_text().strip() == INTERNAL
    for name in (KEY_NAME, POOL_NAME):
        assert stat.S_IMODE((workdir / name).stat().st_mode) == 0o600
    resolved = PoolFileConfig.model_validate(yaml.safe_load((workdir / POOL_NAME).read_text()))
    assert (resolved.front_door.host, resolved.front_door.port) == ("0.0.0.0", 8100)


def test_a_pool_node_pod_hosts_its_index_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = pool_pod_root(tmp_path, monkeypatch)
    control = "pool-front-door-control.prfaas.svc"
    argv_in = ["pool-node", "--file", "pool.yaml", "--group", "g-qwen", "--host", "10.0.0.9"]
    args = entry.parser().parse_args([*argv_in, "--front-door", control])
    argv = entry.pool_argv(args, {"POD_INDEX": "1"})
    workdir = root / "run/prfaas/pool"
    assert argv == [sys.executable, *node_group_args(workdir, "g-qwen", "10.0.0.9")]
    assert argv[-3:] == [str(workdir), "g-qwen", "10.0.0.9"]
    d = load_deployment(workdir / nodes_name("g-qwen"))
    assert d.psk == INTERNAL
    assert d.control_url == f"http://{control}:8101"  # where the node registers
    mine = [n for s in d.sites if s.kind == "prfaas" for n in s.nodes]
    assert [(n.name, n.port, n.transfer_port) for n in mine] == [("g-qwen-1", 8100, 8200)]
    assert stat.S_IMODE((workdir / nodes_name("g-qwen")).stat().st_mode) == 0o600
    with pytest.raises(Exception, match="pod index 2: group g-qwen has 2 node"):
        entry.pool_argv(args, {"POD_INDEX": "2"})
    with pytest.raises(Exception, match="--group: no group 'nope'"):
        pool_entry.node(root, "pool.yaml", "nope", control, "10.0.0.9", {"POD_INDEX": "0"})


def test_a_tenant_pod_reads_its_pool_key_from_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = TENANTS[0]
    pod_root(path, "t", tmp_path, monkeypatch)
    args = entry.parser().parse_args(["gateway", "--file", "gateway.yaml"])
    composed, _ = entry.prepare(args, {})
    d = load_deployment(composed, require_psk=True)
    assert d.pool is not None and d.pool.key.env is None
    assert d.pool.key.file == f"/etc/prfaas/pool-key/{d.pool.key.id}"
    assert LEAK not in composed.read_text()


def test_a_preemptible_groups_pods_get_a_grace_period_over_their_notice() -> None:
    """A group with ``notice_s``: its pods take SIGTERM as the notice (``pool.node_main``), so
    their ``terminationGracePeriodSeconds`` is the notice (whole seconds up) plus the process's
    own stop time, by the rule a deployment node's drain deadline takes (``pods.grace_s``); a
    group without one keeps the stop time alone, and the warning says what was rendered."""
    from prfaas.k8s import pods
    from prfaas.k8s.pool_render import render_pool, warnings_for

    pool = load_pool(POOL)
    assert not any("notice_s" in w for w in warnings_for(pool))
    for notice_s, grace in ((20.0, 50), (45.5, 76), (120.0, 150)):
        g = pool.groups[0].model_copy(update={"notice_s": notice_s})
        noticed = pool.model_copy(update={"groups": [g, *pool.groups[1:]]})
        manifests = render_pool(noticed, POOL, RenderOptions(name="pool")).manifests
        pods_of = {
            m["metadata"]["labels"]["prfaas.io/pool-group"]: m["spec"]["template"]
            for m in manifests
            if m["kind"] == "StatefulSet"
        }
        spot, other = pods_of[g.name], pods_of[pool.groups[1].name]
        assert spot["spec"]["terminationGracePeriodSeconds"] == grace >= notice_s + 5
        assert spot["metadata"]["annotations"]["prfaas.io/notice-s"] == str(grace - 30)
        assert grace == pods.grace_s(int(grace - 30), g.kind)  # the deployment's own rule
        assert other["spec"]["terminationGracePeriodSeconds"] == pods.STOP_GRACE_S
        assert "prfaas.io/notice-s" not in other["metadata"]["annotations"]
        said = [w for w in warnings_for(noticed) if w.startswith("groups[].notice_s")]
        assert len(said) == 1 and "spot notice" in said[0] and f"is {grace} s" in said[0], said


def test_a_groups_cpus_is_said_to_pin_inside_the_pod() -> None:
    """As a deployment site's ``engine.cpus`` (``k8s.unsupported``): kept, and said."""
    from prfaas.k8s.pool_render import warnings_for

    pool = load_pool(POOL)
    assert not any("cpus" in w for w in warnings_for(pool))
    g = pool.groups[1].model_copy(update={"cpus": "2-3"})
    said = [w for w in warnings_for(pool.model_copy(update={"groups": [pool.groups[0], g]}))
            if "cpus" in w]  # fmt: skip
    assert said == [
        "groups[1] (g-qwen) cpus: pinning inside the pod's cgroup; the cores must exist in it "
        "(kubelet's static CPU manager gives whole cores)"
    ]
