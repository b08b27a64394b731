"""The connector's staging (``prfaas.integrations.vllm.staging``) without vLLM or a GPU: the CPU
path hands the gathered tensor's own memory to the sender (no copy); the device path, run on a
fake device whose copies land when the test says, never blocks the caller, hands bytes over only
once their copy has landed, in order, with END after the session's bytes and a failed copy
failing its session alone. Plus the device-agnostic layout code on a device other than the CPU
(``meta``: shapes only) and, where CUDA is present, one round trip through ``CudaCopies``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from prfaas.integrations.vllm import layout as L
from prfaas.integrations.vllm.staging import (
    CudaCopies,
    DeviceStaging,
    HostStaging,
    staging_for,
)
from prfaas.spec import DType

WAIT_S = 10.0


class RecordingSender:
    """``TransferThread``'s sending methods, recorded (bytes copied at the call)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.keeps: list[object] = []
        self.views: list[memoryview] = []
        self._cond = threading.Condition()

    def send(
        self, transfer_id: str, layer: int, offset: int, data: memoryview, keep: object
    ) -> None:
        with self._cond:
            self.calls.append(("send", transfer_id, layer, offset, bytes(data)))
            self.keeps.append(keep)
            self.views.append(data)
            self._cond.notify_all()

    def finish_send(self, transfer_id: str) -> None:
        with self._cond:
            self.calls.append(("finish", transfer_id))
            self._cond.notify_all()

    def fail_send(self, transfer_id: str, reason: str) -> None:
        with self._cond:
            self.calls.append(("fail", transfer_id, reason))
            self._cond.notify_all()

    def wait_for(self, n: int) -> list[tuple[Any, ...]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= n, WAIT_S), self.calls
            return list(self.calls)


class Gate:
    """A copy in flight: ``wait`` returns once the test opens it (then the bytes have landed)."""

    def __init__(self, host: torch.Tensor, source: torch.Tensor) -> None:
        self._opened = threading.Event()
        self._host, self._source = host, source
        self._error: Exception | None = None

    def open(self, error: Exception | None = None) -> None:
        self._error = error
        self._opened.set()

    def wait(self) -> None:
        if not self._opened.wait(WAIT_S):
            raise TimeoutError("the test never opened this copy")
        if self._error is not None:
            raise self._error
        self._host.copy_(self._source)  # the copy lands


class GatedCopies:
    """A fake device: its "device" tensors are CPU tensors, its copies land when opened."""

    def __init__(self) -> None:
        self.gates: list[Gate] = []
        self.to_device_calls = 0

    def to_host(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Gate]:
        host = torch.full_like(tensor, -1.0)  # not the bytes yet
        gate = Gate(host, tensor.clone())
        self.gates.append(gate)
        return host, gate

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        self.to_device_calls += 1
        return tensor.clone()


def _t(value: float, n: int = 4) -> torch.Tensor:
    return torch.full((n, 2), value)


def test_host_staging_sends_the_tensors_own_memory() -> None:
    sender = RecordingSender()
    staging = HostStaging(sender)
    k = torch.arange(12, dtype=torch.float32).view(3, 4)
    staging.send("t", 2, 64, k)
    assert sender.keeps[0] is k  # the tensor itself is kept alive, no staging copy
    k[0, 0] = 99.0  # the memoryview is the tensor's memory
    assert torch.frombuffer(bytearray(sender.views[0]), dtype=torch.float32)[0].item() == 99.0
    assert sender.calls[0][:4] == ("send", "t", 2, 64)
    t = torch.ones(3)
    assert staging.to_device(t) is t


def test_device_staging_hands_bytes_over_only_once_copied_in_order() -> None:
    sender, copies = RecordingSender(), GatedCopies()
    staging = DeviceStaging(sender, copies)
    try:
        a, b = _t(1.0), _t(2.0)
        staging.send("s", 0, 0, a)  # returns with its copy still in flight
        staging.send("s", 0, 32, b)
        staging.finish("s")  # queued before either copy landed
        time.sleep(0.05)
        assert sender.calls == []  # nothing handed over before its copy landed
        copies.gates[1].open()  # the second copy lands first: still held behind the first
        time.sleep(0.05)
        assert sender.calls == []
        copies.gates[0].open()
        calls = sender.wait_for(3)
    finally:
        staging.close()
    assert calls == [
        ("send", "s", 0, 0, a.numpy().tobytes()),
        ("send", "s", 0, 32, b.numpy().tobytes()),
        ("finish", "s"),
    ]
    assert all(isinstance(k, torch.Tensor) for k in sender.keeps)  # the host copies, kept


def test_a_failed_copy_fails_its_session_alone() -> None:
    sender, copies = RecordingSender(), GatedCopies()
    staging = DeviceStaging(sender, copies)
    try:
        staging.send("bad", 1, 0, _t(1.0))
        staging.send("good", 1, 0, _t(2.0))
        staging.send("bad", 1, 32, _t(3.0))
        staging.finish("bad")
        staging.finish("good")
        copies.gates[0].open(RuntimeError("device lost"))
        copies.gates[1].open()
        copies.gates[2].open()
        calls = sender.wait_for(3)
        time.sleep(0.05)
    finally:
        staging.close()
    assert [c[:2] for c in sender.calls] == [("fail", "bad"), ("send", "good"), ("finish", "good")]
    assert "device lost" in calls[0][2]


def test_fail_is_ordered_after_what_was_queued_and_close_drains() -> None:
    sender, copies = RecordingSender(), GatedCopies()
    staging = DeviceStaging(sender, copies)
    staging.send("s", 0, 0, _t(1.0))
    staging.fail("s", "the request ended")
    copies.gates[0].open()
    staging.close()
    assert [c[0] for c in sender.calls] == ["send", "fail"]
    # Installs go through the device's copy.
    assert DeviceStaging(RecordingSender(), copies).to_device(_t(1.0)).shape == (4, 2)
    assert copies.to_device_calls == 1


def test_staging_for_a_device() -> None:
    assert isinstance(staging_for(torch.device("cpu"), RecordingSender()), HostStaging)
    with pytest.raises(L.LayoutError, match="no KV staging"):
        staging_for(torch.device("meta"), RecordingSender())


def test_layout_indexes_on_the_caches_device() -> None:
    """On a cache that is not in host memory (``meta`` here, a GPU in production) the index
    tensors are made on its device, the gather's copies stay there, and a state's export is
    made there (a host tensor would need a synchronous copy, or fail)."""
    blocks, rows = L.token_slots([3, 1], 16, 5, 20, torch.device("meta"))
    assert blocks.device.type == rows.device.type == "meta"
    cpu_blocks, cpu_rows = L.token_slots([3, 1], 16, 5, 20)
    assert cpu_blocks.tolist()[:11] == [3] * 11 and cpu_rows.tolist()[-1] == 3
    kv = torch.empty(8, 2, 16, 64, device="meta")
    paged = L.paged_kv(kv, 2, 32, halves="dims")
    k, _ = L.gather(paged, [3, 1], 5, 20)
    assert k.device.type == "meta" and k.shape == (15, 2, 32) and k.is_contiguous()
    lin = L.LinearState((2, 4, 8), DType.FP32, 6, 4, DType.BF16)
    conv = torch.empty(3, 6, 3, dtype=torch.bfloat16, device="meta")
    ssm = torch.empty(3, 2, 8, 4, dtype=torch.bfloat16, device="meta")
    state, conv_out = L.export_state(L.PagedState(conv, ssm), lin, 1)
    assert state.device.type == conv_out.device.type == "meta"
    assert state.shape == (2, 4, 8) and conv_out.shape == (6, 4)


def test_dims_halves_follow_the_cuda_backends_view() -> None:
    """vLLM 0.32's CUDA backends keep ``[blocks, heads, block_size, 2 * head_dim]`` and read it
    as ``transpose(1, 2).split(head_dim, -1)``: K's dims then V's, per token and head."""
    nb, h, bs, d = 4, 2, 8, 16
    kv = torch.zeros(nb, h, bs, 2 * d)
    key_cache, value_cache = kv.transpose(1, 2).split(d, dim=-1)  # as flash_attn views it
    for b in range(nb):
        for r in range(bs):
            key_cache[b, r] = b * 100 + r
            value_cache[b, r] = -(b * 100 + r)
    paged = L.paged_kv(kv, h, d, halves="dims")
    k, v = L.gather(paged, [2, 0], 6, 11)  # crosses a block boundary
    assert k[:, 0, 0].tolist() == [206, 207, 0, 1, 2]
    assert v[:, 1, 3].tolist() == [-206, -207, 0, -1, -2]
    L.scatter(paged, [3], 0, k[:2] + 1000, v[:2] - 1000)
    assert key_cache[3, 0, 1, 5].item() == 1206 and value_cache[3, 1, 0, 0].item() == -1207
    # The CPU reading of the same tensor is another one: the halves must be chosen right.
    assert not torch.equal(L.gather(L.paged_kv(kv, h, d), [2, 0], 6, 11)[0], k)
    with pytest.raises(L.LayoutError):
        L.paged_kv(kv, h, d, halves="tokens")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_copies_round_trip() -> None:  # pragma: no cover - GPU machines only
    device = torch.device("cuda")
    sender = RecordingSender()
    staging = DeviceStaging(sender, CudaCopies(device))
    try:
        kv = torch.randn(4, 2, 16, 64, device=device)
        paged = L.paged_kv(kv, 2, 32, halves="dims")
        k, _ = L.gather(paged, [1, 3], 4, 30)
        staging.send("c", 0, 0, k)
        staging.finish("c")
        calls = sender.wait_for(2)
    finally:
        staging.close()
    assert calls[0][4] == k.cpu().numpy().tobytes() and calls[1] == ("finish", "c")
    back = staging.to_device(torch.frombuffer(bytearray(calls[0][4]), dtype=torch.float32))
    assert torch.equal(back.view_as(k), k)
