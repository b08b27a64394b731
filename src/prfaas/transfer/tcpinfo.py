"""Read Linux ``TCP_INFO`` for one socket (RTT, cwnd, retransmits, delivery rate, ...).

The first 232 bytes of ``struct tcp_info`` (linux/tcp.h, kernel >= 5.x) in one struct format;
MEASURED.md checked the values against ``ss -tin``. Returns None where the option is unsupported.
I/O: one getsockopt, about 1 us.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

# u8 x8 | rto ato snd_mss rcv_mss | unacked sacked lost retrans fackets | last_* x4 |
# pmtu rcv_ssthresh rtt rttvar snd_ssthresh snd_cwnd advmss reordering | rcv_rtt rcv_space |
# total_retrans | pacing_rate max_pacing_rate bytes_acked bytes_received (u64) | segs_out segs_in |
# notsent_bytes min_rtt data_segs_in data_segs_out | delivery_rate (u64) |
# busy_time rwnd_limited sndbuf_limited (u64) | delivered delivered_ce | bytes_sent bytes_retrans
# (u64) | dsack_dups reord_seen | rcv_ooopack snd_wnd
_FMT = struct.Struct("<8B4I5I4I8I2II4Q2I4IQ3Q2I2Q2I2I")
assert _FMT.size == 232
_TCP_INFO = getattr(socket, "TCP_INFO", 11)


@dataclass(frozen=True, slots=True)
class TcpInfo:
    rtt_s: float
    rttvar_s: float
    min_rtt_s: float
    snd_cwnd: int
    unacked: int
    total_retrans: int
    lost: int
    segs_out: int
    bytes_acked: int
    bytes_sent: int
    notsent_bytes: int
    delivery_rate_bytes_per_s: int
    pacing_rate_bytes_per_s: int
    sndbuf_limited_us: int
    """Time the connection was limited by its send buffer (a tcp_wmem cap shows here)."""


def read_tcp_info(sock: socket.socket) -> TcpInfo | None:
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 280)
    except OSError:
        return None
    if len(raw) < _FMT.size:
        return None
    f = _FMT.unpack_from(raw)
    # Field positions in the flat tuple (see the format comment).
    return TcpInfo(
        rtt_s=f[23] / 1e6,
        rttvar_s=f[24] / 1e6,
        min_rtt_s=f[39] / 1e6,
        snd_cwnd=f[26],
        unacked=f[12],
        total_retrans=f[31],
        lost=f[14],
        segs_out=f[36],
        bytes_acked=f[34],
        bytes_sent=f[48],
        notsent_bytes=f[38],
        delivery_rate_bytes_per_s=f[42],
        pacing_rate_bytes_per_s=f[32],
        sndbuf_limited_us=f[45],
    )
