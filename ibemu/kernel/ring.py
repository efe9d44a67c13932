"""Batched packet-socket IO for the user datapaths: ``recvmmsg`` for a port's waiting
frames, ``sendmmsg`` in a worker thread for an egress port's batch.

A user datapath forwards every frame of a fabric in one Python thread. Profiled
(``benchmarks/bench_user_datapath.py --profile``), one ``recv`` and one ``send`` system call
per frame and hop were half of its time, and a trio wake-up per port with frames most of the
rest of the IO cost. Here:

- ``RxBatcher.recv_batch(sock)`` takes every frame waiting on a socket (up to ``RX_BATCH``)
  with one ``recvmmsg`` into one preallocated set of slots that serves all the sockets of
  the (single-threaded) caller. A port still buffers in its socket buffer, so bursts are
  absorbed exactly as before.
- ``TxBatcher.send(sock, frames)`` copies an egress port's frames into preallocated slots and
  a worker thread sends them with one ``sendmmsg`` (ctypes releases the GIL for the call).
  A frame's send on a veth costs ~3.5 us of kernel time here, as much as deciding where the
  frame goes: the peer's receive runs inside it. The thread lets that kernel work run on the
  other CPU while Python decides the next batch.

Tried and left out (measured with ``/tmp`` micro-benchmarks on a veth pair, 1 KiB frames):
a PACKET_MMAP RX ring (TPACKET_V2) reads ~0.7 us a frame cheaper than ``recvmmsg``, but pins
its slots in kernel memory per port (512 KiB for 256 slots: 2.5 GB for a k=16 fabric's 5,120
switch ports) and holds far fewer frames than a socket buffer: the RoCE hosts' bursts (16 QPs
x 64 WRs) overflowed 256 slots and RC flows ran out of retries. A TX ring saved nothing (3.5
us a frame either way) and stops ``send`` from taking a frame on its socket, which the SMA's
own sends need. TPACKET_V3 retires blocks after a timeout of at least a millisecond: latency.
PACKET_QDISC_BYPASS on the sending socket: 4.0-4.5 us of CPU a frame (send and receive, 1 KiB,
``sendmmsg`` batches of 64) with it and without (a veth has no queueing discipline to skip),
and it would hide a switch's own transmissions from a capture on its port: not used.

That floor, ~4 us of kernel and copying per frame and veth, is what a hop costs before any
decision is taken: 250,000 frame-hops/s would take one of this machine's two CPUs for it
alone. Hops between two switches of the IB user datapath need no veth (both ends are in the
process): ``fabric.linkplane`` hands those frames over in memory, which leaves one send and
one receive per frame and path instead of one per hop (on a k=4 fat-tree path, 2 of 10),
except on a cable without carrier or with a capture on it (``packet_taps``, below).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import queue
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Hashable, Sequence

from ibemu.kernel import netns
from ibemu.kernel.commands import KernelError


@functools.cache
def _lens_struct(n: int, size: int, at: int) -> struct.Struct:
    """The ``msg_len`` fields of ``n`` mmsghdrs of ``size`` bytes (each at offset ``at``)."""
    return struct.Struct("=" + f"{at}xI{size - at - 4}x" * n)


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
TX_BATCH = 64
TX_BUFFERS = 32
DIRECT_MAX = 2
"""Batches this short go out at once from the caller's thread when nothing is queued."""


class _TxBuf:
    """``TX_BATCH`` slots of frame data with the mmsghdr/iovec arrays that point at them."""

    __slots__ = ("data", "iov", "iov_words", "msgs", "view")

    def __init__(self) -> None:
        self.data = ctypes.create_string_buffer(TX_BATCH * TX_SLOT)
        self.view = memoryview(self.data).cast("B")
        self.iov = (_IoVec * TX_BATCH)()
        self.iov_words = memoryview(self.iov).cast("B").cast("Q")
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
    The thread inherits its creator's CPUs: a creator pinned to one CPU shares it with its
    sender (the agent host is not pinned on the user datapath: ``FabricRuntime.running``).
    A frame the kernel refuses (the link is down, its queue full) is lost like on a cable and
    counted in ``dropped`` by the key given with it. ``close`` sends what is queued: call it
    before closing the sockets (a closed descriptor's number may be reused). Memory:
    ``TX_BUFFERS`` x ``TX_BATCH`` x ``TX_SLOT`` bytes (19 MB), once per datapath process.
    """

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._sendmmsg = libc.sendmmsg
        self._sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        self._sendmmsg.restype = ctypes.c_int
        self._free: queue.SimpleQueue[_TxBuf] = queue.SimpleQueue()
        for _ in range(TX_BUFFERS):
            self._free.put(_TxBuf())
        self._work: queue.SimpleQueue[tuple[_TxBuf, list[tuple[int, int, int, Hashable]]] | None] = \
            queue.SimpleQueue()
        """(slots, [(fd, first slot, frames, key)]): one job, one sendmmsg per socket's run."""
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
            view, iov_words = buf.view, buf.iov_words
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
                iov_words[2 * count + 1] = ln  # iov_len (after the 8-byte iov_base)
                count += 1
            self._queued += 1
            self.batches += 1
            self._work.put((buf, [(fd, 0, count, key)]))

    def send_groups(self, groups: Sequence[tuple[socket.socket, Sequence[bytes | bytearray], Hashable, bytes]]) -> None:
        """``send`` for several sockets at once: ``(sock, frames, key, head)`` each, the frames
        of all of them packed into shared slots and handed over as one job (the worker sends
        each socket's run with one ``sendmmsg``). For callers with a few frames for each of
        many ports at a time (the link model's departures at a deadline), which ``send`` would
        hand over one small batch per port, or send from the caller's thread."""
        total = sum(len(g[1]) for g in groups)
        if not total:
            return
        if total <= DIRECT_MAX and self._queued == self._done:
            for sock, frames, key, head in groups:
                self.send(sock, frames, key, head)
            return
        self.frames += total
        buf: _TxBuf | None = None
        runs: list[tuple[int, int, int, Hashable]] = []
        count = 0
        for sock, frames, key, head in groups:
            fd, hl = sock.fileno(), len(head)
            first = count
            for frame in frames:
                if buf is None:
                    buf = self._free.get()
                ln = len(frame)
                if ln > TX_SLOT:
                    self.dropped[key] += 1  # larger than any frame a port can carry
                    continue
                off = count * TX_SLOT
                view = buf.view
                view[off:off + ln] = frame
                if hl:
                    view[off:off + hl] = head
                buf.iov_words[2 * count + 1] = ln
                count += 1
                if count == TX_BATCH:  # this buffer is full: hand it over, go on in a new one
                    runs.append((fd, first, count - first, key))
                    self._hand_over(buf, runs)
                    buf, runs, count, first = None, [], 0, 0
            if count > first:
                runs.append((fd, first, count - first, key))
        if buf is not None and runs:
            self._hand_over(buf, runs)
        elif buf is not None:
            self._free.put(buf)

    def _hand_over(self, buf: _TxBuf, runs: list[tuple[int, int, int, Hashable]]) -> None:
        self._queued += 1
        self.batches += 1
        self._work.put((buf, runs))

    def _run(self) -> None:
        size = ctypes.sizeof(_MMsgHdr)
        while True:
            job = self._work.get()
            if job is None:
                return
            buf, runs = job
            base = ctypes.addressof(buf.msgs)
            for fd, first, count, key in runs:
                sent = 0
                while sent < count:
                    r = self._sendmmsg(fd, base + (first + sent) * size, count - sent, MSG_DONTWAIT)
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


# ---------------------------------------------------------------------- receive, recvmmsg

RX_FRAME = 9216 + 64
"""Bytes a receive slot holds: the largest frame a user datapath reads (9216) fits."""
RX_BATCH = 128


class RxBatcher:
    """Reads batches of frames from packet sockets with one ``recvmmsg`` each.

    One set of ``RX_BATCH`` receive slots serves every socket of the (single-threaded)
    caller, so the kernel memory per port stays its socket buffer, filled only as frames
    wait: no per-port ring to pin, and a port buffers bursts as a plain socket does.
    """

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._recvmmsg = libc.recvmmsg
        self._recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        self._recvmmsg.restype = ctypes.c_int
        self.data = ctypes.create_string_buffer(RX_BATCH * RX_FRAME)
        self.view = memoryview(self.data).cast("B")
        self.iov = (_IoVec * RX_BATCH)()
        self.msgs = (_MMsgHdr * RX_BATCH)()
        base = ctypes.addressof(self.data)
        iov0 = ctypes.addressof(self.iov)
        for i in range(RX_BATCH):
            self.iov[i].iov_base = base + i * RX_FRAME
            self.iov[i].iov_len = RX_FRAME
            self.msgs[i].msg_hdr.msg_iov = iov0 + i * ctypes.sizeof(_IoVec)
            self.msgs[i].msg_hdr.msg_iovlen = 1
        self._msgs_addr = ctypes.addressof(self.msgs)
        self._lens = memoryview(self.msgs).cast("B")
        self._size = ctypes.sizeof(_MMsgHdr)
        self._len_at = _MMsgHdr.msg_len.offset

    def recv_batch(self, sock: socket.socket, limit: int = RX_BATCH) -> list[bytes]:
        """Up to ``limit`` frames waiting on ``sock``, in arrival order; [] when none is."""
        n = self._recvmmsg(sock.fileno(), self._msgs_addr, min(limit, RX_BATCH), MSG_DONTWAIT, None)
        if n <= 0:
            return []
        view = self.view
        lens = _lens_struct(n, self._size, self._len_at).unpack_from(self._lens)
        return [view[off:off + ln].tobytes() for off, ln in zip(range(0, n * RX_FRAME, RX_FRAME), lens, strict=True)]


# ---------------------------------------------------------------------- taps

def packet_taps(ns: str | None) -> set[str]:
    """The devices of namespace ``ns`` (None: this thread's) that an ETH_P_ALL packet socket
    (a capture: ``tcpdump``, ``fabric.cable_capture``) is bound to, "" for one bound to every
    device; from the kernel's list of protocol handlers (``/proc/net/ptype``). The IB user
    datapath's own sockets are bound to their ethertype and are not listed (the RoCE one's
    are: :func:`packet_tap_counts`). Empty when the namespace is gone."""
    return set(packet_tap_counts(ns))


def packet_tap_counts(ns: str | None) -> dict[str, int]:
    """How many ETH_P_ALL packet sockets are bound to each device of namespace ``ns`` ("":
    to every device); :func:`packet_taps` with counts, for a datapath that has such sockets
    of its own (the RoCE routers' ports, for IPv4 and PFC frames: one each)."""
    try:
        with netns.entered(ns) if ns else contextlib.nullcontext(), open("/proc/thread-self/net/ptype") as f:
            text = f.read()
    except (OSError, KernelError):
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == "ALL":
            dev = fields[1] if len(fields) == 3 else ""
            out[dev] = out.get(dev, 0) + 1
    return out
