"""How a child starts (``serve.launch_child.spawn``, shared by ``prfaas up`` and the pool
launcher): a session of its own, output piped into its log, the environment each launcher gives
(``prfaas up``'s ``UP_CHILD_ENV``; the pool launcher's children get none of it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prfaas.serve.childlog import RotatingLog
from prfaas.serve.keyring import LAUNCHED_BY_UP_ENV
from prfaas.serve.launch_child import UP_CHILD_ENV, spawn

pytestmark = pytest.mark.timeout(30)

EXAMPLE_POOL = Path(__file__).resolve().parents[3] / "examples" / "pool" / "pool.yaml"
NAMES = ("PYTHONUNBUFFERED", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS",
         LAUNCHED_BY_UP_ENV)  # fmt: skip
# The child prints its session id (its own: it leads it) and the variables above.
SHOW = (
    "import os, sys; print('sid', os.getsid(0) == os.getpid()); "
    f"print(*(f'{{n}}={{os.environ.get(n)}}' for n in {NAMES!r})); "
    "print('to stderr', file=sys.stderr)"
)


def _run(argv: list[str], log: RotatingLog, extra_env: dict[str, str]) -> str:
    group, pump = spawn(argv, log, "child", extra_env=extra_env)
    assert group.proc.wait(20) == 0
    assert pump.join(10)
    return log.path.read_text()


def test_spawn_gives_up_s_environment_and_pipes_both_streams(tmp_path: Path) -> None:
    log = RotatingLog(tmp_path / "child.log")
    text = _run([sys.executable, "-c", SHOW], log, dict(UP_CHILD_ENV))
    log.close()
    assert "sid True" in text and "to stderr" in text
    assert "PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1" in text
    assert f"{LAUNCHED_BY_UP_ENV}=1" in text


def test_spawn_adds_only_unbuffered_without_extra_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    log = RotatingLog(tmp_path / "child.log")
    text = _run([sys.executable, "-c", SHOW], log, {})
    log.close()
    unset = "TRANSFORMERS_VERBOSITY=None HF_HUB_DISABLE_PROGRESS_BARS=None"
    assert f"PYTHONUNBUFFERED=1 {unset} {LAUNCHED_BY_UP_ENV}=None" in text


def test_the_pool_launcher_starts_its_children_through_spawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its log line first, then the child's output; none of ``prfaas up``'s environment."""
    from prfaas.pool.launcher import PoolLauncher
    from prfaas.pool_file import load_pool

    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    launcher = PoolLauncher(load_pool(EXAMPLE_POOL), EXAMPLE_POOL, tmp_path / "wd")
    launcher.workdir.mkdir()
    launcher._args["door"] = ["-c", SHOW]  # what `_add` records, without the supervisor
    try:
        group = launcher._spawn("door")
        assert group.proc.wait(20) == 0
        assert launcher._pumps[-1].join(10)
        text = (launcher.workdir / "door.log").read_text()
    finally:
        launcher._logs["door"].close()
    assert text.startswith("--- prfaas pool launcher: starting door\n")
    assert "sid True" in text and "PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=None" in text
    assert f"{LAUNCHED_BY_UP_ENV}=None" in text
