"""The control plane's deployment-file parts: ``gateway.control_port`` and the shared ``psk`` (the
examples' public placeholder is refused by ``prfaas serve``, a warning from ``prfaas up``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from prfaas.cli import main
from prfaas.config import DeploymentConfig, load_deployment
from prfaas.errors import UsageError
from prfaas.serve.keyring import LAUNCHED_BY_UP_ENV, PLACEHOLDER_PSKS

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "two-site.yaml"


def _raw(**top: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "sites": [{"name": "pd", "kind": "pd",
                   "nodes": [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}]}],
    }  # fmt: skip
    raw.update(top)
    return raw


def test_control_listener_defaults_and_url() -> None:
    d = DeploymentConfig.model_validate(_raw(gateway={"host": "10.0.0.5", "port": 9000}))
    assert d.gateway.control_port == 8001
    assert d.control_url == "http://10.0.0.5:8001"
    assert d.gateway.url == "http://10.0.0.5:9000"


def test_control_port_must_differ_from_the_client_port() -> None:
    with pytest.raises(ValidationError, match="control_port"):
        DeploymentConfig.model_validate(_raw(gateway={"port": 9000, "control_port": 9000}))
    both_free = DeploymentConfig.model_validate(_raw(gateway={"port": 0, "control_port": 0}))
    assert both_free.gateway.control_port == 0


def test_a_file_without_psk_is_refused_where_processes_start_separately(tmp_path: Path) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(_raw()))
    assert len(load_deployment(path).psk) >= 16  # prfaas up: one key drawn for its children
    with pytest.raises(UsageError, match=r"psk: missing"):
        load_deployment(path, require_psk=True)


def test_short_keys_are_refused_and_the_examples_placeholder_works(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="psk"):
        DeploymentConfig.model_validate(_raw(psk="short"))
    assert load_deployment(EXAMPLE, require_psk=True).psk == "change-me-to-a-long-random-secret"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("key", sorted(PLACEHOLDER_PSKS))
def test_prfaas_serve_refuses_the_examples_placeholder_key(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(LAUNCHED_BY_UP_ENV, raising=False)
    raw = yaml.safe_load(EXAMPLE.read_text()) | {"psk": key}
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(raw))
    node = raw["sites"][0]["nodes"][0]["name"]
    for argv in (["--role", "gateway"], ["--role", "node", "--node", node]):
        assert main(["serve", "--config", str(path), *argv]) == 2
        err = capsys.readouterr().err
        assert "psk" in err and "placeholder" in err and "Traceback" not in err
    # Also as a key accepted during a rotation.
    path.write_text(yaml.safe_dump(raw | {"psk": "a-real-secret-0123456789", "accept_psks": [key]}))
    assert main(["serve", "--config", str(path), "--role", "gateway"]) == 2
    assert "placeholder" in capsys.readouterr().err


@pytest.mark.timeout(30)
def test_prfaas_up_warns_about_the_placeholder_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert yaml.safe_load(EXAMPLE.read_text())["psk"] in PLACEHOLDER_PSKS
    monkeypatch.setenv("PRFAAS_API_KEY", "shortk")  # stops `up` right after the warning
    assert main(["up", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err
    assert "warning" in err and "placeholder" in err and "psk" in err
