"""AF_PACKET sockets on interfaces inside namespaces, bound to one ethertype."""

from __future__ import annotations

import contextlib
import ctypes
import socket
import struct
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from ibemu.kernel import netns, sockfilter
from ibemu.kernel.commands import KernelError

ETH_P_ALL = 0x0003
ETH_P_IB = 0x88B5
ETH_P_IP = 0x0800
SOCK_BUFFER = 4 * 1024 * 1024
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("qq")


def open_packet_socket(ns: str | None, ifname: str, ethertype: int = ETH_P_IB, *,
                       buffer_bytes: int = SOCK_BUFFER,
                       bpf: list[sockfilter.Insn] | None = None) -> socket.socket:
    """A non-blocking raw socket on ``ifname`` in ``ns`` receiving only ``ethertype`` frames.

    ``ns`` None: the namespace this process is in.

    Bound to a protocol (not ETH_P_ALL), the socket sees frames after tc ingress: frames a
    tc filter redirected elsewhere never reach it, and it does not see its own transmissions.
    The socket is created with protocol 0 and gets its protocol at bind: created with one,
    the kernel hooks it to every device first and unhooks it at bind with an RCU grace
    period (~10 ms a socket here). ``bpf``: a classic BPF program (``kernel.sockfilter``)
    attached before the socket is bound, so no frame it rejects is ever queued.
    """
    with netns.entered(ns) if ns else contextlib.nullcontext():
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
            if bpf is not None:
                sockfilter.attach(sock, bpf)
            sock.bind((ifname, ethertype))
        except OSError as exc:
            raise KernelError(f"packet socket on {ns}/{ifname}: {exc}") from exc
    sock.setblocking(False)
    set_buffers(sock, buffer_bytes)
    return sock


def set_buffers(sock: socket.socket, nbytes: int) -> None:
    """Receive and send buffers of ``nbytes``: beyond net.core.[rw]mem_max where root may."""
    for force, plain in ((SO_RCVBUFFORCE, socket.SO_RCVBUF), (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, nbytes)
        except OSError:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, plain, nbytes)


def ignore_outgoing(sock: socket.socket) -> None:
    """An ETH_P_ALL socket stops seeing the frames sent on its interface (its own included)."""
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)


def mac_address(sock: socket.socket) -> bytes:
    """The MAC address of the interface a packet socket is bound to."""
    addr = sock.getsockname()
    return bytes(addr[4])


def close_all(socks: Iterable[socket.socket]) -> None:
    """Close many packet sockets at once.

    Closing one waits for an RCU grace period (~10 ms); closes from parallel threads share
    grace periods, so a fabric's thousands of sockets go in well under a second.
    """
    socks = list(socks)
    if len(socks) < 4:
        for s in socks:
            s.close()
        return
    with ThreadPoolExecutor(max_workers=min(128, len(socks))) as pool:
        list(pool.map(socket.socket.close, socks))


PACKET_STATISTICS = 6
_TPACKET_STATS = struct.Struct("=II")  # tp_packets, tp_drops


def take_drops(sock: socket.socket) -> int:
    """Frames the kernel dropped for ``sock`` (its receive buffer was full) since the last
    call: ``PACKET_STATISTICS``, which the kernel resets on each read. 0 if unavailable."""
    try:
        raw = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, _TPACKET_STATS.size)
    except OSError:
        return 0
    return int(_TPACKET_STATS.unpack(raw)[1])


def stamp_received(sock: socket.socket) -> None:
    """Have the kernel stamp every frame ``sock`` receives (``SO_TIMESTAMPNS``, CLOCK_REALTIME),
    read back with ``kernel_stamp`` from ``recvmsg``'s ancillary data."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def kernel_stamp(ancillary: Iterable[tuple[int, int, bytes]]) -> int | None:
    """The kernel's receive stamp of a frame (CLOCK_REALTIME ns) from ``recvmsg``'s ancillary
    data; None when it has none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return int(sec * 1_000_000_000 + nsec)
    return None


_libc_held = ctypes.PyDLL(None, use_errno=True)
"""libc called without releasing the GIL (``send_holding_gil``)."""


def send_holding_gil(sock: socket.socket, frames: Iterable[bytes]) -> int:
    """Send ``frames`` on a packet socket, one ``send`` each, keeping the GIL across them (a
    thread that has just got it must not queue for it again per frame: the agent host's loop
    takes it for up to its switch interval each time). Returns how many failed."""
    fd, failed = sock.fileno(), 0
    for frame in frames:
        if _libc_held.send(fd, frame, len(frame), 0) < 0:
            failed += 1
    return failed

