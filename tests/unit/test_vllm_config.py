"""``engine: {kind: vllm}``: validation names the field, a site's ``engine.vllm`` replaces only the
fields it names (also after the launcher's resolved file is read back), and the sidecar's vLLM
command line and environment follow the contract (the key only in the environment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from prfaas.cli import main
from prfaas.config import DeploymentConfig, load_deployment
from prfaas.deployment_sections import cpu_set
from prfaas.errors import UsageError
from prfaas.integrations.vllm.settings import ConnectorSettings
from prfaas.serve.vllm.server import (
    OWNER_ENV,
    PSK_ENV,
    owner_tag,
    private_folder_env,
    server_spec,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vllm-tiny.yaml"
PSK = "a-test-key-of-enough-length"


def _deployment(tmp_path: Path, **vllm: Any) -> dict[str, Any]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    return {
        "engine": {"kind": "vllm", "model": "tiny", "model_path": str(model), "vllm": vllm},
        "sites": [
            {"name": "pf", "kind": "prfaas", "nodes": [{"name": "pf0", "role": "prefill"}],
             "engine": {"vllm": {"cpu_bind": "1"}}},
            {"name": "pd", "kind": "pd", "prefill_nodes": 1, "decode_nodes": 1},
        ],
        "links": [{"src": "pf", "dst": "pd", "gbps": 2}],
        "psk": PSK,
    }  # fmt: skip


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _python(tmp_path: Path, mode: int = 0o755) -> Path:
    exe = tmp_path / "bin" / "python"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(mode)
    return exe


def test_the_example_loads_with_both_sites_pinned_apart() -> None:
    d = load_deployment(EXAMPLE)
    binds = {s.name: d.engine_for(s.name).vllm.cpu_bind for s in d.sites}
    assert binds == {"prfaas": "1", "pd": "0"}
    assert all(d.engine_for(s.name).kind == "vllm" for s in d.sites)
    assert d.engine_for("pd").vllm.max_model_len == 2048  # the top level's, kept


def test_a_site_overrides_only_what_it_names(tmp_path: Path) -> None:
    exe = _python(tmp_path)
    data = _deployment(tmp_path, python=str(exe), cpu_bind="0", kv_cache_space_gib=3)
    d = load_deployment(_write(tmp_path, data))
    pf, pd = d.engine_for("pf").vllm, d.engine_for("pd").vllm
    assert (pf.cpu_bind, pf.kv_cache_space_gib, pf.python) == ("1", 3, str(exe))
    assert (pd.cpu_bind, pd.kv_cache_space_gib) == ("0", 3)
    # The launcher writes the resolved file and every child reads it back: same merge.
    resolved = yaml.safe_load(yaml.safe_dump(d.model_dump(mode="json")))
    again = DeploymentConfig.model_validate(resolved)
    assert again.engine_for("pf").vllm == pf and again.engine_for("pd").vllm == pd


def test_a_relative_python_is_found_beside_the_file(tmp_path: Path) -> None:
    exe = _python(tmp_path)
    d = load_deployment(_write(tmp_path, _deployment(tmp_path, python="bin/python")))
    assert d.engine.vllm.python == str(exe)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d, p: d["engine"]["vllm"].update(python=str(p / "nope")),
         "engine.vllm.python"),
        (lambda d, p: d["engine"]["vllm"].update(python=str(_python(p, 0o644))),
         "is not executable"),
        (lambda d, p: d["engine"]["vllm"].update(cpu_bind="first"), "engine.vllm.cpu_bind"),
        (lambda d, p: d["engine"]["vllm"].update(kv_cache_space_gib=0),
         "engine.vllm.kv_cache_space_gib"),
        (lambda d, p: d["engine"]["vllm"].update(gpu_memory_utilization=1.5),
         "engine.vllm.gpu_memory_utilization"),
        (lambda d, p: d["engine"]["vllm"].update(startup_timeout_s=0),
         "engine.vllm.startup_timeout_s"),
        (lambda d, p: d["engine"]["vllm"].update(surprise=1), "engine.vllm.surprise"),
        (lambda d, p: d["engine"]["vllm"].update(extra_args=["-O0", "--tensor-parallel-size", "2"]),
         "engine.vllm.extra_args: Value error, '--tensor-parallel-size' is not supported"),
        (lambda d, p: d["sites"][0]["engine"]["vllm"].update(extra_args=["-tp=2"]),
         "sites.0.engine.vllm.extra_args: Value error, '-tp=2' is not supported"),
        (lambda d, p: d["sites"][0]["engine"]["vllm"].update(cpu_bind="x"),
         "sites.0.engine.vllm.cpu_bind"),
        (lambda d, p: d["engine"].pop("model_path"), "needs model_path"),
        (lambda d, p: d["sites"][1].update(engine={"kind": "vllm"})
         or d["engine"].update(kind="timed", model="paper-1t") or d["engine"].pop("model_path"),
         "site pd: engine kind 'vllm' needs model_path"),
    ],
)  # fmt: skip
def test_bad_vllm_settings_name_the_field(tmp_path: Path, mutate: Any, needle: str) -> None:
    data = _deployment(tmp_path)
    mutate(data, tmp_path)
    with pytest.raises(UsageError, match=needle.replace(".", r"\.")):
        load_deployment(_write(tmp_path, data))


def test_the_cli_says_the_bad_python_and_exits_2(tmp_path: Path, capsys: Any) -> None:
    data = _deployment(tmp_path, python=str(tmp_path / "missing-python"))
    assert main(["up", str(_write(tmp_path, data)), "--ready-timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "engine.vllm.python" in err and "missing-python" in err and "Traceback" not in err


def test_the_server_command_line_follows_the_contract(tmp_path: Path) -> None:
    exe = _python(tmp_path)
    data = _deployment(tmp_path, python=str(exe), extra_args=["--enforce-eager"])
    d = load_deployment(_write(tmp_path, data))
    eng = d.engine_for("pf")
    settings = ConnectorSettings(
        listen_host="10.0.0.2", listen_port=7001, agent_socket="/run/x/agent.sock",
        kv_budget_mib=512, pace_gbps=0.5, link_gbps=10.0, link="pf->pd",
    )  # fmt: skip
    spec = server_spec(
        eng, settings, host="127.0.0.1", port=9100, psk=PSK, owner="o", rpc_dir=tmp_path / "rpc"
    )
    argv = list(spec.argv)
    assert argv[:3] == [str(exe), "-m", "vllm.entrypoints.openai.api_server"]
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    assert flag["--model"] == eng.model_path and flag["--served-model-name"] == "tiny"
    assert flag["--dtype"] == "float32" and flag["--max-model-len"] == "1024"  # from the folder
    assert (flag["--host"], flag["--port"]) == ("127.0.0.1", "9100")
    assert argv[-1] == "--enforce-eager"
    kv = json.loads(flag["--kv-transfer-config"])
    assert kv["kv_connector"] == "PrfaasConnector" and kv["kv_role"] == "kv_both"
    assert kv["kv_connector_module_path"] == "prfaas.integrations.vllm.connector"
    assert kv["kv_load_failure_policy"] == "recompute"
    assert kv["kv_connector_extra_config"] == {
        "listen_host": "10.0.0.2", "listen_port": 7001, "psk_env": PSK_ENV,
        "num_connections": 4, "kv_budget_mib": 512, "pace_gbps": 0.5,
        "agent_socket": "/run/x/agent.sock", "link_gbps": 10.0, "link": "pf->pd",
    }  # fmt: skip
    # One description of the settings: what the sidecar writes, the connector reads back.
    assert ConnectorSettings.from_extra_config(kv["kv_connector_extra_config"]) == settings
    env = spec.environment({"PATH": "/bin"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env[PSK_ENV] == PSK and env[OWNER_ENV] == "o" and env["PATH"] == "/bin"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["VLLM_RPC_BASE_PATH"] == str(tmp_path / "rpc")  # not /tmp, where they would stay
    assert env["TMPDIR"] == str(tmp_path / "rpc")  # the workers' rendezvous file too
    # ... but torch's compile cache stays where a restart finds it, through the path that
    # loads it (vLLM 0.32's AOT artifact does not load back: off unless the environment says)
    assert env["TORCHINDUCTOR_CACHE_DIR"] != str(tmp_path / "rpc")
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    assert not any(PSK in a for a in argv), "the key must never be on the command line"
    assert spec.cpus == frozenset({1})  # the whole server tree is pinned, not only OpenMP


@pytest.mark.parametrize(
    ("bind", "cores"),
    [("auto", None), ("1", {1}), ("0-3", {0, 1, 2, 3}), ("0,2-3", {0, 2, 3})],
)
def test_cpu_bind_values_name_their_cores(bind: str, cores: set[int] | None) -> None:
    assert cpu_set(bind) == (None if cores is None else frozenset(cores))


def test_max_model_len_from_the_file_wins_and_gpu_utilisation_is_passed(tmp_path: Path) -> None:
    data = _deployment(tmp_path, max_model_len=512, gpu_memory_utilization=0.8)
    d = load_deployment(_write(tmp_path, data))
    settings = ConnectorSettings(
        listen_host="127.0.0.1", listen_port=1, agent_socket="s", kv_budget_mib=1
    )
    argv = list(server_spec(d.engine, settings, host="h", port=1, psk=PSK, owner="o").argv)
    assert argv[argv.index("--max-model-len") + 1] == "512"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.8"
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector_extra_config"]["pace_gbps"] is None


def test_the_owner_tag_names_the_process_and_deployment_not_the_key() -> None:
    url = "http://127.0.0.1:9000"
    tag = owner_tag("pd-p0+pd-d0", PSK, url)
    assert tag.startswith("pd-p0+pd-d0:") and PSK not in tag
    assert tag == owner_tag("pd-p0+pd-d0", PSK, url)  # a restarted sidecar finds its orphans
    assert tag != owner_tag("pd-p0+pd-d0", PSK + "x", url)
    # Another deployment on this host, same node names and key: not its orphans.
    assert tag != owner_tag("pd-p0+pd-d0", PSK, "http://127.0.0.1:9001")


def test_the_default_python_is_the_project_vllm_venv_or_python3() -> None:
    from prfaas.deployment_sections import default_vllm_python

    python = default_vllm_python()
    venv = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    assert python == (str(venv) if venv.is_file() else python) and Path(python).name in (
        "python", "python3",
    )  # fmt: skip
    if not venv.is_file():
        assert Path(python).name == "python3"


def test_the_servers_output_goes_to_the_log_marked_without_the_polling(tmp_path: Path) -> None:
    import io

    from prfaas.serve.vllm.server import VllmServer

    d = load_deployment(_write(tmp_path, _deployment(tmp_path)))
    settings = ConnectorSettings(
        listen_host="127.0.0.1", listen_port=1, agent_socket="s", kv_budget_mib=1
    )
    spec = server_spec(d.engine, settings, host="127.0.0.1", port=1, psk=PSK, owner="o")
    out = io.BytesIO()
    server = VllmServer(spec, out=out)
    server._copy_output(
        io.BytesIO(
            b"INFO loading weights\n"
            b'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n'
            b'INFO:     127.0.0.1:1 - "GET /metrics HTTP/1.1" 200 OK\n'
            b'INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK\n'
        )
    )
    assert out.getvalue().splitlines() == [
        b"[vllm] INFO loading weights",
        b'[vllm] INFO:     127.0.0.1:1 - "POST /v1/completions HTTP/1.1" 200 OK',
    ]
    assert server.log_tail().endswith('"POST /v1/completions HTTP/1.1" 200 OK')


def test_a_hybrid_model_gets_its_server_with_prefix_caching_off(tmp_path: Path) -> None:
    data = _deployment(tmp_path)
    cfg = {"max_position_embeddings": 1024, "layer_types": ["linear_attention", "full_attention"]}
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    d = load_deployment(_write(tmp_path, data))
    settings = ConnectorSettings(
        listen_host="127.0.0.1", listen_port=1, agent_socket="s", kv_budget_mib=1
    )
    argv = list(server_spec(d.engine, settings, host="h", port=1, psk=PSK, owner="o").argv)
    # PrfaasConnector moves linear-attention states only with one state block per request.
    assert "--no-enable-prefix-caching" in argv
    (tmp_path / "model" / "config.json").write_text(json.dumps({"max_position_embeddings": 9}))
    argv = list(server_spec(d.engine, settings, host="h", port=1, psk=PSK, owner="o").argv)
    assert "--no-enable-prefix-caching" not in argv


@pytest.mark.parametrize(("given", "used"), [(None, "0"), ("1", "1"), ("0", "0")])
def test_the_aot_compile_cache_is_off_unless_the_environment_says(
    given: str | None, used: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if given is None:
        monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_AOT_COMPILE", given)
    assert private_folder_env(tmp_path)["VLLM_USE_AOT_COMPILE"] == used
