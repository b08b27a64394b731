"""A live pool with TLS (``front_door.tls``, a tenant's ``receivers_tls``): the tenant's signed
API v1 is served over HTTPS and checked against the pool's CA, and the pool node's KV links to
that tenant's receiver run in TLS under the tenant's own CA (its receiver presents a certificate
the pool's certificate does not sign); a client without the pool's CA, or in plain HTTP, gets
nothing."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from pathlib import Path

import httpx
import pytest
from pool_helpers import KEYS, LivePool, live_pool, submit_body

from prfaas.pool.client import Accepted, PoolClient, PoolUnreachable, Refusal, pool_verify
from prfaas.transfer import Manifest, Receiver, TransferConfig
from transfer_helpers import self_signed_cert

pytestmark = pytest.mark.timeout(120)
KEY_A = KEYS["PRFAAS_POOL_KEY_A"].encode()
NUM_REQUESTS = 4


def _pool_file(pool_cert: Path, pool_key: Path, tenant_ca: Path) -> str:
    return f"""
version: 1
units: {{time_scale: 0.1, byte_divisor: 1000, block_tokens: 512}}
front_door: {{host: 127.0.0.1, port: 0, control_port: 0,
              tls: {{cert: {pool_cert}, key: {pool_key}}}}}
egress_gbps: 100
heartbeat_interval_s: 0.5
lease_s: 30.0
groups:
  - {{name: g-1t, model: paper-1t, kind: timed, hardware: h200, num_nodes: 2}}
tenants:
  - name: tenant-a
    keys: [{{id: a-1, env: PRFAAS_POOL_KEY_A}}]
    receivers_tls: {{ca: {tenant_ca}, server_hostname: localhost}}
  - {{name: tenant-b, keys: [{{id: b-1, env: PRFAAS_POOL_KEY_B}}]}}
"""


async def _tenant_over_tls(pool: LivePool, pool_ca: Path, receiver_ssl: ssl.SSLContext) -> None:
    got: list[str] = []

    def allocate(manifest: Manifest) -> list[bytearray]:
        return [bytearray(layer.num_bytes) for layer in manifest.layers]

    config = TransferConfig(psk=KEY_A, name="a-d0", ssl_context=receiver_ssl)
    async with Receiver(config, allocate) as rx:
        _, port = await rx.listen("127.0.0.1", 0)

        async def consume() -> None:
            async for session in rx:
                await session.complete(timeout_s=30.0)
                got.append(session.manifest.request_id)

        consumer = asyncio.create_task(consume())
        a = PoolClient(pool.url, "a-1", KEY_A, verify=pool_verify(str(pool_ca)))
        stranger = PoolClient(pool.url, "a-1", KEY_A)  # the system's CAs: the pool's is not one
        try:
            with pytest.raises(PoolUnreachable, match=r"CERTIFICATE_VERIFY_FAILED|certificate"):
                await stranger.heartbeat()
            reg = await a.register([{"name": "a-d0", "host": "127.0.0.1", "transfer_port": port}])
            assert not isinstance(reg, Refusal), reg
            answers = await asyncio.gather(
                *(
                    a.submit(submit_body("tenant-a", f"r{i}", "a-d0", 4096))
                    for i in range(NUM_REQUESTS)
                )
            )
            assert all(isinstance(x, Accepted) for x in answers), answers
            states: dict[str, str] = {}
            for _ in range(300):
                for i in range(NUM_REQUESTS):
                    out = await a.outcome(f"r{i}")
                    assert not isinstance(out, Refusal), out
                    states[f"r{i}"] = f"{out['state']} {out.get('reason', '')}".strip()
                if all(s.split()[0] in ("done", "failed", "aborted") for s in states.values()):
                    break
                await asyncio.sleep(0.1)
            assert all(s == "done" for s in states.values()), states
            assert sorted(got) == sorted(f"s-r{i}" for i in range(NUM_REQUESTS))
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
            await a.aclose()
            await stranger.aclose()


def test_the_tenant_api_and_kv_links_run_in_tls_under_each_sides_ca(tmp_path: Path) -> None:
    (tmp_path / "pool").mkdir()
    (tmp_path / "tenant").mkdir()
    pool_files = self_signed_cert(tmp_path / "pool")
    tenant_files = self_signed_cert(tmp_path / "tenant")
    if pool_files is None or tenant_files is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    pool_cert, pool_key = pool_files
    tenant_cert, tenant_key = tenant_files
    receiver_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    receiver_ssl.load_cert_chain(tenant_cert, tenant_key)
    with live_pool(tmp_path, pool_text=_pool_file(pool_cert, pool_key, tenant_cert)) as pool:
        try:
            assert pool.url.startswith("https://")
            with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port: no answer
                httpx.get(pool.url.replace("https://", "http://") + "/health", timeout=5,
                          trust_env=False)  # fmt: skip
            asyncio.run(_tenant_over_tls(pool, pool_cert, receiver_ssl))
        except BaseException:
            print(pool.log_tail())
            raise


TENANT_FILE = """
engine: {{kind: timed, model: paper-1t, time_scale: 0.1, byte_divisor: 1000}}
gateway: {{port: 0, control_port: 0}}
policy: {{router: threshold, threshold_tokens: 4096}}
tls: {{cert: {cert}, key: {key}, ca: {cert}}}
sites:
  - name: pd-a
    kind: pd
    hardware: h20
    nodes: [{{name: a-p0, role: prefill}}, {{name: a-d0, role: decode}}]
pool:
  url: {url}
  ca: {pool_ca}
  tenant: tenant-a
  key: {{id: a-1, env: PRFAAS_POOL_KEY_A}}
  link: {{gbps: 100, rtt_ms: 0}}
  tuner: fixed
"""


def test_a_tenant_gateway_offloads_over_https_and_its_kv_arrives_in_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The product path: ``prfaas up`` of a tenant file naming an https pool and its CA; its
    decode node's pool receiver serves TLS with the tenant deployment's certificate, which only
    the tenant's CA (the pool file's ``receivers_tls``) vouches for."""
    import openai

    from prfaas.config import load_deployment
    from prfaas.serve.launcher import Launcher

    (tmp_path / "pool").mkdir()
    (tmp_path / "tenant").mkdir()
    pool_files = self_signed_cert(tmp_path / "pool")
    tenant_files = self_signed_cert(tmp_path / "tenant")
    if pool_files is None or tenant_files is None:
        pytest.skip("openssl CLI not available to make a test certificate")
    (pool_cert, pool_key), (tenant_cert, tenant_key) = pool_files, tenant_files
    monkeypatch.setenv("PRFAAS_POOL_KEY_A", KEY_A.decode())
    with live_pool(tmp_path, pool_text=_pool_file(pool_cert, pool_key, tenant_cert)) as pool:
        path = tmp_path / "tenant-a.yaml"
        path.write_text(TENANT_FILE.format(cert=tenant_cert, key=tenant_key, url=pool.url,
                                           pool_ca=pool_cert))  # fmt: skip
        live = Launcher(load_deployment(path), tmp_path / "tenant-wd")
        try:
            live.start(ready_timeout_s=90)
            deadline = time.monotonic() + 30
            while not any(n["node"] == "pool" and n.get("in_rotation") for n in live.nodes()):
                assert time.monotonic() < deadline, "the pool never came into rotation"
                time.sleep(0.2)
            client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0,
                                   timeout=60)  # fmt: skip
            for i in range(3):
                r = client.completions.create(model="paper-1t", prompt=f"{i} " + "x" * 8000,
                                              max_tokens=4)  # fmt: skip
                assert r.choices[0].finish_reason
            offloaded = [r for r in live.routes() if r.get("offloaded")]
            assert len(offloaded) == 3 and all(r["prefill_site"] == "pool" for r in offloaded), (
                live.routes()
            )
        except BaseException:
            print(pool.log_tail())
            raise
        finally:
            live.stop()
