"""A receiver or sender process for the two-site e2e tests (run inside a testbed namespace).

rx: listen, print {"port"}, accept N sessions, print {"request_id", "sha256"} per verified one.
tx: send N random sessions (seeded), print {"request_id", "sha256"} per session it finished.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys

from prfaas.spec import CacheSpec, LayerCache
from prfaas.transfer import Link, Manifest, Receiver, TransferConfig

KEY = b"e2e-key-0123456789abcdef"


def manifest(i: int) -> Manifest:
    spec = CacheSpec((LayerCache.gqa(2, 64), LayerCache.linear((4, 64, 64)), LayerCache.mla(64, 8)))
    return Manifest.from_layout(f"req-{i}", spec.layout(2000 + 97 * i, 300))


async def rx(host: str, num: int) -> None:
    cfg = TransferConfig(psk=KEY, timeout_s=20)
    allocate = lambda m: [bytearray(n) for n in m.layer_bytes()]  # noqa: E731
    async with Receiver(cfg, allocate) as r:
        _, port = await r.listen(host, 0)
        print(json.dumps({"port": port}), flush=True)
        for _ in range(num):
            s = await r.next_session(timeout_s=30)
            d = await s.complete(timeout_s=30)
            digest = hashlib.sha256(b"".join(bytes(b) for b in d.buffers)).hexdigest()
            print(json.dumps({"request_id": d.request_id, "sha256": digest}), flush=True)


async def tx(host: str, port: int, num: int, rate_bytes_per_s: float | None) -> None:
    cfg = TransferConfig(psk=KEY, timeout_s=20, rate_limit_bytes_per_s=rate_bytes_per_s)
    rng = random.Random(0)
    async with await Link.connect(host, port, cfg) as link:

        async def one(i: int) -> None:
            m = manifest(i)
            payload = [rng.randbytes(n) for n in m.layer_bytes()]
            async with link.session(m) as s:
                for layer, data in enumerate(payload):
                    half = len(data) // 2
                    await s.send(layer, half, memoryview(data)[half:])
                    await s.send(layer, 0, memoryview(data)[:half])
                await s.finish(first_token=i)
            digest = hashlib.sha256(b"".join(payload)).hexdigest()
            print(json.dumps({"request_id": m.request_id, "sha256": digest}), flush=True)

        async with asyncio.TaskGroup() as tg:
            for i in range(num):
                tg.create_task(one(i))


if __name__ == "__main__":
    role, host, num = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if role == "rx":
        asyncio.run(rx(host, num))
    else:
        rate = float(sys.argv[5]) if len(sys.argv) > 5 else None
        asyncio.run(tx(host, int(sys.argv[4]), num, rate))
