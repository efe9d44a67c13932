"""Capture the frames crossing one cable end into a pcap file tshark decodes.

An ETH_P_ALL packet socket on a port sees both directions of its cable. Native IB frames
are written as ERF/InfiniBand records, anything else (RoCEv2) as Ethernet.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import trio

from ibemu.kernel.packet import ETH_P_ALL, open_packet_socket
from ibemu.wire.capture import PcapWriter

log = logging.getLogger(__name__)


async def capture(ns: str, ifname: str, path: Path, *, kind: str = "ib",
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Record until cancelled; ``kind`` "ib" keeps only 0x88B5 frames (as ERF records)."""
    sock = await trio.to_thread.run_sync(open_packet_socket, ns, ifname, ETH_P_ALL)
    writer = PcapWriter(path, kind)
    task_status.started()
    try:
        while True:
            await trio.lowlevel.wait_readable(sock)
            while True:
                try:
                    frame = sock.recv(9216)
                except BlockingIOError:
                    break
                if kind == "ib" and frame[12:14] != b"\x88\xb5":
                    continue
                writer.write(frame, ts_ns=time.time_ns())
            writer.flush()
    finally:
        writer.close()
        sock.close()
        log.info("capture %s/%s: %d frames -> %s", ns, ifname, writer.count, path)
