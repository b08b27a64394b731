"""``prfaas profile --plumbing-of FILE``: which files it measures (a vLLM site's, with a profile
file), the one-site deployment it launches, and the measurement itself run through a real
gateway and node process. The measurement is engine-agnostic past the file check (process CPU
of the gateway and the site's node process, steps from the nodes' reports), so it is run here on
an emulated site (timed nodes, seconds); the vLLM sidecar's step count it reads is covered by
``tests/unit/test_vllm_metrics.py`` and ``tests/e2e/test_vllm_live.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from prfaas.cli import main
from prfaas.commands.profile_deployment import MISSING, Target, measure, one_site_deployment
from prfaas.perf.plumbing import PLUMBING_TERMS


def _files(tmp_path: Path, engine: dict[str, object], name: str = "deploy.yaml") -> Path:
    """A two-site deployment file whose PD site names a profile file (the shipped H20's)."""
    assert main(["profile", "--preset", "paper-1t@h20", "-o", str(tmp_path / "pd.yaml")]) == 0
    (tmp_path / "model").mkdir(exist_ok=True)
    d = {
        "engine": engine,
        "gateway": {"port": 8123, "cpus": "0", "api_keys": ["k" * 20]},
        "policy": {"router": "prfaas", "threshold_tokens": 4096},
        "sites": [
            {"name": "pf", "kind": "prfaas", "hardware": "h200",
             "nodes": [{"name": "pf0", "role": "prefill"}]},
            {"name": "pd", "kind": "pd", "hardware": "pd.yaml",
             "engine": {"vllm": {"cpu_bind": "0"}} if engine["kind"] == "vllm" else {},
             "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]},
        ],
        "links": [{"src": "pf", "dst": "pd", "gbps": 10}],
        "psk": "p" * 32,
    }  # fmt: skip
    path = tmp_path / name
    path.write_text(yaml.safe_dump(d), encoding="utf-8")
    return path


VLLM = {"kind": "vllm", "model": "tiny", "model_path": "model"}


@pytest.mark.timeout(60)
def test_the_home_pd_site_alone_is_what_it_launches(tmp_path: Path) -> None:
    target = one_site_deployment(_files(tmp_path, VLLM))
    d = yaml.safe_load(target.text)
    assert target.site == "pd" and target.profile == (tmp_path / "pd.yaml").resolve()
    assert [s["name"] for s in d["sites"]] == ["pd"] and "links" not in d
    assert d["sites"][0]["hardware"] == str(target.profile)  # absolute: the file moves
    assert d["sites"][0]["engine"] == {"vllm": {"cpu_bind": "0"}}
    assert d["policy"]["router"] == "local_only"
    # The gateway keeps its cores, not its port or keys (the requests carry none).
    assert d["gateway"] == {"cpus": "0", "port": 0, "control_port": 0, "request_timeout_s": 600}
    assert d["engine"] == VLLM and d["psk"] != "p" * 32


@pytest.mark.timeout(60)
def test_files_it_cannot_measure_exit_2_naming_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    timed = _files(tmp_path, {"kind": "timed", "model": "paper-1t"}, "timed.yaml")
    preset = tmp_path / "preset.yaml"
    data = yaml.safe_load(_files(tmp_path, VLLM).read_text())
    data["sites"][1]["hardware"] = "h20"
    preset.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = str(tmp_path / "out.yaml")
    cases = [
        (timed, "runs engine kind 'timed'"),
        (preset, "hardware 'h20' is a preset, not a profile file"),
        (tmp_path / "none.yaml", "no deployment file"),
    ]
    for path, message in cases:
        assert main(["profile", "--plumbing-of", str(path), "-o", out]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
    argv = ["profile", "--plumbing-of", str(timed), "-o", out, "--plumbing-requests", "1"]
    assert main(argv) == 2
    assert "--plumbing-requests must be >= 2" in capsys.readouterr().err
    assert not Path(out).exists()  # nothing half-written


@pytest.mark.timeout(120)
def test_the_measurement_through_a_live_gateway_and_node_process(tmp_path: Path) -> None:
    """Every term it stores is a figure of this run (the gateway's CPU per request is never 0),
    the per-step terms split from a batched class whose steps the decode node reported, and
    what it cannot see is named missing."""
    timed = yaml.safe_load(_files(tmp_path, {"kind": "timed", "model": "paper-1t"}).read_text())
    timed["engine"]["time_scale"] = 0.05
    timed["sites"] = timed["sites"][1:]
    timed["sites"][0]["hardware"] = str(tmp_path / "pd.yaml")
    timed.update(policy={"router": "local_only"}, links=[],
                 gateway={"port": 0, "control_port": 0})  # fmt: skip
    target = Target(yaml.safe_dump(timed), tmp_path / "pd.yaml", "pd")
    costs, how = measure(target, tmp_path / "work", requests=4, seed=3)
    assert costs.gateway_per_request_s > 0
    assert set(costs.missing) == set(MISSING)  # both per-step terms split
    described = dict(how)
    assert set(described) == set(PLUMBING_TERMS) - set(MISSING)
    assert "steps" in described["gateway_per_step_s"]
    assert "the sidecar (not its server)" in described["decode_per_step_s"]
    # The deployment it launched is stopped, every process of it.
    processes = json.loads((tmp_path / "work" / "plumbing-run" / "processes.json").read_text())
    assert processes["stopped"] is True and processes["processes"]
    work = str(tmp_path / "work").encode()
    alive = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if work in cmdline.read_bytes():
                alive.append(cmdline.parent.name)
        except OSError:
            continue  # gone since the listing
    assert not alive


@pytest.mark.timeout(90)
def test_a_deployment_that_does_not_start_says_why_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its logs are in a scratch folder removed on the way out: the error its log ended with is
    in the message, not a pointer to a log that is gone (an empty model folder: no tokenizer)."""
    from prfaas.commands.plumbing_classes import launch_failure

    out = tmp_path / "out.yaml"
    empty = {**VLLM, "model_path": str(tmp_path / "model")}  # a folder, with nothing in it
    assert main(["profile", "--plumbing-of", str(_files(tmp_path, empty)), "-o", str(out)]) == 2
    err = capsys.readouterr().err  # refused before anything starts (commands.up)
    assert "engine.model_path: " in err and "has no config.json" in err, err
    (tmp_path / "model" / "config.json").write_text("{}")  # a config; still no tokenizer
    assert main(["profile", "--plumbing-of", str(_files(tmp_path, empty)), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the deployment did not start (process gateway exit status 1 during start-up: " in err
    assert "Error: " in err and "(log " not in err, err
    assert not out.exists()
    tail = ("process p0 exit status 1 during start-up (log /x/p0.log):\n  File \"a.py\", line 1\n"
            "    raise OSError('no')\nOSError: no model here\n  some later line")  # fmt: skip
    assert launch_failure(RuntimeError(tail)) == (
        "process p0 exit status 1 during start-up: OSError: no model here"
    )
    assert launch_failure(RuntimeError("")) == "RuntimeError"


# -- --remote-path: what an offloaded request pays beyond the other terms ----------------------
def _two_profiles(tmp_path: Path, engine: dict[str, object]) -> Path:
    """``_files`` with the PrfaaS site's hardware a profile file too (the shipped H200's)."""
    path = _files(tmp_path, engine)
    assert main(["profile", "--preset", "paper-1t@h200", "-o", str(tmp_path / "pf.yaml")]) == 0
    data = yaml.safe_load(path.read_text())
    data["sites"][0]["hardware"] = "pf.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.timeout(60)
def test_the_remote_path_launches_the_prfaas_site_and_its_home_offloading_all(
    tmp_path: Path,
) -> None:
    from prfaas.commands.profile_remote_path import THRESHOLD_TOKENS, two_site_deployment

    target = two_site_deployment(_two_profiles(tmp_path, VLLM))
    d = yaml.safe_load(target.text)
    assert (target.prfaas_site, target.pd_site) == ("pf", "pd")
    assert [s["name"] for s in d["sites"]] == ["pf", "pd"]
    assert [s["hardware"] for s in d["sites"]] == [
        str((tmp_path / n).resolve()) for n in ("pf.yaml", "pd.yaml")
    ]
    assert d["links"] == [{"src": "pf", "dst": "pd", "gbps": 10}]
    assert d["policy"] == {"router": "prfaas", "threshold_tokens": THRESHOLD_TOKENS,
                           "tune_min_samples": 1_000_000}  # fmt: skip
    assert d["psk"] != "p" * 32


@pytest.mark.timeout(60)
def test_remote_path_refusals_exit_2_naming_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.yaml"
    one_profile = _files(tmp_path, VLLM)  # its PrfaaS site's hardware is a preset
    cases = [
        (["--endpoint", "http://127.0.0.1:1"], "--remote-path goes with --plumbing-of"),
        (["--plumbing-of", str(one_profile)], "site pf's hardware 'h200' is a preset"),
    ]
    for source, message in cases:
        assert main(["profile", *source, "-o", str(out), "--remote-path"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
    assert not out.exists()


@pytest.mark.timeout(120)
def test_the_remote_path_measured_through_live_sites(tmp_path: Path) -> None:
    """The measurement end to end on emulated sites (seconds): every class offloaded (it refuses
    otherwise), each class's TTFT and each site's CPU read, the deployment stopped; then the
    fit against the simulator: a gap made on the simulator's own TTFT (a fixed 40 ms and 5 ns
    a KV byte) comes back as the two terms, written as measured (no longer missing)."""
    from prfaas.commands.profile_remote_path import (
        RemoteClass,
        RemoteTarget,
        probe_remote_path,
        simulated_ttft_s,
        with_remote_path,
    )
    from prfaas.perf import cost_model_for_hardware
    from prfaas.perf.profile_read import load_profile_file
    from prfaas.sim.kv_bytes import KvBytes

    timed = {"kind": "timed", "model": "paper-1t"}
    data = yaml.safe_load(_two_profiles(tmp_path, timed).read_text())
    data["engine"]["time_scale"] = 0.05
    for s in data["sites"]:
        s["hardware"] = str(tmp_path / s["hardware"])
    data.update(policy={"router": "prfaas", "threshold_tokens": 128, "tune_min_samples": 10**6},
                gateway={"port": 0, "control_port": 0})  # fmt: skip
    target = RemoteTarget(yaml.safe_dump(data), "pf", "pd")
    said: list[str] = []
    d, classes = probe_remote_path(target, tmp_path / "work", requests=3, seed=5, say=said.append)
    assert [c.prompt_tokens for c in classes] == [256, 1024, 4096]
    assert all(len(c.ttft_s) == 3 and set(c.cpu_s) == {"pf", "pd"} for c in classes)
    assert sum("offloaded" in line for line in said) == 3
    processes = json.loads((tmp_path / "work" / "remote-path-run" / "processes.json").read_text())
    assert processes["stopped"] is True and processes["processes"]

    pd = load_profile_file(tmp_path / "pd.yaml")
    kv = KvBytes(cost_model_for_hardware("paper-1t", str(tmp_path / "pd.yaml")).model.cache)
    made = tuple(
        RemoteClass(n, (simulated_ttft_s(d, tmp_path / "pd.yaml", n) + 0.04
                        + 5e-9 * kv.total(n),) * 3, c.cpu_s)
        for n, c in zip((256, 1024, 4096), classes, strict=True)
    )  # fmt: skip
    measured = with_remote_path(pd, d, made, target)
    p = measured.plumbing
    assert (p.decode_per_request_s, p.decode_per_kv_byte_s) == (
        pytest.approx(0.04, rel=1e-3),
        pytest.approx(5e-9, rel=1e-3),
    )
    assert not {"decode_per_request_s", "decode_per_kv_byte_s"} & set(p.missing)
    assert "4096 tokens" in dict(measured.plumbing_how)["decode_per_kv_byte_s"]
