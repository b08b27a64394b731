"""A stand-in for a vLLM OpenAI server with PrfaasConnector, for the sidecar's tests: run as the
server process itself (the sidecar starts it through a fake "python" that drops ``-m vllm...``).

It speaks what the sidecar uses: ``/health`` (only after ``FAKE_VLLM_START_DELAY_S``, like a
server loading its model), ``/metrics`` (the gauges the reports read), ``/v1/completions`` with a
token-id prompt, streaming and not, ``return_token_ids``; and the agent socket named in
``--kv-transfer-config`` (every agent op, ``set_pace`` too). Its "model" is deterministic:
the next token is a function of the last three. A prompt holding ``SLOW_TOKEN`` is slow (a long
prefill, tokens streamed apart), for tests that abort mid-request. Every completion and agent
call is appended to ``FAKE_VLLM_RECORD`` (JSON lines) so a test sees what the sidecar sent.

With ``--kv-events-config`` it publishes KV cache events as vLLM does (a ZMQ PUB socket: topic,
8-byte sequence number, a msgpack batch ``[ts, events, rank]`` of tagged maps; a ROUTER replay
socket): every completion "caches" its prompt's full blocks of ``FAKE_BLOCK`` tokens
(``BlockStored`` for those not cached yet, chained by their parent). ``POST /fake/kv``
``{"op": "skip" | "junk" | "clear" | "remove", "index": i}`` makes the next message vanish
(replayable), sends a junk payload, clears the cache, or removes block ``i`` of the last
prompt stored, for the sidecar's recovery tests.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import uvicorn
import zmq
import zmq.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

VOCAB = 512
BYTES_PER_TOKEN = 1024
RECORD = os.environ.get("FAKE_VLLM_RECORD", "")
START_DELAY_S = float(os.environ.get("FAKE_VLLM_START_DELAY_S", "0"))
SLOW_TOKEN = 511
RECOMPUTE_TOKEN = 510
"""A decode request whose prompt holds it is one whose KV load "failed": recomputed."""
SLOW_PREFILL_S = 30.0
SLOW_TOKEN_S = 0.05
TOKEN_TEXT = "a\u0085b\u2028c\u2029d\r"
"""Every streamed token's text: the characters str.splitlines (and httpx's aiter_lines) split on
besides \\n, written raw, as vLLM's JSON encoder leaves them; a reader must split on \\n only."""
FAKE_BLOCK = 8
"""The fake's cache block (the sidecar tests' prfaas block is 16: unequal sizes)."""
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def next_token(ids: list[int]) -> int:
    return (sum(ids[-3:]) * 7 + 3) % VOCAB


def greedy(prompt: list[int], max_tokens: int, stop: set[int]) -> tuple[list[int], str]:
    out: list[int] = []
    for _ in range(max_tokens):
        token = next_token(prompt + out)
        out.append(token)
        if token in stop:
            return out, "stop"
    return out, "length"


def record(entry: dict[str, Any]) -> None:
    if RECORD:
        with open(RECORD, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **entry}) + "\n")


class KvEvents:
    """The fake's prefix cache and its event publisher."""

    def __init__(self, endpoint: str, replay_endpoint: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(endpoint)
        self.replay = self.ctx.socket(zmq.ROUTER)
        self.replay.bind(replay_endpoint)
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=1000)
        self.cached: set[bytes] = set()
        self.last: list[bytes] = []
        self.next = ""
        """"skip" or "junk": what happens to the next message."""

    def publish(self, events: list[dict[str, Any]]) -> None:
        payload = bytes(msgpack.packb([time.time(), events, 0]))
        seq, self.seq = self.seq, self.seq + 1
        self.buffer.append((seq, payload))
        what, self.next = self.next, ""
        if what == "skip":
            return  # lost on the way (the replay socket still has it)
        if what == "junk":
            payload = b"\xc1 not a batch"
        self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

    def store(self, prompt: list[int]) -> None:
        hashes: list[bytes] = []
        parent: bytes | None = None
        for i in range(0, len(prompt) - FAKE_BLOCK + 1, FAKE_BLOCK):
            parent = hashlib.sha256(repr((parent, prompt[i : i + FAKE_BLOCK])).encode()).digest()
            hashes.append(parent)
        self.last = hashes
        first = next((i for i, h in enumerate(hashes) if h not in self.cached), len(hashes))
        if first == len(hashes):
            return
        self.cached.update(hashes[first:])
        self.publish([{
            "type": "BlockStored", "block_hashes": hashes[first:],
            "parent_block_hash": hashes[first - 1] if first else None,
            "token_ids": prompt[first * FAKE_BLOCK : len(hashes) * FAKE_BLOCK],
            "block_size": FAKE_BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None,
            "group_idx": 0,
        }])  # fmt: skip

    def act(self, op: str, index: int) -> None:
        if op in ("skip", "junk"):
            self.next = op
        elif op == "clear":
            self.cached.clear()
            self.publish([{"type": "AllBlocksCleared"}])
        elif op == "remove":
            h = self.last[index]
            self.cached.discard(h)
            self.publish([{"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU"}])

    async def serve_replay(self) -> None:
        while True:
            frames = await self.replay.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self.buffer):
                if seq >= start:
                    await self.replay.send_multipart(
                        [client, b"", b"", seq.to_bytes(8, "big"), payload]
                    )
            await self.replay.send_multipart([client, b"", b"", END_SEQ, b""])


class Fake:
    def __init__(self, events: KvEvents | None = None) -> None:
        self.sent: dict[str, int] = {}
        """transfer id -> KV bytes "sent" (verified at once)."""
        self.loads: dict[str, str] = {}
        """transfer id -> the agent's ``load_result`` state of a ``do_remote_prefill`` request."""
        self.running = 0
        self.pace_gbps: float | None = None
        """The connector's pace (``pace_gbps`` of its settings, then ``set_pace``'s)."""
        self.link_gbps: float | None = None
        """The link's rate its estimate starts from (``link_gbps``, then ``set_pace``'s)."""
        self.link = "cross-site"
        """Its destination link's name (the settings' ``link``)."""
        self.events = events


def make_app(fake: Fake) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("")

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {fake.running}.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.125\n'
            'vllm:cache_config_info{block_size="128",kv_cache_memory_bytes="1048576",'
            'num_gpu_blocks="8",engine="0"} 1.0\n'
        )

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        prompt = body["prompt"]
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return JSONResponse({"error": "prompt must be token ids"}, status_code=400)
        params = body.get("kv_transfer_params")
        record({"kind": "completion", "stream": bool(body.get("stream")), "body": body})
        out, finish = greedy(prompt, int(body["max_tokens"]), set(body.get("stop_token_ids", [])))
        if fake.events is not None:
            fake.events.store(prompt)
        slow = SLOW_TOKEN in prompt
        if params and params.get("do_remote_prefill"):
            tid = params["prfaas"]["transfer_id"]
            fake.loads[tid] = "recomputed" if RECOMPUTE_TOKEN in prompt else "installed"
        if not body.get("stream"):
            fake.running += 1
            try:
                await asyncio.sleep(SLOW_PREFILL_S if slow else 0.0)
            finally:
                fake.running -= 1
            if params and params.get("do_remote_decode"):
                p = params["prfaas"]
                fake.sent[p["transfer_id"]] = (len(prompt) - p["skip_tokens"]) * BYTES_PER_TOKEN
            return {
                "choices": [{"index": 0, "token_ids": out, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "prompt_tokens_details": {"cached_tokens": 0},
                },
                "kv_transfer_params": {"prfaas": {"transfer_id": params["prfaas"]["transfer_id"]}}
                if params
                else None,
            }

        async def chunks() -> AsyncIterator[bytes]:
            fake.running += 1
            try:
                for i, token in enumerate(out):
                    await asyncio.sleep(SLOW_TOKEN_S if slow else 0.0)
                    last = i == len(out) - 1
                    choice = {
                        "index": 0, "text": TOKEN_TEXT, "token_ids": [token],
                        "finish_reason": finish if last else None,
                    }  # fmt: skip
                    # Raw UTF-8, as vLLM writes it: line separators stay unescaped in the text.
                    data = json.dumps({"choices": [choice]}, ensure_ascii=False)
                    yield f"data: {data}\n\n".encode()
                yield b"data: [DONE]\n\n"
            finally:
                fake.running -= 1

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.post("/fake/kv")
    async def kv(request: Request) -> dict[str, bool]:
        body = await request.json()
        assert fake.events is not None
        fake.events.act(body["op"], int(body.get("index", 0)))
        return {"ok": True}

    return app


async def serve_agent(fake: Fake, path: str) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        req = json.loads(line)
        record({"kind": "agent", **req})
        op = req["op"]
        if op == "wait_sent":
            deadline = time.monotonic() + req["timeout_s"]
            while req["transfer_id"] not in fake.sent and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            sent = fake.sent.get(req["transfer_id"])
            answer: dict[str, Any] = (
                {"state": "verified", "kv_bytes": sent, "error": ""}
                if sent is not None
                else {"state": "timeout", "kv_bytes": 0, "error": "no session"}
            )
        elif op == "abort":
            answer = {"aborted": fake.sent.pop(req["transfer_id"], None) is not None}
        elif op == "load_result":
            answer = {"state": fake.loads.get(req["transfer_id"], "unknown")}
        elif op == "set_pace":
            fake.pace_gbps = fake.link_gbps = float(req["gbps"])
            answer = {"pace_gbps": fake.pace_gbps}
        else:
            pace = None if fake.pace_gbps is None else fake.pace_gbps * 1e9 / 8
            configured = fake.link_gbps * 1e9 / 8 if fake.link_gbps else (pace or 0.0)
            # The connector's reading of its destination link (a paced one measures).
            link = {
                "link": fake.link, "configured_bytes_per_s": configured,
                "pace_bytes_per_s": pace, "capacity_bytes_per_s": 7e7 if pace else 0.0,
                "basis": "measured" if pace else "", "backlog_bytes": 13, "rtt_s": 0.002,
                "retransmit_rate": 0.0,
            }  # fmt: skip
            answer = {
                "links": [link], "handshake_failures": 1, "staged_bytes": 0,
                "sessions_sent": len(fake.sent), "sessions_received": 0,
                "loads_ok": 0, "loads_failed": 0,
                "cross_site_bytes": sum(fake.sent.values()), "cross_site_unsent_bytes": 17,
            }  # fmt: skip
        writer.write(json.dumps(answer).encode() + b"\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path)
    os.chmod(path, 0o600)
    return server


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--kv-transfer-config", required=True)
    p.add_argument("--kv-events-config")
    args, _ = p.parse_known_args()
    extra = json.loads(args.kv_transfer_config)["kv_connector_extra_config"]
    kv_events = json.loads(args.kv_events_config) if args.kv_events_config else None
    record({"kind": "start", "psk_set": bool(os.environ.get(extra["psk_env"])), "extra": extra,
            "kv_events": kv_events})  # fmt: skip
    await asyncio.sleep(START_DELAY_S)  # "loading the model": /health refuses meanwhile
    events = None
    if kv_events is not None:
        events = KvEvents(kv_events["endpoint"], kv_events["replay_endpoint"])
    fake = Fake(events)
    fake.pace_gbps = extra.get("pace_gbps")
    fake.link_gbps = extra.get("link_gbps")
    fake.link = extra.get("link", "cross-site")
    agent = await serve_agent(fake, extra["agent_socket"])
    # A stop cuts what is still in flight after 1 s (a slow prefill sleeps 30 s): without it the
    # sidecar's SIGKILL fallback waited out its 10 s grace in every test that left one running.
    config = uvicorn.Config(
        make_app(fake), host=args.host, port=args.port, log_level="warning",
        timeout_graceful_shutdown=1,
    )  # fmt: skip
    replay = asyncio.create_task(events.serve_replay()) if events is not None else None
    async with agent:
        await uvicorn.Server(config).serve()
    if replay is not None:
        replay.cancel()


if __name__ == "__main__":
    asyncio.run(main())
