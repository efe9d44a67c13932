"""IPv4 route notifications (RTM_NEWROUTE / RTM_DELROUTE multicast) and FIB dumps from one namespace.

The RoCE user datapath mirrors each router namespace's kernel FIB: it subscribes first
(``open_route_monitor``), then dumps the main table (``dump_routes``), so no change falls
between the two. ``ibemu.kernel.fib`` parses what arrives.
"""

from __future__ import annotations

import socket
import struct

from ibemu.kernel import netlink, netns
from ibemu.kernel.fib import RouteMsg, dump_request, parse_routes

RTMGRP_IPV4_ROUTE = 0x40


def open_route_monitor(ns: str) -> socket.socket:
    """A netlink socket in ``ns`` subscribed to IPv4 route notifications (blocking; 4 MiB of
    receive buffer)."""
    with netns.entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    sock.bind((0, RTMGRP_IPV4_ROUTE))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return sock


def dump_routes(ns: str) -> list[RouteMsg]:
    """The routes of ``ns``'s main table (blocking, its own socket: run it in a thread)."""
    with netns.entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    try:
        sock.bind((0, 0))
        sock.send(dump_request())
        msgs: list[RouteMsg] = []
        done = False
        while not done:
            data = sock.recv(1 << 16)
            off = 0
            while off + netlink.NLMSGHDR.size <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if kind == netlink.NLMSG_DONE or length < netlink.NLMSGHDR.size:
                    done = True
                    break
                off += (length + 3) & ~3
            msgs.extend(parse_routes(data))
    finally:
        sock.close()
    return msgs
