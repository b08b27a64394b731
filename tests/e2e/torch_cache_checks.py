"""The cache itself, between a real vLLM (CPU) server and engine.torch in the test's process, for
a dense model (tiny llama, fp32: ``test_vllm_connector``'s servers) and a hybrid one (tiny
Qwen3-Next, bf16: gated delta-net states beside attention; ``test_vllm_connector_hybrid``'s
servers, ``-O0 --no-enable-prefix-caching``). Was ``test_vllm_torch_cache.py`` with servers of
its own; run on those modules' servers now (two fewer starts), as two checks each:

- ``vllm_to_torch``: the server prefills with ``do_remote_decode`` to a prfaas ``Receiver`` here
  that allocates in a torch decode engine; the session is compared tensor by tensor with
  engine.torch's own cache of the same tokens (the whole prompt; a hybrid's all but the last
  token) and then decoded by engine.torch (END carries no first token): the tokens of engine.torch
  alone up to near ties (``tests/greedy_agreement.py``: two numeric paths may take either of two
  tokens within rounding of each other, and then part). Token agreement alone would say little
  for the states: the tiny hybrid's greedy tokens hardly depend on them; the tensors are what is
  compared closely.
- ``torch_to_vllm``: engine.torch's cache (a hybrid's without the last token) sent through a
  prfaas ``Link`` to the server's connector receiver, then a ``do_remote_prefill`` request:
  installed (the agent counts the load), and the server's own tokens and log-probs for the prompt
  (up to near ties, as above).
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import httpx

from greedy_agreement import check_against_torch, check_vllm_answers
from prfaas.testbed import vllm_servers as V

PROMPT_TOKENS = 300
NEW_TOKENS = 16
TIE_NATS = {"llama": 1e-3, "qwen3_next": 0.05}
"""Where two engines' greedy tokens part (fp32: rounding ~1e-5; bf16: ~1e-2), the other path's
token is within this of the reference's top log-prob there (a near tie); a zeroed or misplaced
cache moves log-probs by whole nats."""


def load_torch_model(folder: Any, dtype: str) -> Any:
    """engine.torch's model of the server's folder, in this process (one thread)."""
    import torch

    from prfaas.engine.torch import load_model
    from prfaas.spec import DType

    torch.set_num_threads(1)
    return load_model(folder, DType.parse(dtype))


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, 500) for _ in range(PROMPT_TOKENS)]


def _greedy() -> Any:
    from prfaas.engine import SamplingParams

    return SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)


def _tensors(layout: Any, buffers: list[bytes]) -> list[tuple[int, str, Any]]:
    """(layer position, tensor name, float tensor in the spec's shape) of a session's bytes."""
    import torch

    from prfaas.engine.torch.hf_cache import torch_dtype

    out = []
    for pos, seg in enumerate(layout.segments):
        offset = 0
        for t in seg.tensors:
            raw = bytearray(buffers[pos][offset : offset + t.num_bytes])
            offset += t.num_bytes
            wire = torch.frombuffer(raw, dtype=torch_dtype(t.dtype.value)).view(*t.shape)
            out.append((pos, t.name, wire.float()))
    return out


def _bf16_step(x: float) -> float:
    return float(2.0 ** (math.floor(math.log2(abs(x) or 1.0)) - 7))


def _decode(engine: Any, rid: str, first: Any) -> list[int]:
    tokens = list(first.token_ids)
    while engine.num_running:
        for event in engine.step():
            if event.request_id == rid:
                tokens.extend(event.token_ids)
    return tokens


async def _receive_from_vllm(server: Any, engine: Any, ids: list[int], tid: str, psk: str) -> Any:
    from prfaas.transfer import Receiver, Refused, TransferConfig

    allocs = {}

    def allocate(manifest: Any) -> list[memoryview]:
        try:
            allocs[manifest.request_id] = engine.allocate(manifest, NEW_TOKENS)
        except Exception as exc:
            raise Refused(str(exc)) from None
        return list(allocs[manifest.request_id].layer_buffers)

    body = {
        "model": V.SERVED_MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0,
        "kv_transfer_params": {"do_remote_decode": True, "prfaas": {
            "transfer_id": tid, "host": "127.0.0.1", "port": 0, "cross_site": False,
            "skip_tokens": 0}},
    }  # fmt: skip
    async with Receiver(TransferConfig(psk=psk.encode()), allocate) as rx:
        _, port = await rx.listen("127.0.0.1", 0)
        body["kv_transfer_params"]["prfaas"]["port"] = port  # type: ignore[index]
        async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
            answer = asyncio.create_task(client.post(f"{server.url}/v1/completions", json=body))
            delivery = await asyncio.wait_for((await rx.next_session()).complete(), 120)
            assert (await answer).status_code == 200
    return allocs[tid], delivery


def vllm_to_torch(server: Any, loaded: Any, arch: str, psk: str) -> None:
    """The server's cache to engine.torch, which decodes it (seeds 1 and 2)."""
    from prfaas.engine import PrefillRequest
    from prfaas.engine.torch import TorchEngine

    hybrid = arch == "qwen3_next"
    for seed in (1, 2):
        ids = _prompt(seed)
        decoder = TorchEngine(loaded)
        alloc, delivery = asyncio.run(
            _receive_from_vllm(server, decoder, ids, f"v{arch}{seed}", psk)
        )
        n_kv = PROMPT_TOKENS - 1 if hybrid else PROMPT_TOKENS
        assert alloc.layout.num_tokens == n_kv and delivery.first_token == -1
        assert alloc.layout.num_bytes == loaded.cmap.spec.transfer_bytes(n_kv)
        own = TorchEngine(loaded)
        own.prefill(PrefillRequest("own", tuple(ids[:n_kv]), _greedy()))
        mine = [b"".join(bytes(v) for _, v in out.pieces()) for out in own.export("own")]
        got = _tensors(alloc.layout, [bytes(b) for b in alloc.layer_buffers])
        for (pos, name, g), (_, _, w) in zip(got, _tensors(alloc.layout, mine), strict=True):
            where = f"{arch} seed {seed} layer {pos} {name}"
            diff, top = float((g - w).abs().max()), float(w.abs().max())
            if not hybrid:  # fp32: the same numbers up to rounding
                assert diff <= 1e-5 * max(top, 1.0), (where, diff, top)
            elif name == "recurrent_state":  # fp32 state of bf16 inputs; orientation matters
                flipped = float((g - w.transpose(-1, -2)).abs().max())
                assert diff <= 0.05 * top and diff <= 0.1 * flipped, (where, diff, top, flipped)
            elif name == "conv_state":  # oldest column zeroed by the sender, never read
                assert float(g[..., 0].abs().max()) == 0.0, where
                rest = float((g[..., 1:] - w[..., 1:]).abs().max())
                assert rest <= 2 * _bf16_step(top), (where, rest, top)
            else:  # attention K/V behind three delta-net layers and a MoE, bf16 in two engines
                mean = float((g - w).abs().mean()) / float(w.abs().mean())
                assert mean <= 0.05, (where, mean)
        first = decoder.install(alloc, delivery.first_token, _greedy(), prompt_token_ids=ids)
        tokens = _decode(decoder, alloc.request_id, first)
        alone = TorchEngine(loaded).generate(PrefillRequest("alone", tuple(ids), _greedy()))
        # Two engines' numbers (vLLM's cache, engine.torch's): the same tokens up to a near tie.
        check_against_torch(loaded.model, ids, tokens, alone, TIE_NATS[arch])


def _complete(server: Any, ids: list[int], kv: Any = None) -> Any:
    body: dict[str, Any] = {
        "model": V.SERVED_MODEL, "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True, "logprobs": 5,
        "return_tokens_as_token_ids": True,
    }  # fmt: skip
    if kv is not None:
        body["kv_transfer_params"] = kv
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


async def _send_to_vllm(server: Any, loaded: Any, ids: list[int], tid: str, psk: str) -> int:
    from prfaas.engine import PrefillRequest
    from prfaas.engine.torch import TorchEngine
    from prfaas.transfer import Link, Manifest, TransferConfig

    sender = TorchEngine(loaded)
    sender.prefill(PrefillRequest("s", tuple(ids), _greedy()))
    outputs = sender.export("s")
    manifest = Manifest.from_layout(tid, sender.layout(len(ids)))
    async with (
        await Link.connect(server.host, server.kv_port, TransferConfig(psk=psk.encode())) as link,
        link.session(manifest) as session,
    ):
        for out in outputs:
            for offset, view in out.pieces():
                await session.send(out.position, offset, view)
        await session.finish(-1)  # verified by the receiver when this returns
    return manifest.num_bytes


def torch_to_vllm(server: Any, loaded: Any, arch: str, psk: str) -> None:
    """engine.torch's cache installed in the server, decoded as the server alone (3 and 4)."""
    hybrid = arch == "qwen3_next"
    for seed in (3, 4):
        ids = _prompt(seed)
        reference = _complete(server, ids)
        sent_ids = ids[:-1] if hybrid else ids  # the connector installs a hybrid's n - 1
        before = server.stats()
        tid = f"t{arch}{seed}"
        sent = asyncio.run(_send_to_vllm(server, loaded, sent_ids, tid, psk))
        assert sent == loaded.cmap.spec.transfer_bytes(len(sent_ids))
        got = _complete(
            server,
            ids,
            {"do_remote_prefill": True, "prfaas": {"transfer_id": tid, "timeout_s": 30}},
        )
        after = server.stats()
        assert after["loads_ok"] - before["loads_ok"] == 1, (before, after)
        assert after["loads_failed"] == before["loads_failed"], (before, after)
        tolerance = 0.02 if hybrid else 1e-3  # bf16 vs fp32, as the vLLM <-> vLLM tests allow
        check_vllm_answers(got, reference, logprob_tol=tolerance, tie_nats=TIE_NATS[arch])
