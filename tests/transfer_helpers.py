"""Builders shared by the transfer tests: random manifests, producers, recording allocators."""

from __future__ import annotations

import random
import shutil
import ssl
import subprocess
from pathlib import Path

from prfaas.spec import CacheSpec, DType, LayerCache
from prfaas.transfer import Manifest, OutboundSession, Refused

KEY = b"test-key-0123456789abcdef"
DTYPES = list(DType)


def random_spec(rng: random.Random, max_layers: int = 6) -> CacheSpec:
    layers = []
    for _ in range(rng.randint(1, max_layers)):
        kind = rng.choice(["gqa", "mla", "swa", "linear"])
        dtype = rng.choice(DTYPES)
        if kind == "gqa":
            layers.append(LayerCache.gqa(rng.randint(1, 4), rng.choice([8, 16, 24]), dtype))
        elif kind == "mla":
            layers.append(LayerCache.mla(rng.choice([16, 32, 64]), rng.choice([4, 8]), dtype))
        elif kind == "swa":
            w = rng.randint(1, 64)
            layers.append(LayerCache.swa(rng.randint(1, 2), rng.choice([8, 16]), w, dtype))
        else:
            state = (rng.randint(1, 3), rng.randint(1, 32), rng.randint(1, 32))
            conv = (rng.randint(1, 64), 3) if rng.random() < 0.5 else None
            layers.append(LayerCache.linear(state, conv, state_dtype=dtype))
    return CacheSpec(tuple(layers))


def random_manifest(rng: random.Random, request_id: str = "req") -> Manifest:
    num_tokens = rng.randint(1, 300)
    num_cached = rng.randint(0, num_tokens)
    return Manifest.from_layout(request_id, random_spec(rng).layout(num_tokens, num_cached))


def random_payload(rng: random.Random, manifest: Manifest) -> list[bytes]:
    return [rng.randbytes(layer.num_bytes) for layer in manifest.layers]


def random_ranges(rng: random.Random, payload: list[bytes]) -> list[tuple[int, int, int]]:
    """(layer, offset, length) pieces covering every layer, shuffled: any order is allowed."""
    pieces = []
    for i, data in enumerate(payload):
        off = 0
        while off < len(data):
            n = rng.randint(1, max(1, len(data) // rng.choice([1, 2, 5])))
            n = min(n, len(data) - off)
            pieces.append((i, off, n))
            off += n
    rng.shuffle(pieces)
    return pieces


async def send_all(
    s: OutboundSession, payload: list[bytes], pieces: list[tuple[int, int, int]], first: int = 5
) -> None:
    for layer, off, n in pieces:
        await s.send(layer, off, memoryview(payload[layer])[off : off + n])
    await s.finish(first_token=first)


class Allocator:
    """Records every allocation; can refuse."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.calls: list[Manifest] = []

    def __call__(self, manifest: Manifest) -> list[bytearray]:
        self.calls.append(manifest)
        if self.refuse is not None:
            raise Refused(self.refuse)
        return [bytearray(layer.num_bytes) for layer in manifest.layers]


def self_signed_cert(tmp: Path) -> tuple[Path, Path] | None:
    """(cert, key) PEM files for ``localhost`` / 127.0.0.1, made by openssl; None without it."""
    if shutil.which("openssl") is None:
        return None
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def tls_contexts(tmp: Path) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """(server, client) contexts with a fresh self-signed certificate; None without openssl."""
    files = self_signed_cert(tmp)
    if files is None:
        return None
    cert, key = files
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client
