"""Inter-site KV over TLS, set in the deployment file: requests are served through both routes with
every KV connection wrapped in TLS (the PSK handshake runs inside it); with ``control_plane: true``
under ``prfaas up`` too, the control port and the worker APIs over HTTPS."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from live_helpers import launched, routes, timed_deployment

from transfer_helpers import self_signed_cert

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("control_plane", [False, True], ids=["kv", "kv+control"])
def test_kv_crosses_over_tls(tmp_path: Path, control_plane: bool) -> None:
    files = self_signed_cert(tmp_path)
    if files is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    cert, key = files
    base = timed_deployment()
    tls = {"cert": str(cert), "key": str(key), "ca": str(cert), "control_plane": control_plane}
    deployment = base.model_validate({**base.model_dump(), "tls": tls})
    with launched(deployment, tmp_path / "run") as live:
        for prompt in ("a" * 200, "b" * 20_000):
            body = {"model": "paper-1t", "prompt": prompt, "max_tokens": 16}
            r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        assert [r["offloaded"] for r in routes(live)] == [False, True]
        assert live.control_url.startswith("https://" if control_plane else "http://")


def test_missing_tls_file_is_a_clear_config_error(tmp_path: Path) -> None:
    base = timed_deployment()
    bad = {**base.model_dump(), "tls": {"cert": "/nope.pem", "key": "/nope", "ca": "/nope"}}
    with pytest.raises(ValueError, match=r"tls\.cert: file '/nope\.pem' does not exist"):
        base.model_validate(bad)
