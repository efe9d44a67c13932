"""Batched packet-socket IO for the user datapaths: PACKET_MMAP rings (TPACKET_V2).

A user datapath forwards every frame of a fabric in one Python thread; one ``recv`` and one
``send`` system call per frame were about a third of its time (``benchmarks/
bench_user_datapath.py --profile``). ``PortRing`` puts two rings in one mapping of a packet
socket's memory:

- RX: the kernel writes each frame it accepts for the socket (after the socket's BPF filter)
  into the next slot and marks it ``TP_STATUS_USER``; ``recv_batch`` copies out every ready
  frame without a system call and hands the slots back. A frame longer than a slot is also
  queued on the socket whole (``PACKET_COPY_THRESH``; its slot says ``TP_STATUS_COPY``) and
  is read with ``recv`` in its turn, so no frame is ever truncated and order is kept.
- TX: ``send_batch`` writes frames into free slots and one ``send`` makes the kernel transmit
  them all. A frame longer than a slot, or with no slot free, goes out with a plain ``send``
  after the slots before it. A batch the kernel refused (the link is down) is dropped, not
  left in the ring to leave when the link comes back: a cable loses what it cannot carry.

TPACKET_V2, not V3: V3 hands frames over in blocks that are retired when full or after a
timeout of at least a millisecond, which would add up to that much latency per hop at low
rates; V2 wakes the reader for every frame like a plain socket, and batches only when frames
are waiting anyway. Poll/epoll on the socket works as before (readable while a slot is ready).

Sizes: ``SLOT`` bytes a slot (a 1 KiB-payload IB or RoCE frame fits; bigger ones take the
copy/plain path), ``RX_SLOTS`` and ``TX_SLOTS`` slots. The ring's pages are the kernel's own
memory (not the socket's receive buffer): 8 pages a port here.
"""

from __future__ import annotations

import mmap
import socket
import struct

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_COPY_THRESH = 7
PACKET_VERSION = 10
PACKET_TX_RING = 13
TPACKET_V2 = 1

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_COPY = 2
TP_STATUS_AVAILABLE = 0
TP_STATUS_SEND_REQUEST = 1
TP_STATUS_SENDING = 2
TP_STATUS_WRONG_FORMAT = 4

HDR = struct.Struct("=IIIHH")
"""tpacket2_hdr's tp_status, tp_len, tp_snaplen, tp_mac, tp_net (then stamps and VLAN)."""
TX_DATA = 32
"""Where a TX slot's frame starts: TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)."""
SLOT = 2048
RX_SLOTS = 256
TX_SLOTS = 64
BLOCK = 1 << 16


def _req(slots: int) -> bytes:
    per_block = BLOCK // SLOT
    return struct.pack("=IIII", BLOCK, (slots + per_block - 1) // per_block, SLOT, slots)


class PortRing:
    """RX and TX rings on the packet socket ``sock`` (bound, before any frame is read)."""

    __slots__ = ("_rx_slots", "_tx_base", "_tx_slots", "map", "rx_copied", "rx_next", "sock", "tx_dropped",
                 "tx_next", "tx_plain")

    def __init__(self, sock: socket.socket, *, rx_slots: int = RX_SLOTS, tx_slots: int = TX_SLOTS) -> None:
        per_block = BLOCK // SLOT
        rx_slots = -(-rx_slots // per_block) * per_block
        tx_slots = -(-tx_slots // per_block) * per_block
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        sock.setsockopt(SOL_PACKET, PACKET_COPY_THRESH, 1)
        sock.setsockopt(SOL_PACKET, PACKET_RX_RING, _req(rx_slots))
        sock.setsockopt(SOL_PACKET, PACKET_TX_RING, _req(tx_slots))
        self.sock = sock
        self.map = mmap.mmap(sock.fileno(), (rx_slots + tx_slots) * SLOT, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self._rx_slots = rx_slots
        self._tx_slots = tx_slots
        self._tx_base = rx_slots * SLOT
        self.rx_next = 0
        self.tx_next = 0
        self.rx_copied = 0
        """Frames longer than a slot, read whole from the socket."""
        self.tx_plain = 0
        """Frames sent with a plain ``send`` (longer than a slot, or the ring was full)."""
        self.tx_dropped = 0
        """Frames the kernel refused (link down, queue full): lost like on a cable."""

    def close(self) -> None:
        """Unmap the rings (the socket stays the caller's to close)."""
        self.map.close()

    # ------------------------------------------------------------------ receive

    def recv_batch(self, limit: int = 256) -> list[bytes]:
        """Up to ``limit`` frames waiting in the ring, in arrival order; [] when none is."""
        m = self.map
        i = self.rx_next
        n = self._rx_slots
        out: list[bytes] = []
        unpack = HDR.unpack_from
        while len(out) < limit:
            off = i * SLOT
            status, length, snap, mac, _net = unpack(m, off)
            if not status & TP_STATUS_USER:
                break
            if status & TP_STATUS_COPY:
                try:
                    out.append(self.sock.recv(65536))  # the whole frame, queued beside the ring
                    self.rx_copied += 1
                except OSError:
                    pass  # the receive buffer had no room for the copy: lost, as on a full queue
            elif snap == length:
                out.append(m[off + mac:off + mac + snap])
            m[off:off + 4] = b"\0\0\0\0"  # TP_STATUS_KERNEL: the slot is the kernel's again
            i += 1
            if i == n:
                i = 0
        self.rx_next = i
        return out

    # ------------------------------------------------------------------ send

    def send_batch(self, frames: list[bytes] | list[bytearray] | list[bytes | bytearray]) -> int:
        """Transmit ``frames`` in order; how many the kernel took (the rest are dropped)."""
        m = self.map
        base = self._tx_base
        n = self._tx_slots
        i = self.tx_next
        pending = 0
        sent = 0
        room = SLOT - TX_DATA
        pack = HDR.pack_into
        for frame in frames:
            ln = len(frame)
            off = base + i * SLOT
            if ln > room or m[off] != TP_STATUS_AVAILABLE:
                if pending:
                    sent += self._flush(i, pending)
                    pending = 0
                if ln > room or m[off] != TP_STATUS_AVAILABLE:
                    self.tx_plain += 1
                    try:
                        self.sock.send(frame)
                        sent += 1
                    except OSError:
                        self.tx_dropped += 1
                    continue
            m[off + TX_DATA:off + TX_DATA + ln] = frame
            pack(m, off, TP_STATUS_SEND_REQUEST, ln, ln, 0, 0)
            pending += 1
            i += 1
            if i == n:
                i = 0
        self.tx_next = i
        if pending:
            sent += self._flush(i, pending)
        return sent

    def _flush(self, end: int, count: int) -> int:
        """Make the kernel send the ``count`` slots before ``end``; slots it left are dropped."""
        try:
            self.sock.send(b"", socket.MSG_DONTWAIT)
        except OSError:
            pass
        m = self.map
        base = self._tx_base
        n = self._tx_slots
        if m[base + ((end - 1) % n) * SLOT] == TP_STATUS_AVAILABLE:
            return count  # the kernel sends in ring order and stops at the first it refuses
        left = 0
        for k in range(end - count, end):
            off = base + (k % n) * SLOT
            status = m[off]
            if status != TP_STATUS_AVAILABLE:  # refused or malformed: a lost frame, not a late one
                if status != TP_STATUS_SENDING:
                    m[off:off + 4] = b"\0\0\0\0"
                left += 1
        self.tx_dropped += left
        return count - left
