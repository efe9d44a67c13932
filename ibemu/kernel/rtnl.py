"""Bulk link operations over raw rtnetlink: many interfaces of one namespace per round trip.

pyroute2 costs milliseconds per namespace (a socket with its own event loop) and per call;
bringing up the thousands of ports of a large fabric, or reading their carrier, needs one
netlink socket per namespace, one send, and the acks.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable
from typing import NamedTuple

from ibemu import clock
from ibemu.kernel import netlink, netns
from ibemu.kernel.commands import KernelError
from ibemu.kernel.netlink import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    NLMSGHDR,
)

RTM_NEWLINK = 16
RTM_GETLINK = 18
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
IFLA_IFNAME = 3
IFLA_OPERSTATE = 16
IFLA_STATS64 = 23
IF_OPER_UP = 6

_IFINFOMSG = struct.Struct("=BxHiII")


def _socket() -> socket.socket:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    s.bind((0, 0))
    return s


def ifindexes(ns: str, ifnames: Iterable[str]) -> dict[str, int]:
    """Interface indexes of ``ifnames`` in ``ns``."""
    with netns.entered(ns):
        try:
            return {n: socket.if_nametoindex(n) for n in ifnames}
        except OSError as exc:
            raise KernelError(f"{ns}: {exc}") from exc


def set_up(ns: str, ifnames: Iterable[str], up: bool = True) -> int:
    """Set the administrative state of ``ifnames`` in ``ns``, all in one netlink send.

    Returns ``clock.now_ns()`` taken just before that send: when the kernel acted, without
    the namespace switch and the socket set-up before it (0.3-0.5 ms here), which are the
    emulator's cost, not the cable's. 0 when ``ifnames`` is empty."""
    names = list(ifnames)
    if not names:
        return 0
    with LinkSet(ns, names, up) as request:
        return request.send()


class LinkSet:
    """``set_up`` in two steps: made ready (the namespace entered, the socket opened, the
    interfaces' indexes looked up, the request built: the 0.3-0.5 ms of the emulator's own
    cost), then sent when the caller says (``send``), which then costs one system call and
    the wait for the acks, with the GIL released. ``AgentHost.set_ports`` readies the
    request before it tells the carrier thread of a cut, so that after the cut only the send
    and the acks are left (readying it first changed the agents' pick-up of the cut by
    nothing measurable, hand-timed; the wait ``set_ports`` makes before sending did). A
    context manager: the socket is closed on exit, sent or not."""

    def __init__(self, ns: str, ifnames: Iterable[str], up: bool) -> None:
        self.ns, self.names = ns, list(ifnames)
        with netns.entered(ns):
            self.sock = _socket()
            try:
                indexes = [socket.if_nametoindex(n) for n in self.names]
            except OSError as exc:
                self.sock.close()
                raise KernelError(f"{ns}: {exc}") from exc
        msgs = []
        for seq, idx in enumerate(indexes, 1):
            body = _IFINFOMSG.pack(0, 0, idx, IFF_UP if up else 0, IFF_UP)
            msgs.append(NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK,
                                       seq, 0) + body)
        self.count = len(msgs)
        self.payload = b"".join(msgs)

    def send(self) -> int:
        """Send the request and wait for every ack; returns ``clock.now_ns()`` just before the
        send. Raises ``KernelError`` naming the first interface the kernel refused."""
        t = clock.now_ns()
        self.sock.send(self.payload)
        failed = netlink.acks(self.sock, 1, self.count)
        if failed:
            seq, err = failed[0]
            raise KernelError(f"{self.ns}/{self.names[seq - 1]}: link set: {os.strerror(err)}")
        return t

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> LinkSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def carrier_down(ns: str, ifnames: Iterable[str]) -> list[str]:
    """Those of ``ifnames`` in ``ns`` not yet operationally up, from one link dump.

    IFF_LOWER_UP is set the moment a veth's peer comes up, but the device keeps dropping
    every frame (noop qdisc) until linkwatch activates it, up to a second later, and sets
    the operational state UP: that is the state waited for.
    """
    wanted = set(ifnames)
    up = {name for name, flags, attrs in _dump_links(ns)
          if flags & IFF_LOWER_UP and attrs.get(IFLA_OPERSTATE, b"\0")[:1] == bytes([IF_OPER_UP])}
    return sorted(wanted - up)


class LinkStats(NamedTuple):
    """An interface's totals (the first fields of the kernel's ``rtnl_link_stats64``)."""

    rx_packets: int
    tx_packets: int
    rx_bytes: int
    tx_bytes: int
    rx_errors: int
    tx_errors: int
    rx_dropped: int
    tx_dropped: int


_STATS64 = struct.Struct("=8Q")


def link_stats(ns: str, ifnames: Iterable[str]) -> dict[str, LinkStats]:
    """Totals of ``ifnames`` in ``ns`` (those that exist), from one link dump."""
    wanted = set(ifnames)
    out: dict[str, LinkStats] = {}
    for name, _flags, attrs in _dump_links(ns):
        raw = attrs.get(IFLA_STATS64)
        if name in wanted and raw is not None and len(raw) >= _STATS64.size:
            out[name] = LinkStats(*_STATS64.unpack_from(raw))
    return out


def _dump_links(ns: str) -> list[tuple[str, int, dict[int, bytes]]]:
    """(name, flags, attributes) of every interface in ``ns``, from one dump."""
    with netns.entered(ns):
        sock = _socket()
    links: list[tuple[str, int, dict[int, bytes]]] = []
    try:
        body = _IFINFOMSG.pack(0, 0, 0, 0, 0)
        sock.send(NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
        while True:
            data = sock.recv(1 << 16)
            for kind, _seq, payload, end in netlink.parse(data):
                if kind == NLMSG_DONE:
                    return links
                if kind == NLMSG_ERROR:
                    raise KernelError(f"{ns}: link dump failed")
                if kind == RTM_NEWLINK:
                    flags = _IFINFOMSG.unpack_from(data, payload)[3]
                    attrs = dict(netlink.attrs(data, payload + _IFINFOMSG.size, end))
                    links.append((attrs.get(IFLA_IFNAME, b"").split(b"\0", 1)[0].decode(), flags, attrs))
    finally:
        sock.close()
