"""Batched sends: many datagrams (or frames) in one ``sendmmsg(2)`` call.

Python's ``socket`` has no ``sendmmsg``; a ``send`` per frame pays a system call, the
socket module's own checks and an interpreter round each. ``send_many`` writes a list of
frames to a connected or bound socket (an AF_PACKET socket bound to its interface, a
connected datagram socket) in one call, with the GIL released for the whole of it (ctypes),
so another thread of the process runs meanwhile.

The kernel stops at the first frame it cannot take: ``send_many`` returns how many of the
first frames went out. Fewer than all means the next one would block or failed; sending
that one alone reports why (the error of a later frame is not returned by ``sendmmsg``).
Nothing sent raises ``BlockingIOError`` (a full socket) or ``OSError`` as ``send`` would.

Cost: up to ``SLOTS`` frames of at most ``SLOT`` bytes are copied into slots made once per
thread, whose ``mmsghdr`` and ``iovec`` arrays already point at them: per frame, one copy
and its length. Building those arrays for every call (a ``c_char_p``, a cast, a pointer and
five field writes per frame) cost ~4 us a frame, more than the system calls ``sendmmsg``
saves (a ``send`` per frame on a datagram socket pair: ~1.3 us each; hand-timed with
``timeit``). Larger batches or frames take that general path.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Sequence
from typing import Protocol

_libc = ctypes.CDLL(None, use_errno=True)
MSG_DONTWAIT = 0x40


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(_Iovec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


_sendmmsg = _libc.sendmmsg
_sendmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_Mmsghdr), ctypes.c_uint, ctypes.c_int]
_sendmmsg.restype = ctypes.c_int


class HasFileno(Protocol):
    def fileno(self) -> int: ...


SLOT = 2048
"""Bytes of a preallocated slot (a MAD frame is 304)."""
SLOTS = 64
"""Frames a call sends through the preallocated slots at most."""


class _Slots:
    """``SLOTS`` frame buffers with the ``mmsghdr``/``iovec`` arrays that point at them (one
    set per thread: ``sendmmsg`` runs with the GIL released, so another thread may send
    meanwhile)."""

    __slots__ = ("data", "iov", "lens", "msgs", "view")

    def __init__(self) -> None:
        self.data = ctypes.create_string_buffer(SLOTS * SLOT)
        self.view = memoryview(self.data).cast("B")
        self.iov = (_Iovec * SLOTS)()
        self.msgs = (_Mmsghdr * SLOTS)()
        base = ctypes.addressof(self.data)
        for i in range(SLOTS):
            self.iov[i].iov_base = base + i * SLOT
            self.msgs[i].msg_hdr.msg_iov = ctypes.pointer(self.iov[i])
            self.msgs[i].msg_hdr.msg_iovlen = 1
        self.lens = memoryview(self.iov).cast("B").cast("Q")
        """The arrays' words: ``iov_len`` of slot i is word 2i + 1."""


_local = threading.local()


def _slots() -> _Slots:
    slots: _Slots | None = getattr(_local, "slots", None)
    if slots is None:
        slots = _local.slots = _Slots()
    return slots


def send_many(sock: HasFileno, frames: Sequence[bytes]) -> int:
    """Send ``frames`` in order in one ``sendmmsg`` (without blocking); returns how many of the
    first went out (see the module docstring)."""
    fileno = getattr(sock, "fileno", None)
    if fileno is None:
        raise TypeError(f"{type(sock).__name__} is not a socket")
    n = len(frames)
    if not n:
        return 0
    if n <= SLOTS:
        slots = _slots()
        view, lens = slots.view, slots.lens
        at = 0
        for i, f in enumerate(frames):
            size = len(f)
            if size > SLOT:
                break
            view[at:at + size] = f
            lens[2 * i + 1] = size
            at += SLOT
        else:
            return _check(_sendmmsg(fileno(), slots.msgs, n, MSG_DONTWAIT))
    iov = (_Iovec * n)()
    msgs = (_Mmsghdr * n)()
    keep = [ctypes.c_char_p(f) for f in frames]  # the bytes' own buffers, not copies
    for i, (f, ref) in enumerate(zip(frames, keep, strict=True)):
        iov[i].iov_base = ctypes.cast(ref, ctypes.c_void_p)
        iov[i].iov_len = len(f)
        hdr = msgs[i].msg_hdr
        hdr.msg_iov = ctypes.pointer(iov[i])
        hdr.msg_iovlen = 1
    return _check(_sendmmsg(fileno(), msgs, n, MSG_DONTWAIT))


def _check(sent: int) -> int:
    if sent < 0:
        err = ctypes.get_errno()
        if err in (errno.EAGAIN, errno.EWOULDBLOCK):
            raise BlockingIOError(err, os.strerror(err))
        raise OSError(err, os.strerror(err))
    return int(sent)


_CTRL = 32
"""Control bytes per received frame: one ``SO_TIMESTAMPNS`` message (CMSG_SPACE of a timespec)."""
_MSG_TRUNC = 0x20
_SO_TIMESTAMPNS = 35  # (``kernel.packet.SO_TIMESTAMPNS``)

_recvmmsg = _libc.recvmmsg
_recvmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_Mmsghdr), ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
_recvmmsg.restype = ctypes.c_int


class RecvMany:
    """Every frame waiting on a socket, up to ``slots``, with one ``recvmmsg``, each with the
    kernel's receive stamp when the socket has them (``packet.stamp_received``).

    One ``recvmsg`` per frame with its ancillary data cost the SM's own port ~9 us of Python
    a frame (the call, the list of control messages, their parse); here the slots, their
    control buffers and the arrays pointing at them are made once, and a batch costs one
    system call and a copy per frame. A frame longer than ``slot`` bytes is dropped (counted
    in ``truncated``). Not for use by two threads at once (one set of slots)."""

    def __init__(self, slots: int = SLOTS, slot: int = SLOT) -> None:
        self.slots, self.slot = slots, slot
        self.truncated = 0
        self._data = ctypes.create_string_buffer(slots * slot)
        self._view = memoryview(self._data).cast("B")
        self._ctrl = ctypes.create_string_buffer(slots * _CTRL)
        self._iov = (_Iovec * slots)()
        self._msgs = (_Mmsghdr * slots)()
        base, ctrl = ctypes.addressof(self._data), ctypes.addressof(self._ctrl)
        for i in range(slots):
            self._iov[i].iov_base = base + i * slot
            self._iov[i].iov_len = slot
            hdr = self._msgs[i].msg_hdr
            hdr.msg_iov = ctypes.pointer(self._iov[i])
            hdr.msg_iovlen = 1
            hdr.msg_control = ctrl + i * _CTRL
            hdr.msg_controllen = _CTRL
        size = ctypes.sizeof(_Mmsghdr)
        if size % 8 or _Msghdr.msg_controllen.offset % 8:
            raise RuntimeError("unexpected mmsghdr layout")
        self._words = memoryview(self._msgs).cast("B").cast("Q")
        """The mmsghdr array as 64-bit words (``msg_controllen`` is reset after each call)."""
        self._ints = memoryview(self._msgs).cast("B").cast("I")
        self._stride_q, self._stride_i = size // 8, size // 4
        self._controllen_q = _Msghdr.msg_controllen.offset // 8
        self._flags_i = _Msghdr.msg_flags.offset // 4
        self._len_i = _Mmsghdr.msg_len.offset // 4
        self._ctrl_q = memoryview(self._ctrl).cast("B").cast("q")
        self._ctrl_i = memoryview(self._ctrl).cast("B").cast("i")

    def recv(self, sock: HasFileno) -> list[tuple[bytes, int | None]]:
        """(frame, receive stamp in CLOCK_REALTIME ns or None) of each frame waiting, in
        arrival order; [] when none is. Errors other than "nothing waiting" raise ``OSError``."""
        n = _recvmmsg(sock.fileno(), self._msgs, self.slots, MSG_DONTWAIT, None)
        if n <= 0:
            if n < 0:
                err = ctypes.get_errno()
                if err not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                    raise OSError(err, os.strerror(err))
            return []
        out: list[tuple[bytes, int | None]] = []
        view, words, ints, cq, ci = self._view, self._words, self._ints, self._ctrl_q, self._ctrl_i
        sq, si, slot = self._stride_q, self._stride_i, self.slot
        for i in range(n):
            ctl_words = i * sq + self._controllen_q
            has_stamp = words[ctl_words] >= _CTRL
            words[ctl_words] = _CTRL  # the kernel wrote what it used: room again for the next call
            if ints[i * si + self._flags_i] & _MSG_TRUNC:
                self.truncated += 1
                continue
            size = ints[i * si + self._len_i]
            stamp = None
            c = i * (_CTRL // 8)
            # struct cmsghdr {size_t len; int level; int type;} then the timespec
            if has_stamp and ci[2 * c + 2] == 1 and ci[2 * c + 3] == _SO_TIMESTAMPNS:  # SOL_SOCKET
                stamp = cq[c + 2] * 1_000_000_000 + cq[c + 3]
            out.append((view[i * slot:i * slot + size].tobytes(), stamp))
        return out
