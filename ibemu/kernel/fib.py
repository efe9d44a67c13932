"""A user-datapath router's copy of its namespace's IPv4 FIB (sans-IO): parse, match, spread.

The fabric manager writes routes into the router's kernel over rtnetlink; the user forwarder
mirrors them (a dump at start, then RTM_NEWROUTE / RTM_DELROUTE notifications) into a
``Fib``: longest-prefix match over the prefix lengths present, then an ECMP choice among
the next hops whose port is up, by a seeded hash of the 5-tuple (addresses, protocol, ports),
so different UDP source ports (QPs) spread over the next hops, as the kernel's
``fib_multipath_hash_policy=1`` does. A next hop is an egress interface index (every cable
is point to point: its peer's MAC is the next hop's, whatever the gateway address).
"""

from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Container, Iterator
from dataclasses import dataclass

from ibemu.kernel.netlink import NLM_F_DUMP, NLM_F_REQUEST, attrs, message, parse

RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RT_TABLE_MAIN, RTN_UNICAST = 254, 1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_TABLE, RTA_MULTIPATH = 1, 4, 5, 15, 9
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTNH = struct.Struct("=HBBi")


@dataclass(frozen=True, slots=True)
class RouteMsg:
    """One IPv4 unicast route of the main table, from a netlink message."""

    deleted: bool
    prefix: int
    length: int
    oifs: tuple[int, ...]


def parse_routes(data: bytes) -> Iterator[RouteMsg]:
    """IPv4 unicast routes of the main table in a netlink datagram (others skipped)."""
    for kind, _seq, body, end in parse(data):
        if kind in (RTM_NEWROUTE, RTM_DELROUTE) and end - body >= _RTMSG.size:
            family, dst_len, _s, _t, table, _p, _sc, rtype, _fl = _RTMSG.unpack_from(data, body)
            oifs: list[int] = []
            dst = 0
            for a, v in attrs(data, body + _RTMSG.size, end):
                if a == RTA_TABLE and len(v) >= 4:
                    table = struct.unpack_from("=I", v)[0]
                elif a == RTA_DST and len(v) == 4:
                    dst = struct.unpack("!I", v)[0]
                elif a == RTA_OIF and len(v) >= 4:
                    oifs.append(struct.unpack_from("=i", v)[0])
                elif a == RTA_MULTIPATH:
                    o = 0
                    while o + _RTNH.size <= len(v):
                        ln, _flags, _hops, ifindex = _RTNH.unpack_from(v, o)
                        if ln < _RTNH.size:
                            break
                        oifs.append(ifindex)
                        o += (ln + 3) & ~3
            if family == socket.AF_INET and table == RT_TABLE_MAIN and rtype == RTN_UNICAST and dst_len <= 32:
                mask = (0xFFFFFFFF << (32 - dst_len)) & 0xFFFFFFFF if dst_len else 0
                yield RouteMsg(kind == RTM_DELROUTE, dst & mask, dst_len, tuple(sorted(set(oifs))))


MEMO_MAX = 65536
"""Destinations whose match a ``Fib`` remembers (beyond: it forgets them all and starts again)."""


class Fib:
    """Prefix -> egress interfaces; longest-prefix match, then a 5-tuple hash among the live ones.

    A destination's match is remembered until the routes change (every frame of a flow looks
    up the same address: one dict read, not one per prefix length tried)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed & 0xFFFFFFFF
        self.tables: dict[int, dict[int, tuple[int, ...]]] = {}
        self.lengths: list[int] = []
        self._memo: dict[int, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return sum(map(len, self.tables.values()))

    def apply(self, msg: RouteMsg) -> None:
        self._memo.clear()
        table = self.tables.get(msg.length)
        if msg.deleted:
            if table is not None:
                table.pop(msg.prefix, None)
            return
        if not msg.oifs:
            return
        if table is None:
            table = self.tables[msg.length] = {}
            self.lengths = sorted(self.tables, reverse=True)
        table[msg.prefix] = msg.oifs

    def clear(self) -> None:
        self._memo.clear()
        self.tables.clear()
        self.lengths = []

    def lookup(self, dst: int) -> tuple[int, ...] | None:
        """The egress interfaces of the longest prefix covering ``dst``."""
        memo = self._memo
        hops = memo.get(dst)
        if hops is not None:
            return hops
        tables = self.tables
        for ln in self.lengths:
            hops = tables[ln].get(dst & ((0xFFFFFFFF << (32 - ln)) & 0xFFFFFFFF) if ln else 0)
            if hops is not None:
                if len(memo) >= MEMO_MAX:
                    memo.clear()
                memo[dst] = hops
                return hops
        return None

    def choose(self, hops: tuple[int, ...], flow: bytes, down: Container[int] = ()) -> int | None:
        """One of ``hops`` (not in ``down``) for the 5-tuple bytes ``flow``; None if none is up."""
        live = hops if not down else tuple(h for h in hops if h not in down)
        if not live:
            return None
        if len(live) == 1:
            return live[0]
        h = zlib.crc32(flow, self.seed)
        h ^= h >> 16
        return live[h % len(live)]


def flow_key(frame: bytes | bytearray) -> bytes:
    """Addresses, protocol and ports of an IPv4 frame (Ethernet at 0, IHL honoured)."""
    l4 = 14 + (frame[14] & 0x0F) * 4
    return bytes(frame[26:34]) + bytes(frame[23:24]) + bytes(frame[l4:l4 + 4])


def dump_request(seq: int = 1) -> bytes:
    """RTM_GETROUTE dump of the IPv4 routes."""
    body = _RTMSG.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0)
    return message(RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, seq, body)
