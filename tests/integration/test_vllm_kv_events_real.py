"""The sidecar's KV event subscriber against vLLM's own publisher (``ZmqEventPublisher`` of
vllm 0.32, run in ``.venv-vllm`` without a model): batches published before the subscriber
connected come through the replay socket (what a server lifetime's start asks for), later ones
live, in order, and the translator's entries are the prfaas hashes of the stored tokens. A
second KV cache group's batch then turns the report off. Needs ``.venv-vllm`` (skipped
otherwise); ~15 s, most of it importing vllm."""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from prfaas.serve.demo_vllm import VLLM_PYTHON
from prfaas.serve.gateway.hashing import block_hashes
from prfaas.serve.vllm.kv_events import KvEventSubscriber
from prfaas.serve.vllm.server import KvEventsEndpoints

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no {VLLM_PYTHON}"),
]

PUBLISHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher

    d = Path(sys.argv[1])
    pub = ZmqEventPublisher(0, endpoint=f"ipc://{d}/ev.sock",
                            replay_endpoint=f"ipc://{d}/rp.sock", buffer_steps=100)
    parent = None

    def publish(i, group=0):
        global parent
        h = bytes([i + 1]) * 32
        pub.publish(KVEventBatch(ts=time.time(), events=[BlockStored(
            block_hashes=[h], parent_block_hash=parent, token_ids=list(range(i * 16, i * 16 + 16)),
            block_size=16, lora_id=None, medium="GPU", lora_name=None, group_idx=group)]))
        parent = h

    for i in range(3):  # before anyone subscribed: only the replay socket has them
        publish(i)
    (d / "published").write_text("")
    while not (d / "go").exists():
        time.sleep(0.05)
    for i in range(3, 6):
        publish(i)
    while not (d / "group").exists():
        time.sleep(0.05)
    publish(6, group=1)
    while not (d / "stop").exists():
        time.sleep(0.05)
    pub.shutdown()
    """
)


class _Life:
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()
        self.num_starts = 1


async def _until(check: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_replayed_then_live_batches_of_vllms_own_publisher(tmp_path: Path) -> None:
    script = tmp_path / "pub.py"
    script.write_text(PUBLISHER)
    proc = subprocess.Popen([str(VLLM_PYTHON), str(script), str(tmp_path)])
    sub = KvEventSubscriber(
        KvEventsEndpoints(f"ipc://{tmp_path}/ev.sock", f"ipc://{tmp_path}/rp.sock"), 32
    )
    task: asyncio.Task[None] | None = None
    try:
        await _until(lambda: (tmp_path / "published").exists() or proc.poll() is not None,
                     "vLLM's publisher")  # fmt: skip
        assert proc.poll() is None, "the publisher died"
        task = asyncio.create_task(sub.run(_Life()))
        want = [(h, (k + 1) * 32) for k, h in enumerate(block_hashes(list(range(96)), 32))]
        await _until(lambda: len(sub.translator.entries()) == 1, "the replayed blocks")
        assert sub.translator.entries() == want[:1]  # 48 tokens replayed: one prfaas block
        (tmp_path / "go").write_text("")
        await _until(lambda: len(sub.translator.entries()) == 3, "the live blocks")
        assert sorted(sub.translator.entries(), key=lambda e: e[1]) == want
        assert sub.num_lost == 0 and sub.num_lifetimes == 1
        (tmp_path / "group").write_text("")
        await _until(lambda: sub.translator.disabled != "", "a second KV cache group")
        assert sub.translator.entries() == []
    finally:
        (tmp_path / "stop").write_text("")
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
