"""Capture the frames crossing one cable end into pcap files tshark decodes.

An ETH_P_ALL packet socket on a port sees both directions of its cable, whatever forwards
them (the kernel datapath's tc programs, the user datapath's packet sockets, a RoCE fabric's
kernel IP routers or user routers). A native IB fabric's frames (ethertype 0x88B5) are written
as ERF/InfiniBand records and anything else on its cables is skipped; a RoCE fabric's cables
carry Ethernet (RoCEv2 over IPv4/UDP 4791, ARP...), written as they are.

The files are bounded (``ibemu.wire.capture.RotatingPcap``): ``snaplen`` bytes a frame at
most, ``limit_bytes`` a file, ``files`` files, the newest in ``path``.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import trio

from ibemu.kernel.packet import ETH_P_ALL, SOL_PACKET, open_packet_socket
from ibemu.wire.capture import MAX_FRAME, CaptureStats, RotatingPcap

log = logging.getLogger(__name__)

PACKET_STATISTICS = 6
_TPACKET_STATS = struct.Struct("II")  # tp_packets, tp_drops; reset by each read
CAPTURE_BUFFER = 16 * 1024 * 1024
"""The capture socket's receive buffer: room for bursts while the writer catches up."""


def _drops(sock: socket.socket) -> int:
    """Frames the kernel dropped on ``sock`` since the last call (its buffer was full)."""
    try:
        return _TPACKET_STATS.unpack(sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size))[1]
    except OSError:
        return 0


async def capture(ns: str, ifname: str, path: Path, *, kind: str = "ib", snaplen: int = MAX_FRAME,
                  limit_bytes: int = 100_000_000, files: int = 2,
                  on_stats: Callable[[CaptureStats], None] | None = None,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Record until cancelled; ``kind`` "ib" keeps only 0x88B5 frames (as ERF records), "eth"
    (RoCE) every frame. ``on_stats`` is called once with what the files hold, at the end."""
    sock = await trio.to_thread.run_sync(
        lambda: open_packet_socket(ns, ifname, ETH_P_ALL, buffer_bytes=CAPTURE_BUFFER))
    writer = RotatingPcap(path, "ib" if kind == "ib" else "eth", snaplen=snaplen, limit_bytes=limit_bytes,
                          files=files)
    buf = bytearray(MAX_FRAME)
    view = memoryview(buf)
    dropped = 0
    task_status.started()
    try:
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                try:
                    n = sock.recv_into(buf, MAX_FRAME, socket.MSG_TRUNC)  # n: the frame's whole length
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.ENETDOWN:  # the cable went down (a fault): said once, recorded on
                        log.debug("capture %s/%s: %s", ns, ifname, exc)
                        break
                    if exc.errno in (errno.ENODEV, errno.ENXIO):  # the interface is gone (a switch removed)
                        log.info("capture %s/%s: the interface is gone; the capture ends", ns, ifname)
                        return
                    raise
                if kind == "ib" and buf[12:14] != b"\x88\xb5":
                    continue
                writer.write(view[:min(n, MAX_FRAME, snaplen + (14 if kind == "ib" else 0))],
                             ts_ns=time.time_ns(), orig_len=n)
            writer.flush()
            dropped += _drops(sock)
    finally:
        dropped += _drops(sock)
        writer.close()
        sock.close()
        stats = writer.stats(dropped)
        log.info("capture %s/%s: %d frames, %d bytes in %d files, %d rotations, %d dropped -> %s",
                 ns, ifname, stats.frames, stats.bytes, len(stats.files), stats.rotations, stats.dropped, path)
        if on_stats is not None:
            on_stats(stats)
