"""One deployment file for `prfaas up`, `prfaas sim` and `prfaas plan`: every shipped example
loads and derives valid scenarios; the demo's files simulate and plan exactly as the built-in
case study does; flags override a file only when given; the file's new sections (counts,
per-site engines, several PD sites, prices, workload, simulation) validate and name bad values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas.cli import main
from prfaas.config import DeploymentConfig, load_deployment
from prfaas.errors import UsageError
from prfaas.scenarios import plan_scenario, sim_scenario

pytestmark = pytest.mark.timeout(120)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def write(tmp_path: Path, raw: dict[str, Any], name: str = "d.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_derives_valid_scenarios(path: Path) -> None:
    d = load_deployment(path)
    sim_scenario(d).validate()
    assert plan_scenario(d).n_local >= 2


def test_demo_file_simulates_exactly_like_the_built_in_case_study(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from_file = run_json(
        ["sim", str(EXAMPLES / "paper-prfaas-pd.yaml"), "--duration", "120", "--json"], capsys
    )
    built_in = run_json(
        ["sim", "--deployment", "paper-prfaas", "--rate", "2.6", "--rtt-ms", "0",
         "--duration", "120", "--json"],
        capsys,
    )  # fmt: skip
    from_file.pop("scenario")
    scenario = built_in.pop("scenario")
    assert from_file["money"].pop("prices") == "file"  # the file's prices equal the assumption
    assert built_in["money"].pop("prices") == "assumption"
    assert scenario["tune"] is None  # the only difference: the file turns tuning off explicitly,
    assert scenario["policy"] == "threshold"  # which the threshold router never does anyway
    assert from_file == built_in


def test_demo_file_plans_exactly_like_the_default_case_study(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from_file = run_json(
        ["plan", "--deployment", str(EXAMPLES / "paper-prfaas-pd.yaml"), "--json", "--no-capacity"],
        capsys,
    )
    built_in = run_json(["plan", "--json"], capsys)
    money_file, money_assumed = from_file.pop("money"), built_in.pop("money")
    assert from_file == built_in  # the file's prices keep the default price ratio 2
    for name in ("prfaas", "homogeneous", "naive"):  # and equal the stated assumption
        assert money_file[name].pop("prices") == "file"
        assert money_assumed[name].pop("prices") == "assumption"
        assert money_file[name] == money_assumed[name]


def test_flags_override_the_file_only_when_given(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "paper-prfaas-pd.yaml")
    base = run_json(["sim", path, "--duration", "30", "--json"], capsys)["scenario"]
    changed = run_json(
        ["sim", path, "--duration", "30", "--rate", "1.5", "--link-gbps", "40", "--json"], capsys
    )["scenario"]
    assert base["arrival"]["rate_rps"] == 2.6 and changed["arrival"]["rate_rps"] == 1.5
    assert changed["links"][0]["gbps"] == 40.0
    assert changed["links"][0]["rtt_ms"] == base["links"][0]["rtt_ms"] == 0.0  # not given: kept
    assert changed["output_tokens"] == base["output_tokens"] == 1024
    plan = run_json(
        ["plan", "--deployment", path, "--link-gbps", "40", "--json", "--no-capacity"], capsys
    )
    assert plan["scenario"]["link_gbps"] == 40.0 and plan["scenario"]["price_ratio"] == 2.0
    assert plan["naive"]["n_prfaas"] == 4  # from the file


def test_a_file_without_a_rate_runs_at_80_percent_of_its_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(["sim", str(EXAMPLES / "two-site.yaml"), "--duration", "30", "--json"], capsys)
    rate = out["scenario"]["arrival"]["rate_rps"]
    assert 0.1 < rate < 2.0  # 1 PrfaaS + 1 P / 2 D instances: well below the case study's 2.6


def test_counts_stand_for_named_nodes() -> None:
    d = load_deployment(EXAMPLES / "paper-homogeneous.yaml")
    names = [n.name for n in d.home_site.nodes]
    assert names[:2] == ["pd-p0", "pd-p1"] and names[-1] == "pd-d2" and len(names) == 12


def base_raw() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "two-site.yaml").read_text())


def test_several_pd_sites_simulate_but_do_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = base_raw()
    raw["sites"].append({"name": "pd2", "kind": "pd", "hardware": "h20",
                         "prefill_nodes": 1, "decode_nodes": 1})  # fmt: skip
    raw["links"].append({"src": "prfaas", "dst": "pd2", "gbps": 50})
    path = write(tmp_path, raw)
    d = load_deployment(path)
    assert [s.name for s in d.pd_sites] == ["pd", "pd2"] and d.home_site.name == "pd"
    out = run_json(["sim", str(path), "--duration", "20", "--rate", "0.5", "--json"], capsys)
    assert set(out["sites"]) == {"prfaas", "pd", "pd2"}
    with pytest.raises(UsageError, match="2 PD sites"):
        d.require_one_pd_site()
    assert main(["up", str(path)]) == 2
    assert "2 PD sites" in capsys.readouterr().err


def test_site_engine_overrides_the_top_level_engine(tmp_path: Path) -> None:
    raw = base_raw()
    raw["sites"][0]["engine"] = {"token_chunk": 4}
    d = DeploymentConfig.model_validate(raw)
    assert d.engine_for("prfaas").token_chunk == 4
    assert d.engine_for("pd").token_chunk == d.engine.token_chunk == 32
    raw["sites"][0]["engine"] = {"kind": "torch"}
    with pytest.raises(ValueError, match="site prfaas: engine kind 'torch' needs model_path"):
        DeploymentConfig.model_validate(raw)
    raw["sites"][0]["engine"] = {"time_scale": 2}  # units are deployment-wide
    with pytest.raises(ValueError, match="time_scale"):
        DeploymentConfig.model_validate(raw)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.update(prices={"h20": 0}), "prices.h20 must be > 0"),
        (lambda r: r.update(workload={"arrival": {"kind": "bursty"}}), "workload.arrival.kind"),
        (lambda r: r.update(workload={"lengths": {"min_tokens": 9, "max_tokens": 3}}),
         "min_tokens (9) must be <= max_tokens (3)"),
        (lambda r: r.update(simulation={"decode_kv_fraction": 2}), "decode_kv_fraction"),
        (lambda r: r["sites"][0].update(prefill_nodes=-1), "prefill_nodes must be a whole"),
        (lambda r: r["sites"][0].update(hardware="nope.yaml"), "does not exist"),
        (lambda r: r["links"][0].update(schedule=[[10, -1]]), "must be >= 0"),
    ],
)  # fmt: skip
def test_bad_sections_name_the_field(tmp_path: Path, change: Any, message: str) -> None:
    raw = base_raw()
    change(raw)
    with pytest.raises(UsageError) as exc_info:
        load_deployment(write(tmp_path, raw))
    assert message in str(exc_info.value)


def test_profile_file_hardware_is_found_next_to_the_deployment_file_and_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prfaas.scenarios import planned_threshold

    assert main(["profile", "--preset", "paper-1t@h20", "-o", str(tmp_path / "h20.yaml")]) == 0
    raw = base_raw()
    raw["sites"][1]["hardware"] = "h20.yaml"
    d = load_deployment(write(tmp_path, raw))
    assert d.home_site.hardware == str((tmp_path / "h20.yaml").resolve())
    # The live gateway's starting t comes from the file's profile: the same curve, the same t.
    assert planned_threshold(d) == planned_threshold(load_deployment(EXAMPLES / "two-site.yaml"))
    (tmp_path / "h20.yaml").write_text("version: 99\n")
    with pytest.raises(UsageError, match="site pd: hardware"):
        load_deployment(write(tmp_path, raw))


def test_plan_of_a_file_whose_hardware_are_profile_files_equals_the_presets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for preset in ("paper-1t@h20", "paper-1t@h200"):
        assert main(["profile", "--preset", preset, "-o", str(tmp_path / f"{preset}.yaml")]) == 0
    capsys.readouterr()
    raw = yaml.safe_load((EXAMPLES / "paper-prfaas-pd.yaml").read_text())
    raw["sites"][0]["hardware"] = "paper-1t@h20.yaml"  # next to the deployment file
    raw["sites"][1]["hardware"] = "paper-1t@h200.yaml"
    raw["prices"] = {}
    path = write(tmp_path, raw)
    from_profiles = run_json(["plan", "--deployment", str(path), "--json", "--no-capacity"], capsys)
    from_presets = run_json(["plan", "--json"], capsys)
    assert from_profiles["sources"] != from_presets["sources"]  # says where timing came from
    for key in ("prfaas", "homogeneous", "naive", "ratios", "decode"):
        assert from_profiles[key] == from_presets[key], key
    # The simulator reads the same profiles: the same run as with the presets.
    sim_profiles = run_json(["sim", str(path), "--duration", "60", "--json"], capsys)
    sim_presets = run_json(
        ["sim", str(EXAMPLES / "paper-prfaas-pd.yaml"), "--duration", "60", "--json"], capsys
    )
    sim_profiles.pop("scenario"), sim_presets.pop("scenario")
    assert sim_profiles["money"].pop("prices") == "assumption"  # this file names no prices
    assert sim_presets["money"].pop("prices") == "file"  # equal to the assumption
    assert sim_profiles == sim_presets


def test_paper_only_flags_with_a_file_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "two-site.yaml")
    assert main(["sim", path, "--n-p", "3"]) == 2
    assert "--n-p/--n-d" in capsys.readouterr().err
    assert main(["sim", path, "--pd-sites", "2"]) == 2
    assert main(["sim", path, "--config", path]) == 2


def test_torch_engine_settings_come_from_the_file(tmp_path: Path) -> None:
    from prfaas.serve.node.engines import prefix_store_bytes

    raw = base_raw()
    raw["engine"] = {"kind": "torch", "model": "tiny", "model_path": str(tmp_path),
                     "threads": 2, "kv_budget_mib": 64, "prefix_store_mib": 8}  # fmt: skip
    raw["sites"][0]["engine"] = {"device": "cuda:1", "prefill_chunk_tokens": 256}
    d = DeploymentConfig.model_validate(raw)
    remote, home = d.engine_for("prfaas"), d.engine_for("pd")
    assert (remote.device, remote.prefill_chunk_tokens, remote.threads) == ("cuda:1", 256, 2)
    assert (home.device, home.prefill_chunk_tokens, home.kv_budget_mib) == ("cpu", 512, 64)
    assert prefix_store_bytes(home, "h20") == 8 << 20
    raw["engine"]["device"] = "gpu0"
    with pytest.raises(ValueError, match="device"):
        DeploymentConfig.model_validate(raw)


def test_a_relative_trace_is_read_beside_the_file_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a profile file is: ``prfaas plan`` and ``prfaas sim`` of one file read one trace,
    whatever folder they run in; a path that is not beside the file stays as written."""
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "t.jsonl").write_text('{"timestamp": 0, "input_length": 100, "output_length": 4}\n')
    doc = yaml.safe_load((EXAMPLES / "two-site.yaml").read_text())
    doc["workload"] = {"trace": "t.jsonl"}
    (folder / "d.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    assert load_deployment(folder / "d.yaml").workload.trace == str(folder / "t.jsonl")
    doc["workload"] = {"trace": "elsewhere.jsonl"}
    (folder / "d.yaml").write_text(yaml.safe_dump(doc))
    assert load_deployment(folder / "d.yaml").workload.trace == "elsewhere.jsonl"
