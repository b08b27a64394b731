"""An unknown ``engine.model`` (or site ``hardware``) preset for ``kind: timed`` fails validation,
naming the field (it used to surface only when a child process built its cost model, as a
traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prfaas.cli import main
from prfaas.config import load_deployment
from prfaas.errors import UsageError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "two-site.yaml"


def _with_engine(tmp_path: Path, **engine: object) -> Path:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["engine"].update(engine)
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_timed_model_names_engine_model(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"engine\.model: .*unknown model 'nope'.*paper-1t"):
        load_deployment(_with_engine(tmp_path, model="nope"))


def test_unknown_timed_hardware_names_the_site(tmp_path: Path) -> None:
    path = _with_engine(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["sites"][0]["hardware"] = "h999"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(
        UsageError, match=r"sites: .*site prfaas: hardware: unknown hardware 'h999'"
    ):
        load_deployment(path)
    data["engine"].update(kind="torch", model_path="/m")  # torch nodes do not use the preset
    path.write_text(yaml.safe_dump(data))
    assert load_deployment(path).sites[0].hardware == "h999"


def test_preset_aliases_and_case_still_load(tmp_path: Path) -> None:
    assert load_deployment(_with_engine(tmp_path, model="PAPER-1T")).engine.model == "PAPER-1T"


def test_torch_model_is_a_served_name_not_a_preset(tmp_path: Path) -> None:
    d = load_deployment(_with_engine(tmp_path, kind="torch", model="my-model", model_path="/m"))
    assert d.engine.model == "my-model"


def test_prfaas_up_exits_2_without_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_engine(tmp_path, model="nope")
    assert main(["up", str(path), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err
    assert "engine.model" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()
