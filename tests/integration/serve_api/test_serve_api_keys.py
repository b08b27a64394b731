"""Client API keys: with keys configured, ``/v1/*``, ``/tokenize`` and ``/detokenize`` need
``Authorization: Bearer KEY`` (401 with an OpenAI-style body otherwise) and never reach the backend;
``/health``, ``/ready`` and ``/metrics`` stay open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from serve_api_fakes import MODEL, Server, serve

from prfaas.serve.api import GatewayHTTPConfig
from prfaas.serve.api.api_keys import API_KEY_ENV, resolve_api_keys

pytestmark = pytest.mark.timeout(30)
KEYS = ("first-key-0123", "second-key-4567")
BODY = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
EXAMPLE = Path(__file__).parents[3] / "examples" / "two-site.yaml"


@pytest.fixture(scope="module")
def keyed() -> Iterator[Server]:
    yield from serve(GatewayHTTPConfig(api_keys=KEYS))


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-key-000"},
        {"Authorization": "Bearer " + KEYS[0] + "x"},
        {"Authorization": "Bearer " + KEYS[0][:-1]},
        {"Authorization": "Basic " + KEYS[0]},
        {"Authorization": KEYS[0]},
        {"Authorization": "Bearer"},
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/" + MODEL),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/v1/anything"),
    ],
)
def test_guarded_routes_need_a_key(
    keyed: Server, headers: dict[str, str], method: str, path: str
) -> None:
    started = len(keyed.backend.started)
    resp = httpx.request(method, keyed.url + path, json=BODY, headers=headers, timeout=10)
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"] == "Bearer"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert KEYS[0] not in resp.text and KEYS[1] not in resp.text
    assert len(keyed.backend.started) == started


@pytest.mark.parametrize("key", KEYS)
def test_any_configured_key_works(keyed: Server, key: str) -> None:
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0, timeout=10)
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].text
    assert [m.id for m in client.models.list().data] == [MODEL]
    lower = {"authorization": "bearer " + key}  # the scheme is case-insensitive
    resp = httpx.post(keyed.url + "/tokenize", json={"prompt": "a"}, headers=lower, timeout=10)
    assert resp.status_code == 200


def test_openai_client_with_a_wrong_key_gets_authentication_error(keyed: Server) -> None:
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2)


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_probes_stay_open(keyed: Server, path: str) -> None:
    assert httpx.get(keyed.url + path, timeout=10).status_code == 200


def test_keys_from_the_file_and_the_environment() -> None:
    assert resolve_api_keys([], {}) == ()
    assert resolve_api_keys(["file-key-123"], {API_KEY_ENV: ""}) == ("file-key-123",)
    both = resolve_api_keys(["file-key-123"], {API_KEY_ENV: "env-key-4567"})
    assert both == ("file-key-123", "env-key-4567")
    assert resolve_api_keys(["same-key-123"], {API_KEY_ENV: "same-key-123"}) == ("same-key-123",)


@pytest.mark.parametrize("bad", ["short", "has space in it", "tab\tinside-it", "ünïcode-key"])
def test_config_refuses_weak_keys_without_echoing_them(bad: str) -> None:
    with pytest.raises(ValueError, match=r"api_keys\[1\]") as info:
        GatewayHTTPConfig(api_keys=("a-good-key-1", bad))
    assert bad not in str(info.value)


def test_deployment_keys_reach_the_cluster_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prfaas.config import load_deployment
    from prfaas.serve.api import ByteTokenizer
    from prfaas.serve.backend import ModelInfo
    from prfaas.serve.gateway.app import create_cluster_gateway

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["gateway"]["api_keys"] = ["file-key-0123"]
    path = tmp_path / "keyed.yaml"
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv(API_KEY_ENV, "env-key-45678")
    apps = create_cluster_gateway(load_deployment(path), ByteTokenizer(), ModelInfo("m", 4096))
    config = apps.client.state.gateway.config
    assert config.api_keys == ("file-key-0123", "env-key-45678")
