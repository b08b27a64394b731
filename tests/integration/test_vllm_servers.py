"""``prfaas.testbed.vllm_servers`` without vLLM: ``running`` waits for every server's ``/health``,
says why when one dies before answering (its log's tail), and stops every server it started
however the block ends, also when a later start fails. The "server" is a small Python HTTP
server that answers ``/health`` (and, on request, exits first). And ``cached_tiny``: a tiny model
made once at a stable path (vLLM's compile cache is keyed by it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from prfaas.testbed import vllm_servers as V

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FAKE = """
import http.server, sys
port, mode = int(sys.argv[1]), sys.argv[2]
if mode == "die":
    print("fake server: no model here", flush=True)
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake(name: str, tmp: Path, mode: str = "serve") -> V.ServerProcess:
    port = V.free_port()
    log = tmp / f"{name}.log"
    proc = V.launch([sys.executable, "-c", FAKE, str(port), mode], {}, log)
    rpc = V.rpc_folder()
    (rpc / "0b1e4a52-9f6e-4c2a-8d57-3f0c7f1d2e11").touch()  # what vLLM leaves there
    return V.ServerProcess(name, "127.0.0.1", port, proc, log, rpc_dir=rpc)


def test_running_waits_for_all_and_stops_them(tmp_path: Path) -> None:
    starts = [lambda: _fake("a", tmp_path), lambda: _fake("b", tmp_path)]
    with V.running(starts, 30) as servers:
        assert [s.name for s in servers] == ["a", "b"]
        assert all(s.proc.poll() is None for s in servers)
        assert all(s.rpc_dir is not None and s.rpc_dir.is_dir() for s in servers)
    assert all(s.proc.returncode is not None for s in servers)
    assert not any(s.rpc_dir is not None and s.rpc_dir.exists() for s in servers)


def test_a_server_that_dies_is_named_with_its_log_and_the_others_stopped(tmp_path: Path) -> None:
    started: list[V.ServerProcess] = []

    def keep(server: V.ServerProcess) -> V.ServerProcess:
        started.append(server)
        return server

    starts = [lambda: keep(_fake("ok", tmp_path)), lambda: keep(_fake("bad", tmp_path, "die"))]
    dies = pytest.raises(RuntimeError, match=r"bad exited \(3\)[\s\S]*no model here")
    with dies, V.running(starts, 30):
        pytest.fail("yielded without a healthy 'bad'")
    assert [s.proc.returncode is not None for s in started] == [True, True]


def test_a_failing_start_stops_the_servers_started_before(tmp_path: Path) -> None:
    started: list[V.ServerProcess] = []

    def first() -> V.ServerProcess:
        started.append(_fake("first", tmp_path))
        return started[-1]

    def broken() -> V.ServerProcess:
        raise OSError("no such python")

    with pytest.raises(OSError, match="no such python"), V.running([first, broken], 30):
        pytest.fail("yielded without the second server")
    assert started[0].proc.returncode is not None


@pytest.mark.timeout(120)
def test_a_cached_tiny_model_is_made_once_at_a_stable_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = V.cached_tiny("llama", {"head_dim": 32, "hidden_size": 128})
    made_at = (first / "config.json").stat().st_mtime_ns
    again = V.cached_tiny("llama", {"head_dim": 32, "hidden_size": 128})
    assert again == first and (again / "config.json").stat().st_mtime_ns == made_at
    assert first.parent == tmp_path / "prfaas" / "tiny-models"
    other = V.cached_tiny("llama", {"head_dim": 16, "hidden_size": 64})
    assert other != first  # other arguments: another model
    assert sorted(p.name.startswith(".making-") for p in first.parent.iterdir()) == [False, False]
