"""Pool and tenant files: the shipped examples load; bad input is one line naming the field (an
unknown tenant or model, a non-positive weight, two tenants with one name, units or block size
that differ from the pool's, a key the pool does not list); `prfaas sim POOL TENANT...` prints a
`tenants` object, one entry per tenant."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prfaas.errors import UsageError
from prfaas.pool_file import load_pool, load_tenant, pool_shape, resolve_key

pytestmark = pytest.mark.timeout(120)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "pool"
POOL = EXAMPLES / "pool.yaml"


def _pool_with(tmp_path: Path, change) -> Path:
    raw = yaml.safe_load(POOL.read_text())
    change(raw)
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _tenant_with(tmp_path: Path, change, name: str = "tenant-a.yaml") -> Path:
    raw = yaml.safe_load((EXAMPLES / name).read_text())
    change(raw)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def test_examples_load() -> None:
    pool = load_pool(POOL)
    for name in ("tenant-a.yaml", "tenant-b.yaml", "tenant-c.yaml"):
        cfg = load_tenant(EXAMPLES / name, pool, POOL)
        assert cfg.pool is not None and pool.tenant(cfg.pool.tenant) is not None
    shape = pool_shape(pool)
    assert [t.weight for t in shape.tenants] == [2.0, 1.0, 1.0]
    assert shape.tenants[1].floor_nodes == (("g-1t", 1),)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["tenants"][0].update(weight=0), "tenants.0.weight: weight must be > 0"),
        (lambda r: r["tenants"][1].update(name="tenant-a"), "duplicate tenant name 'tenant-a'"),
        (lambda r: r["groups"][1].update(model="paper-1t"), "groups.1.model"),
        (lambda r: r["groups"][0].update(model="no-such-model"), "groups.0.model"),
        (lambda r: r["tenants"][0].update(floor={"g-x": 1}), "tenants.0.floor: unknown group"),
        (lambda r: r["tenants"][0]["keys"][0].update(file="k"), "exactly one of env or file"),
        (lambda r: r["tenants"][1]["keys"].append({"id": "x", "env": "X"}), "tenants.1.keys"),
        (
            lambda r: r["front_door"].update(tls={"cert": "nope.pem", "key": "nope.key"}),
            "front_door.tls.cert: file 'nope.pem' does not exist",
        ),
        (
            lambda r: r["tenants"][2].update(receivers_tls={"ca": "ca.pem"}),
            "tenants.2.receivers_tls.ca: file 'ca.pem' does not exist",
        ),
        (lambda r: r["groups"][0].update(notice_s=0), "groups.0.notice_s: notice_s must be > 0"),
        (lambda r: r["groups"][1].update(processes="each"), "groups.1.processes"),
        (
            lambda r: r["groups"][0].update(processes="per_node", nodes=[{"name": "g-qwen"}]),
            "groups.0.nodes: node 'g-qwen' has a group's name",
        ),
    ],
)
def test_bad_pool_files_name_the_field(tmp_path: Path, change, message: str) -> None:
    with pytest.raises(UsageError, match=message) as err:
        load_pool(_pool_with(tmp_path, change))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["pool"].update(tenant="tenant-z"), "pool.tenant: 'tenant-z' is not a tenant"),
        (lambda r: r["engine"].update(model="llama-3.1-70b"), "engine.model: 'llama-3.1-70b'"),
        (lambda r: r["engine"].update(block_tokens=256), "engine.block_tokens: 256 differs"),
        (lambda r: r["engine"].update(time_scale=0.2), "engine.time_scale"),
        (lambda r: r["pool"]["key"].update(id="b-2026-12"), "pool.key.id: 'b-2026-12'"),
        (lambda r: r["pool"]["link"].update(gbps=0), "pool.link.gbps"),
        (lambda r: r["pool"].update(ca="/nope/ca.pem"), "pool.ca: file '/nope/ca.pem' does not"),
        (
            lambda r: r["sites"].append(
                {"name": "pf", "kind": "prfaas", "nodes": [{"name": "pf0", "role": "prefill"}]}
            ),
            "names the pool instead of a prfaas site",
        ),
    ],
)
def test_bad_tenant_files_name_the_field(tmp_path: Path, change, message: str) -> None:
    pool = load_pool(POOL)
    with pytest.raises(UsageError, match=message) as err:
        load_tenant(_tenant_with(tmp_path, change), pool, POOL)
    assert "\n" not in str(err.value)


def test_key_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = load_pool(POOL)
    ref_a = pool.tenants[0].keys[0]
    with pytest.raises(UsageError, match="PRFAAS_POOL_KEY_A is not set"):
        resolve_key(ref_a, tmp_path, "tenants.0.keys.0")
    monkeypatch.setenv("PRFAAS_POOL_KEY_A", "a" * 32)
    assert resolve_key(ref_a, tmp_path, "tenants.0.keys.0") == b"a" * 32
    ref_file = pool.tenants[1].keys[1]
    with pytest.raises(UsageError, match=r"tenants\.1\.keys\.1\.file: cannot read"):
        resolve_key(ref_file, tmp_path, "tenants.1.keys.1")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "tenant-b-old.key").write_text("short\n")
    with pytest.raises(UsageError, match="shorter than 16 bytes"):
        resolve_key(ref_file, tmp_path, "tenants.1.keys.1")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prfaas.cli", "sim", *args],
                          capture_output=True, text=True, timeout=100)  # fmt: skip


def test_cli_pool_sim_has_a_tenants_object(tmp_path: Path) -> None:
    short = {"duration_s": 120}
    a = _tenant_with(tmp_path, lambda r: r["workload"].update(short), "tenant-a.yaml")
    b = _tenant_with(tmp_path, lambda r: r["workload"].update(short), "tenant-b.yaml")
    res = _cli(str(POOL), str(a), str(b), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["schema"] == "prfaas.sim.pool/1"
    assert set(out["tenants"]) == {"tenant-a", "tenant-b"}
    for t in out["tenants"].values():
        assert t["requests"]["completed"] == t["requests"]["arrived"] > 0
    bad = _tenant_with(tmp_path, lambda r: r["pool"].update(tenant="nobody"), "tenant-a.yaml")
    res = _cli(str(POOL), str(bad))
    assert res.returncode == 2
    assert "pool.tenant: 'nobody' is not a tenant" in res.stderr
    assert "Traceback" not in res.stderr
    res = _cli(str(POOL), str(a), "--rate", "3")
    assert res.returncode == 2 and "--rate does not apply to a pool simulation" in res.stderr


def test_a_tenant_replays_its_own_trace(tmp_path: Path) -> None:
    from prfaas.commands.sim_pool import build_pool_scenario
    from prfaas.sim.pool_report import pool_summary
    from prfaas.sim.pool_sim import PoolSimulator

    lines = [
        json.dumps({"timestamp": 500 * i, "input_length": 30000 + 1000 * i, "output_length": 10,
                    "hash_ids": []})
        for i in range(40)
    ]  # fmt: skip
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")

    def use_trace(raw: dict) -> None:
        raw["workload"] = {"trace": "trace.jsonl", "duration_s": 600, "seed": 1}

    a = _tenant_with(tmp_path, use_trace, "tenant-a.yaml")
    sc = build_pool_scenario(POOL, [a])
    assert sc.tenants[0].trace is not None and len(sc.tenants[0].trace) == 40
    sim = PoolSimulator(sc)
    sim.run()
    out = pool_summary(sim)["tenants"]["tenant-a"]
    assert out["requests"]["arrived"] == out["requests"]["completed"] == 40


def test_a_traces_shared_prefixes_hit_at_the_pool_from_the_files(tmp_path: Path) -> None:
    """The trace's ``hash_ids`` are its prompts' blocks at the pool's stores (512-token blocks,
    the pool's), the quotas the pool file's shares: a's turns of one conversation hit."""
    from prfaas.commands.sim_pool import build_pool_scenario
    from prfaas.sim.pool_report import pool_summary
    from prfaas.sim.pool_sim import PoolSimulator

    lines = [
        json.dumps({"timestamp": 20_000 * i, "input_length": 16 * 512 * (i + 1) + 10,
                    "output_length": 10, "hash_ids": list(range(16 * (i + 1) + 1))})
        for i in range(3)
    ]  # fmt: skip
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")

    def use_trace(raw: dict) -> None:
        raw["workload"] = {"trace": "trace.jsonl", "duration_s": 600, "seed": 1}
        raw["policy"] = {"router": "threshold", "threshold_tokens": 0}
        raw["pool"]["tuner"] = "fixed"

    a = _tenant_with(tmp_path, use_trace, "tenant-a.yaml")
    sc = build_pool_scenario(POOL, [a])
    assert sc.tenants[0].trace_block_hashes is not None
    assert sc.shares == load_pool(POOL).prefix_shares() and not sc.share_prefixes
    sim = PoolSimulator(sc)
    sim.run()
    out = pool_summary(sim)["tenants"]["tenant-a"]
    assert out["requests"]["offloaded"] == 3
    # Each turn finds the one before it whole (its 16 x i blocks).
    assert out["pool_prefixes"]["hit_tokens"] == 16 * 512 * (1 + 2)


def test_a_vllm_group_is_refused_live_naming_the_field(tmp_path: Path) -> None:
    from prfaas.pool.launcher import PoolLauncher

    def to_vllm(r: dict) -> None:
        r["groups"][1].update(kind="vllm", model_path=str(tmp_path))

    path = _pool_with(tmp_path, to_vllm)
    with pytest.raises(UsageError, match=r"groups\.1\.kind: 'vllm' pool nodes do not run live"):
        PoolLauncher(load_pool(path), path, tmp_path / "wd")


def test_a_preemptible_group_runs_a_process_per_node_unless_it_says(tmp_path: Path) -> None:
    """``notice_s`` makes a group preemptible; its nodes then run one process each by default (a
    notice to a shared process would drain the whole group); ``processes`` says otherwise."""
    from prfaas.pool.launcher import node_group_args, node_processes

    pool = load_pool(_pool_with(tmp_path, lambda r: r["groups"][0].update(notice_s=1.5)))
    g, q = pool.groups
    assert (g.notice_s, g.per_node_processes, q.per_node_processes) == (1.5, True, False)
    assert node_processes(pool) == [
        ("pool-0", "g-1t", "pool-0"), ("pool-1", "g-1t", "pool-1"),
        ("pool-2", "g-1t", "pool-2"), ("pool-3", "g-1t", "pool-3"), ("g-qwen", "g-qwen", None),
    ]  # fmt: skip
    assert node_group_args(Path("/wd"), "g-1t", node="pool-1")[-2:] == ["--node", "pool-1"]
    assert node_group_args(Path("/wd"), "g-1t", "10.0.0.5") == [
        "-m", "prfaas.pool.node_main", "/wd", "g-1t", "10.0.0.5"
    ]  # fmt: skip

    def shared_notice(r: dict) -> None:
        r["groups"][0].update(notice_s=1.5, processes="shared")
        r["groups"][1].update(processes="per_node")

    pool = load_pool(_pool_with(tmp_path, shared_notice))
    assert [(n, node) for n, _, node in node_processes(pool)] == [
        ("g-1t", None), ("g-qwen-0", "g-qwen-0"), ("g-qwen-1", "g-qwen-1")
    ]  # fmt: skip


def test_a_node_of_its_own_runs_from_a_one_node_file(tmp_path: Path) -> None:
    """The launcher writes each per-node process a one-node file (``nodes-GROUP+NODE.yaml``),
    the idea the Kubernetes pods already use, and the node process reads it by ``--node``."""
    from prfaas.config import load_deployment
    from prfaas.pool.launcher import PoolLauncher
    from prfaas.pool.resolved import nodes_name

    def preemptible(r: dict) -> None:
        r["groups"][0].update(notice_s=2.0, nodes=[{"name": "pool-0", "port": 9400},
                                                   {"name": "pool-1"}])  # fmt: skip

    path = _pool_with(tmp_path, preemptible)
    launcher = PoolLauncher(load_pool(path), path, tmp_path / "wd")
    launcher.workdir.mkdir()
    launcher._write_files()
    files = sorted(p.name for p in launcher.workdir.glob("nodes-*.yaml"))
    assert files == ["nodes-g-1t+pool-0.yaml", "nodes-g-1t+pool-1.yaml", "nodes-g-qwen.yaml"]
    d = load_deployment(launcher.workdir / nodes_name("g-1t", "pool-0"))
    site = next(s for s in d.sites if s.name == "g-1t")
    assert [(n.name, n.port) for n in site.nodes] == [("pool-0", 9400)]
    shared = load_deployment(launcher.workdir / nodes_name("g-qwen"))
    qwen = next(s for s in shared.sites if s.name == "g-qwen")
    assert [n.name for n in qwen.nodes] == ["g-qwen-0", "g-qwen-1"]


def test_up_refuses_a_pool_or_tenant_in_the_clear_beyond_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TLS by default: a front door beyond loopback without ``front_door.tls`` (or a tenant
    without ``receivers_tls``), or a tenant whose ``pool.url`` is http:// to another machine, is
    refused by ``prfaas up`` before anything starts (exit 2, naming the field), unless the file
    says ``allow_plaintext``; on loopback (the examples) nothing changes."""
    from prfaas.cli import main
    from prfaas.pool_file import plaintext_warnings

    for k in "ABC":
        monkeypatch.setenv(f"PRFAAS_POOL_KEY_{k}", f"tenant-{k}-secret-0123456789abcdef")
    assert plaintext_warnings(load_pool(POOL)) == []  # the example listens on loopback
    wide = _pool_with(tmp_path, lambda r: r["front_door"].update(host="0.0.0.0"))
    assert main(["up", str(wide)]) == 2
    err = capsys.readouterr().err
    assert "front_door.tls is not set" in err and "front_door.allow_plaintext" in err, err
    assert "3 more in the clear" in err and "Traceback" not in err
    said = [w.split(" is not set")[0] for w in plaintext_warnings(load_pool(wide))]
    assert said == ["front_door.tls", *(f"tenants.{i}.receivers_tls" for i in range(3))]

    far = _tenant_with(tmp_path, lambda r: r["pool"].update(url="http://10.1.2.3:8100"))
    assert main(["up", str(far)]) == 2
    err = capsys.readouterr().err
    assert "pool.url: http://10.1.2.3:8100 is plain HTTP" in err and "Traceback" not in err
    from prfaas.config import load_deployment
    from prfaas.pool_file import tenant_in_clear

    allowed = load_deployment(far).pool
    assert allowed is not None and tenant_in_clear(allowed) is not None
    allowed = allowed.model_copy(update={"allow_plaintext": True})
    assert tenant_in_clear(allowed) is None  # said knowingly: a trusted network
    https = allowed.model_copy(update={"url": "https://10.1.2.3:8100", "allow_plaintext": False})
    assert tenant_in_clear(https) is None


def test_a_groups_cpus_reads_as_a_deployments_engine_cpus(tmp_path: Path) -> None:
    """``groups[].cpus``: the deployment's pattern and message (one validator), carried into the
    group's node files as ``engine.cpus``, so its node processes pin themselves as a site's do."""
    from prfaas.config import load_deployment
    from prfaas.pool.nodes_file import group_deployment, one_node_deployment

    pool = load_pool(_pool_with(tmp_path, lambda r: r["groups"][1].update(cpus="0,2-3")))
    g = pool.groups[1]
    assert g.cpus == "0,2-3" and pool.groups[0].cpus is None
    assert group_deployment(pool, g, "k" * 24).cores_of_site(g.name) == frozenset({0, 2, 3})
    one = one_node_deployment(pool, g, g.node_names[0], "k" * 24)
    assert one.cores_of_site(g.name) == frozenset({0, 2, 3})
    assert group_deployment(pool, pool.groups[0], "k" * 24).cores_of_site("g-1t") is None

    bad = _pool_with(tmp_path, lambda r: r["groups"][1].update(cpus="0-"))
    with pytest.raises(UsageError, match=r"pool\.yaml: groups\.1\.cpus: ") as pooled:
        load_pool(bad)
    deployment = yaml.safe_load((EXAMPLES.parent / "two-site.yaml").read_text())
    deployment["engine"]["cpus"] = "0-"
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(deployment))
    with pytest.raises(UsageError, match=r"engine\.cpus: ") as deployed:
        load_deployment(tmp_path / "d.yaml")
    assert str(pooled.value).split("cpus: ", 1)[1] == str(deployed.value).split("cpus: ", 1)[1]


def test_a_pool_node_on_cores_the_host_lacks_is_a_usage_error_naming_the_group(
    tmp_path: Path,
) -> None:
    """As a deployment's node process (``serve.run.pin_process``); no ``cpus``: left alone."""
    import os

    from prfaas.pool.node_main import pin_to_group_cores
    from prfaas.pool.nodes_file import group_deployment

    pool = load_pool(_pool_with(tmp_path, lambda r: r["groups"][1].update(cpus="4096")))
    before = os.sched_getaffinity(0)
    pin_to_group_cores(group_deployment(pool, pool.groups[0], "k" * 24), pool, "g-1t")
    assert os.sched_getaffinity(0) == before
    d = group_deployment(pool, pool.groups[1], "k" * 24)
    with pytest.raises(UsageError, match=r"groups\.1\.cpus: cannot run on cores \[4096\]"):
        pin_to_group_cores(d, pool, "g-qwen")
    assert os.sched_getaffinity(0) == before


def test_up_refuses_a_pool_group_whose_model_folder_is_not_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As for a deployment's sites (``test_config.py``): named before anything starts, not
    left to Hugging Face's loader, which takes the path for a Hub repository."""
    from prfaas.cli import main

    def torch_group(raw: dict) -> None:
        raw["groups"][0].update(kind="torch", model_path=str(tmp_path / "no-such-model"))

    assert main(["up", str(_pool_with(tmp_path, torch_group))]) == 2
    err = capsys.readouterr().err
    assert f"groups.0.model_path: {str(tmp_path / 'no-such-model')!r} is not a folder here" in err
    assert "Traceback" not in err
