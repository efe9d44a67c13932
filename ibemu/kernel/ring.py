"""Batched packet-socket receive for the user datapaths: a PACKET_MMAP RX ring (TPACKET_V2).

A user datapath forwards every frame of a fabric in one Python thread; a ``recv`` system call
per frame was a sixth of its time (``benchmarks/bench_user_datapath.py --profile``).
``RxRing`` maps an RX ring of the packet socket: the kernel writes each frame it accepts for
the socket (after the socket's BPF filter) into the next slot and marks it ``TP_STATUS_USER``;
``recv_batch`` copies out every ready frame without a system call and hands the slots back. A
frame longer than a slot is also queued on the socket whole (``PACKET_COPY_THRESH``; its slot
says ``TP_STATUS_COPY``) and is read with ``recv`` in its turn, so no frame is ever truncated
and the order is kept. Frames that arrived before the ring was set up are read the same way.

No TX ring: on a socket with one, ``send`` no longer takes a frame (it flushes the ring), and
the ring saved nothing measurable here (3.5 us a frame either way on a veth: the kernel's work
of delivering the frame to the peer dominates, not the system call).

TPACKET_V2, not V3: V3 hands frames over in blocks that are retired when full or after a
timeout of at least a millisecond, which would add up to that much latency per hop at low
rates; V2 wakes the reader for every frame like a plain socket, and batches only when frames
are waiting anyway. Poll/epoll on the socket works as before (readable while a slot is ready).

Sizes: ``SLOT`` bytes a slot (a 1 KiB-payload IB or RoCE frame fits; bigger ones take the copy
path), ``RX_SLOTS`` slots: 512 KiB of the kernel's memory a port, beside the socket's buffer.
"""

from __future__ import annotations

import ctypes
import mmap
import queue
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Hashable, Sequence

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_COPY_THRESH = 7
PACKET_VERSION = 10
TPACKET_V2 = 1

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1
TP_STATUS_COPY = 2

HDR = struct.Struct("=IIIHH")
"""tpacket2_hdr's tp_status, tp_len, tp_snaplen, tp_mac, tp_net (then stamps and VLAN)."""
SLOT = 2048
RX_SLOTS = 256
BLOCK = 1 << 16


def _req(slots: int) -> bytes:
    per_block = BLOCK // SLOT
    return struct.pack("=IIII", BLOCK, (slots + per_block - 1) // per_block, SLOT, slots)


class RxRing:
    """An RX ring on the packet socket ``sock`` (which stays usable for ``send``)."""

    __slots__ = ("_early", "_rx_slots", "map", "rx_copied", "rx_next", "sock")

    def __init__(self, sock: socket.socket, *, rx_slots: int = RX_SLOTS) -> None:
        per_block = BLOCK // SLOT
        rx_slots = -(-rx_slots // per_block) * per_block
        sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V2)
        sock.setsockopt(SOL_PACKET, PACKET_COPY_THRESH, 1)
        sock.setsockopt(SOL_PACKET, PACKET_RX_RING, _req(rx_slots))
        self.sock = sock
        self._early: list[bytes] = []
        while True:  # frames queued before the ring: read first, or they would keep poll readable
            try:
                self._early.append(sock.recv(65536))
            except OSError:
                break
        self.map = mmap.mmap(sock.fileno(), rx_slots * SLOT, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._rx_slots = rx_slots
        self.rx_next = 0
        self.rx_copied = 0
        """Frames longer than a slot (or queued before the ring), read whole from the socket."""

    def close(self) -> None:
        """Unmap the rings (the socket stays the caller's to close)."""
        self.map.close()

    # ------------------------------------------------------------------ receive

    def recv_batch(self, limit: int = 256) -> list[bytes]:
        """Up to ``limit`` frames waiting, in arrival order; [] when none is."""
        m = self.map
        i = self.rx_next
        n = self._rx_slots
        out: list[bytes] = []
        if self._early:
            out, self._early = self._early, out
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


# ---------------------------------------------------------------------- transmit

class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint32)]


MSG_DONTWAIT = 0x40
TX_SLOT = 9216 + 64
"""Bytes of a transmit slot: the largest frame a user datapath reads (9216) fits."""
TX_BATCH = 128
TX_BUFFERS = 6
DIRECT_MAX = 2
"""Batches this short go out at once from the caller's thread when nothing is queued."""


class _TxBuf:
    """``TX_BATCH`` slots of frame data with the mmsghdr/iovec arrays that point at them."""

    __slots__ = ("data", "iov", "msgs", "view")

    def __init__(self) -> None:
        self.data = ctypes.create_string_buffer(TX_BATCH * TX_SLOT)
        self.view = memoryview(self.data).cast("B")
        self.iov = (_IoVec * TX_BATCH)()
        self.msgs = (_MMsgHdr * TX_BATCH)()
        base = ctypes.addressof(self.data)
        iov0 = ctypes.addressof(self.iov)
        for i in range(TX_BATCH):
            self.iov[i].iov_base = base + i * TX_SLOT
            self.msgs[i].msg_hdr.msg_iov = iov0 + i * ctypes.sizeof(_IoVec)
            self.msgs[i].msg_hdr.msg_iovlen = 1


class TxBatcher:
    """Sends batches of frames on packet sockets from a worker thread, with ``sendmmsg``.

    Why a thread: a frame's ``send`` on a veth costs ~3.5 us of kernel time (the peer's
    receive runs in it), as much as deciding where the frame goes. ``sendmmsg`` through ctypes
    releases the GIL for the whole batch, so the kernel moves one batch on one CPU while the
    forwarding thread decides the next on the other. Frames are copied into preallocated
    slots (no per-frame objects); a socket's frames leave in the order they were given.

    ``send`` blocks (the GIL released) while all ``TX_BUFFERS`` batches are queued: the
    forwarder slows to what the kernel takes, as with a blocking socket, instead of dropping.
    A batch of at most ``DIRECT_MAX`` frames while nothing is queued is sent at once from the
    caller's thread: at low rates a frame is not delayed by a hand-over between threads.
    A frame the kernel refuses (the link is down, its queue full) is lost like on a cable and
    counted in ``dropped`` by the key given with it.
    """

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._sendmmsg = libc.sendmmsg
        self._sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        self._sendmmsg.restype = ctypes.c_int
        self._free: queue.SimpleQueue[_TxBuf] = queue.SimpleQueue()
        for _ in range(TX_BUFFERS):
            self._free.put(_TxBuf())
        self._work: queue.SimpleQueue[tuple[int, _TxBuf, int, Hashable] | None] = queue.SimpleQueue()
        self._queued = 0  # batches handed over (written by the caller's thread only)
        self._done = 0  # batches sent (written by the worker only)
        self.dropped: Counter[Hashable] = Counter()
        self.batches = 0
        self.frames = 0
        self._thread = threading.Thread(target=self._run, name="ibemu-tx", daemon=True)
        self._thread.start()

    def send(self, sock: socket.socket, frames: Sequence[bytes | bytearray], key: Hashable = None,
             head: bytes = b"") -> None:
        """Transmit ``frames`` on ``sock`` in order (after what was given before for it),
        each with ``head`` in place of its first ``len(head)`` bytes (a new Ethernet header)."""
        n = len(frames)
        if not n:
            return
        self.frames += n
        hl = len(head)
        if n <= DIRECT_MAX and self._queued == self._done:
            for frame in frames:
                try:
                    sock.send(head + memoryview(frame)[hl:] if hl else frame)
                except OSError:
                    self.dropped[key] += 1
            return
        fd = sock.fileno()
        for start in range(0, n, TX_BATCH):
            buf = self._free.get()
            view, iov = buf.view, buf.iov
            count = 0
            for frame in frames[start:start + TX_BATCH]:
                ln = len(frame)
                if ln > TX_SLOT:
                    self.dropped[key] += 1  # larger than any frame a port can carry
                    continue
                off = count * TX_SLOT
                view[off:off + ln] = frame
                if hl:
                    view[off:off + hl] = head
                iov[count].iov_len = ln
                count += 1
            self._queued += 1
            self.batches += 1
            self._work.put((fd, buf, count, key))

    def _run(self) -> None:
        size = ctypes.sizeof(_MMsgHdr)
        while True:
            job = self._work.get()
            if job is None:
                return
            fd, buf, count, key = job
            base = ctypes.addressof(buf.msgs)
            sent = 0
            while sent < count:
                r = self._sendmmsg(fd, base + sent * size, count - sent, MSG_DONTWAIT)
                if r <= 0:
                    self.dropped[key] += 1  # the first frame was refused: lost; go on with the rest
                    sent += 1
                else:
                    sent += r
            self._free.put(buf)
            self._done += 1

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until every batch handed over has been sent."""
        deadline = time.monotonic() + timeout_s
        while self._queued != self._done and time.monotonic() < deadline:
            time.sleep(0.0005)

    def close(self) -> None:
        """Send what is queued, then stop the worker."""
        self._work.put(None)
        self._thread.join(5.0)
