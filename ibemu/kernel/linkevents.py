"""Link state change notifications (RTM_NEWLINK multicast) from one namespace.

A port's physical state is its veth's carrier (IFF_LOWER_UP): it drops when either end is
set down, exactly like unplugging a cable. The socket is non-blocking; the agent host waits
on it with trio and parses what arrives.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from ibemu.kernel import netlink, netns

NETLINK_ROUTE = 0
RTMGRP_LINK = 0x1
RTM_NEWLINK = 16
RTM_DELLINK = 17
IFF_UP = 0x1
IFF_RUNNING = 0x40
IFF_LOWER_UP = 0x10000

_IFINFOMSG = struct.Struct("=BxHiII")


@dataclass(frozen=True, slots=True)
class LinkEvent:
    ifindex: int
    admin_up: bool
    carrier: bool
    """IFF_LOWER_UP: the cable's far end is up."""
    deleted: bool = False
    running: bool = False
    """IFF_RUNNING: operationally up (linkwatch has activated the carrier)."""


def open_link_monitor(ns: str) -> socket.socket:
    """A netlink socket in ``ns`` subscribed to link notifications (non-blocking)."""
    with netns.entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    sock.bind((0, RTMGRP_LINK))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.setblocking(False)
    return sock


def parse(data: bytes) -> Iterator[LinkEvent]:
    """Link events in one netlink datagram (other message types are skipped)."""
    for kind, _seq, body, end in netlink.parse(data):
        if kind in (RTM_NEWLINK, RTM_DELLINK) and end - body >= _IFINFOMSG.size:
            _family, _type, index, flags, _change = _IFINFOMSG.unpack_from(data, body)
            yield LinkEvent(index, bool(flags & IFF_UP), bool(flags & IFF_LOWER_UP), kind == RTM_DELLINK,
                            bool(flags & IFF_RUNNING))


def read_events(sock: socket.socket) -> list[LinkEvent]:
    """Everything pending on a monitor socket, without blocking."""
    events: list[LinkEvent] = []
    while True:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return events
        events.extend(parse(data))
