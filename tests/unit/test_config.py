"""Deployment files: validation names the bad field; `prfaas up`/`serve` turn it into exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prfaas.cli import main
from prfaas.config import load_deployment
from prfaas.errors import UsageError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two-site.yaml"


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_the_example_deployment_loads() -> None:
    d = load_deployment(EXAMPLE)
    assert d.home_site.name == "pd" and d.link_to_home("prfaas") is not None
    assert d.node("pf0").role == "prefill" and d.site_of("d1").kind == "pd"


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["sites"][0]["nodes"].append({"name": "x", "role": "decode"}),
         "PrfaaS site: prefill nodes only"),
        (lambda d: d["links"].clear(), "PrfaaS site prfaas has no link to pd"),
        (lambda d: d["links"][0].update(gbps=0), "links.0.gbps"),
        (lambda d: d["engine"].update(kind="torch"), "needs model_path"),
        (lambda d: d.update(surprise=1), "surprise"),
        (lambda d: d["sites"][1]["nodes"].__setitem__(1, {"name": "p0", "role": "decode"}),
         "duplicate node names"),
        (lambda d: d.update(psk="short"), "psk"),
        (lambda d: d["engine"].update(cpus="0-"), "engine.cpus"),
        (lambda d: d["sites"][1].update(engine={"cpus": "auto"}), "sites.1.engine.cpus"),
    ],
)  # fmt: skip
def test_bad_deployments_name_the_field(tmp_path: Path, mutate: object, needle: str) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(UsageError, match=needle.replace(".", r"\.")):
        load_deployment(_write(tmp_path, data))


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_deployment(tmp_path / "missing.yaml")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_deployment(_write(tmp_path, "sites: [unclosed"))
    with pytest.raises(UsageError, match="mapping at the top level"):
        load_deployment(_write(tmp_path, "- a\n- b\n"))


def test_cli_exit_2_for_bad_deployments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve", "--role", "prefill", "--config", str(EXAMPLE)]) == 2
    assert "needs at least one --node" in capsys.readouterr().err
    assert main(["serve", "--role", "decode", "--config", str(EXAMPLE), "--node", "pf0"]) == 2
    assert "has role prefill, not decode" in capsys.readouterr().err
    assert main(["demo", "--requests", "0"]) == 2
    assert "--requests must be > 0" in capsys.readouterr().err


def test_a_sites_cores_come_from_engine_cpus_or_vllm_cpu_bind(tmp_path: Path) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["engine"]["cpus"] = "0-1"
    data["sites"][1]["engine"] = {"cpus": "3,5-6"}
    d = load_deployment(_write(tmp_path, data))
    assert d.cores_of_site("prfaas") == frozenset({0, 1})
    assert d.cores_of_site("pd") == frozenset({3, 5, 6})
    del data["engine"]["cpus"], data["sites"][1]["engine"]
    assert load_deployment(_write(tmp_path, data)).cores_of_site("pd") is None


def test_a_node_process_on_cores_the_host_lacks_is_a_usage_error() -> None:
    from prfaas.serve.run import pin_process

    with pytest.raises(
        UsageError, match=r"sites\[pd\]\.engine\.cpus: cannot run on cores \[4096\]"
    ):
        pin_process(frozenset({4096}), "sites[pd].engine.cpus")


def test_the_gateway_is_charged_to_the_site_whose_cores_hold_its_own(tmp_path: Path) -> None:
    """``gateway.cpus`` within a torch site's ``engine.cpus``: the simulator takes the gateway's
    CPU from that site's cores; across two sites' cores, or unpinned: a core of its own."""
    from prfaas.scenarios import sim_scenario

    data = yaml.safe_load(EXAMPLE.read_text())
    data["engine"] = {"kind": "torch", "model": "paper-1t", "model_path": "/m", "cpus": "0"}
    data["sites"][0]["engine"] = {"cpus": "1"}

    def hosts(cpus: str | None) -> dict[str, bool]:
        data["gateway"]["cpus"] = cpus
        sc = sim_scenario(load_deployment(_write(tmp_path, data)))
        return {s.name: s.hosts_gateway for s in sc.sites}

    assert hosts("1") == {"prfaas": True, "pd": False}
    from prfaas.capacity import left_out_by_eqs

    d = load_deployment(_write(tmp_path, data))
    assert any("gateway on site prfaas's cores" in x for x in left_out_by_eqs(d, sim_scenario(d)))
    assert hosts("0") == {"prfaas": False, "pd": True}
    assert hosts("0-1") == hosts(None) == {"prfaas": False, "pd": False}
    data["gateway"]["cpus"] = "one"
    with pytest.raises(UsageError, match=r"gateway\.cpus"):
        load_deployment(_write(tmp_path, data))


def test_up_refuses_cores_this_host_lacks_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["gateway"]["cpus"] = "4096"
    assert main(["up", str(_write(tmp_path, data)), "--workdir", str(tmp_path / "w")]) == 2
    assert "gateway.cpus: cores [4096] are not among this host's" in capsys.readouterr().err
    del data["gateway"]["cpus"]
    data["sites"][1]["engine"] = {"cpus": "0,4095"}
    assert main(["up", str(_write(tmp_path, data)), "--workdir", str(tmp_path / "w")]) == 2
    assert "sites[pd]'s cores: cores [4095]" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_up_and_serve_refuse_a_model_folder_that_is_not_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not left to Hugging Face's loader, which takes a missing folder for a Hub repository and
    spends ~45 s failing to download it; the file still loads (k8s and sim read files written
    for other hosts)."""
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load(EXAMPLE.read_text())
    data["engine"].update(kind="torch", model_path="tiny-model")
    path = _write(tmp_path, data)
    load_deployment(path)  # reading it is fine
    assert main(["up", str(path), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    said = "engine.model_path: 'tiny-model' is not a folder here (a relative path is read from"
    assert f"{said} {tmp_path})" in err
    assert not (tmp_path / "w").exists()  # refused before anything started
    (tmp_path / "tiny-model").mkdir()
    data["sites"][0]["engine"] = {"model_path": str(tmp_path / "tiny-model")}
    data["engine"]["model_path"] = str(tmp_path)  # the PD site's: a folder, no config.json
    data["psk"] = "a-secret-of-at-least-16-chars"
    path = _write(tmp_path, data)
    assert main(["serve", "--role", "prefill", "--config", str(path), "--node", "pf0"]) == 2
    assert "sites[prfaas].engine.model_path: " in capsys.readouterr().err
    assert main(["serve", "--role", "gateway", "--config", str(path)]) == 2
    assert f"engine.model_path: {str(tmp_path)!r} has no config.json" in capsys.readouterr().err
