"""AF_PACKET sockets on interfaces inside namespaces, bound to one ethertype."""

from __future__ import annotations

import contextlib
import socket

from ibemu.kernel import netns
from ibemu.kernel.commands import KernelError

ETH_P_ALL = 0x0003
ETH_P_IB = 0x88B5
ETH_P_IP = 0x0800
SOCK_BUFFER = 4 * 1024 * 1024


def open_packet_socket(ns: str, ifname: str, ethertype: int = ETH_P_IB, *,
                       buffer_bytes: int = SOCK_BUFFER) -> socket.socket:
    """A non-blocking raw socket on ``ifname`` in ``ns`` receiving only ``ethertype`` frames.

    Bound to a protocol (not ETH_P_ALL), the socket sees frames after tc ingress: frames a
    tc filter redirected elsewhere never reach it, and it does not see its own transmissions.
    """
    with netns.entered(ns):
        try:
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ethertype))
            sock.bind((ifname, ethertype))
        except OSError as exc:
            raise KernelError(f"packet socket on {ns}/{ifname}: {exc}") from exc
    sock.setblocking(False)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, buffer_bytes)
    return sock


def mac_address(sock: socket.socket) -> bytes:
    """The MAC address of the interface a packet socket is bound to."""
    addr = sock.getsockname()
    return bytes(addr[4])
