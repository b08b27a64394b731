"""A userspace delay line: forwards raw Ethernet frames between two interfaces after a fixed delay.

The kernel here has no ``netem``, so RTT is emulated by this relay, run in a middle network
namespace that has no addresses: every frame received on one interface is sent out of the other
``delay_s`` later (FIFO per direction, so no reordering and no loss unless a queue bound is hit).
It forwards TCP end to end (it is not a proxy), so the bandwidth-delay effect on TCP is real.
``PACKET_VNET_HDR`` keeps GSO/GRO super-frames whole (up to 64 KiB per frame), so a few thousand
frames per second carry gigabits. Standard library only; the process exits when its parent dies.

Run: ``python -m prfaas.netlab.delayline IFACE_A IFACE_B DELAY_S [--max-queue-bytes N]``
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4
_FRAME_BYTES = 65536 + 64


def _open(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
    s.bind((ifname, 0))
    s.setblocking(False)
    return s


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def run(if_a: str, if_b: str, delay_s: float, max_queue_bytes: int) -> None:
    socks = [_open(if_a), _open(if_b)]
    queues: list[collections.deque[tuple[float, bytes]]] = [
        collections.deque(),
        collections.deque(),
    ]
    queued = [0, 0]
    dropped = 0
    ep = select.epoll()
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
    fd_index = {s.fileno(): i for i, s in enumerate(socks)}
    buf = bytearray(_FRAME_BYTES)
    view = memoryview(buf)
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        timeout = -1.0
        for q in queues:
            if q:
                wait = q[0][0] - now
                timeout = max(0.0, wait) if timeout < 0 else min(timeout, max(0.0, wait))
        for fd, _ in ep.poll(timeout):
            src = fd_index[fd]
            s = socks[src]
            while True:
                try:
                    n, addr = s.recvfrom_into(buf)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue  # our own transmissions on this interface
                if queued[src] + n > max_queue_bytes:
                    dropped += 1
                    continue
                queues[src].append((time.monotonic() + delay_s, bytes(view[:n])))
                queued[src] += n
        now = time.monotonic()
        for src, q in enumerate(queues):
            out = socks[1 - src]
            while q and q[0][0] <= now:
                frame = q[0][1]
                try:
                    out.send(frame)
                except BlockingIOError:
                    break  # the other side's queue is full: retry on the next round
                except OSError as exc:
                    print(f"drop ({exc})", file=sys.stderr, flush=True)
                q.popleft()
                queued[src] -= len(frame)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("if_a")
    p.add_argument("if_b")
    p.add_argument("delay_s", type=float)
    p.add_argument("--max-queue-bytes", type=int, default=256 << 20)
    p.add_argument("--run-id", default="", help="the testbed run (lets a sweep find this process)")
    args = p.parse_args()
    _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run(args.if_a, args.if_b, args.delay_s, args.max_queue_bytes)


if __name__ == "__main__":
    main()
