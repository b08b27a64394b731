"""Staging: how the connector's tensors reach the transfer thread (prefill side) and the paged
cache (decode side), whatever device vLLM keeps its cache on.

The transfer thread sends bytes of host memory (``layout.as_bytes``: a memoryview of a CPU
tensor). So:
- ``HostStaging`` (vLLM's cache in host memory, the CPU backend): a gathered tensor is host
  memory already and its bytes go as they are, no copy; installs use the received buffers as
  they are. This is the connector's CPU path, unchanged.
- ``DeviceStaging`` (the cache on an accelerator): the gather runs on the device, on vLLM's
  compute stream, into a fresh device tensor (ordered before any later kernel that may reuse the
  request's blocks: vLLM frees them at once), then ``DeviceCopies.to_host`` copies it into host
  memory without waiting for it, and a staging thread waits for each copy, in order, and only
  then hands the host bytes to the transfer thread. Finishing and failing a session go through
  the same queue, so END follows the session's last bytes and an abort follows what was queued
  before it. The forward pass never waits for a copy. Installs copy the verified bytes to the
  device (``DeviceCopies.to_device``) and scatter there.
- ``CudaCopies``: ``DeviceCopies`` for CUDA: device-to-host copies on a side stream that first
  waits (on the device, not the host) for the compute stream's work so far, into pinned host
  memory, each followed by an event the staging thread synchronises on; host-to-device copies
  on the compute stream, asynchronous from pageable memory (CUDA copies such a source into its
  own staging buffer before the call returns, so the received buffers may be released at once)
  and ordered before the scatter and the next forward pass on that stream.
Written for CUDA but untested there (no GPU here): docs/vllm.md "Not done" says what a first GPU
run should check. Imports torch (not vllm).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Protocol

import torch

from prfaas.integrations.vllm.layout import LayoutError, as_bytes

log = logging.getLogger("prfaas.integrations.vllm")


class Sender(Protocol):
    """What staging needs of ``TransferThread`` (its public sending methods)."""

    def send(
        self, transfer_id: str, layer: int, offset: int, data: memoryview, keep: object
    ) -> None: ...

    def finish_send(self, transfer_id: str) -> None: ...

    def fail_send(self, transfer_id: str, reason: str) -> None: ...


class Staging(Protocol):
    """The connector's side of staging (one per Worker process)."""

    def send(self, transfer_id: str, layer: int, offset: int, tensor: torch.Tensor) -> None:
        """Queue ``tensor`` (contiguous, on the cache's device; the caller never writes it
        again) as bytes of manifest layer ``layer`` at ``offset``."""
        ...

    def finish(self, transfer_id: str) -> None:
        """Every byte of the session was handed over: END after them."""
        ...

    def fail(self, transfer_id: str, reason: str) -> None:
        """Give the session up (after whatever was queued for it)."""
        ...

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor (a view of received bytes) on the cache's device; the host bytes may
        be released once this returns."""
        ...

    def close(self) -> None: ...


class HostStaging:
    """vLLM's cache in host memory: tensors go to the transfer thread as they are."""

    def __init__(self, sender: Sender) -> None:
        self._sender = sender

    def send(self, transfer_id: str, layer: int, offset: int, tensor: torch.Tensor) -> None:
        self._sender.send(transfer_id, layer, offset, as_bytes(tensor), tensor)

    def finish(self, transfer_id: str) -> None:
        self._sender.finish_send(transfer_id)

    def fail(self, transfer_id: str, reason: str) -> None:
        self._sender.fail_send(transfer_id, reason)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def close(self) -> None:
        return


class Ready(Protocol):
    def wait(self) -> None:
        """Block until the copy it stands for has landed (raises if the copy failed)."""
        ...


class DeviceCopies(Protocol):
    """The device abstraction ``DeviceStaging`` runs on."""

    def to_host(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Ready]:
        """Start copying device ``tensor`` (as the compute stream will have it once its work so
        far is done) into a new host tensor; returns at once, with the copy's ``Ready``."""
        ...

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """Copy host ``tensor`` to the device, ordered before later work on the compute stream;
        ``tensor``'s memory may be reused once this returns."""
        ...


@dataclass(frozen=True, slots=True)
class _Send:
    transfer_id: str
    layer: int
    offset: int
    host: torch.Tensor
    ready: Ready
    device: torch.Tensor
    """Held until the copy has landed (its memory must not be reused before)."""


@dataclass(frozen=True, slots=True)
class _Finish:
    transfer_id: str


@dataclass(frozen=True, slots=True)
class _Fail:
    transfer_id: str
    reason: str


_Item = _Send | _Finish | _Fail


class DeviceStaging:
    """vLLM's cache on a device: copies to host memory, handed over once landed, in order."""

    def __init__(self, sender: Sender, copies: DeviceCopies, name: str = "prfaas-staging") -> None:
        self._sender = sender
        self._copies = copies
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._failed: set[str] = set()
        """Sessions a copy failed for: their later items are dropped (staging thread only)."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, transfer_id: str, layer: int, offset: int, tensor: torch.Tensor) -> None:
        if not tensor.is_contiguous():
            raise LayoutError("staging needs a contiguous tensor")
        host, ready = self._copies.to_host(tensor)
        self._queue.put(_Send(transfer_id, layer, offset, host, ready, tensor))

    def finish(self, transfer_id: str) -> None:
        self._queue.put(_Finish(transfer_id))

    def fail(self, transfer_id: str, reason: str) -> None:
        self._queue.put(_Fail(transfer_id, reason))

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._copies.to_device(tensor)

    def close(self, timeout_s: float = 10.0) -> None:
        """Hand over what is queued (bounded by ``timeout_s``), then stop the thread."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            tid = item.transfer_id
            if isinstance(item, _Send):
                if tid in self._failed:
                    continue
                try:
                    item.ready.wait()
                except Exception as exc:  # a failed copy fails its session, not the Worker
                    log.exception("transfer %s: copy to host memory failed", tid)
                    self._failed.add(tid)
                    self._sender.fail_send(tid, f"copy to host failed: {type(exc).__name__}: {exc}")
                    continue
                self._sender.send(tid, item.layer, item.offset, as_bytes(item.host), item.host)
            elif isinstance(item, _Finish):
                if tid not in self._failed:
                    self._sender.finish_send(tid)
                self._failed.discard(tid)
            else:
                self._sender.fail_send(tid, item.reason)
                self._failed.discard(tid)


class _EventReady:
    def __init__(self, event: torch.cuda.Event) -> None:
        self._event = event

    def wait(self) -> None:
        self._event.synchronize()  # releases the GIL while it waits


class CudaCopies:
    """``DeviceCopies`` on one CUDA device (see the module docstring for the ordering)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]

    def to_host(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Ready]:
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        # The copy waits (on the device) for what the compute stream was given so far: the
        # gather that made ``tensor``. The host thread does not wait here.
        self._stream.wait_stream(torch.cuda.current_stream(self._device))
        with torch.cuda.stream(self._stream):
            host.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self._stream)
        return host, _EventReady(done)

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self._device, non_blocking=True)


def staging_for(device: torch.device, sender: Sender) -> Staging:
    """The staging for a cache on ``device``; raises ``LayoutError`` for a device it has none
    for (the connector then moves no KV: every remote load recomputes)."""
    if device.type == "cpu":
        return HostStaging(sender)
    if device.type == "cuda":
        return DeviceStaging(sender, CudaCopies(device))
    raise LayoutError(f"no KV staging for a cache on {device} (cpu and cuda only)")
