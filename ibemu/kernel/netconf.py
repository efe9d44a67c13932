"""The kernel side of a RoCE fabric: sysctls, addresses, static neighbours, routes, host guard.

What a RoCE fabric (``ibemu.roce``, ``ibemu.fabric.roce_fabric``) needs from its namespaces'
kernels; it knows routes only as prefixes and next hops (``Hop``: an interface and a
gateway), not how ``ibemu.roce.routes`` computes them. Routers forward IPv4
(``ip_forward``), hash ECMP on the 5-tuple (``fib_multipath_hash_policy=1``, a seed per
router, fixed so runs repeat) and ignore next hops without carrier
(``ignore_routes_with_linkdown``). Neighbours are static
(every MAC is planned), so no ARP crosses a cable. Hosts route only 198.18.0.0/15, via
their first-hop router. A host's kernel never sees RoCE frames: a direct-action BPF filter
on its port's ingress drops UDP 4791 after the packet sockets (``ETH_P_ALL``) have had
their copy, so it never answers them with ICMP port unreachable.

``RouteWriter`` writes ECMP routes over raw rtnetlink, all of a router's changes in one send
(pyroute2 costs a round trip and its own event loop per call).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from ibemu.kernel import bpf, clsact, netlink, netns, rtnl
from ibemu.kernel.bpf import R0, R1, R2, R3, R4, R6, Asm
from ibemu.kernel.commands import KernelError, batch
from ibemu.wire.roce import EMULATED_NET, ROCEV2_UDP_PORT

RTPROT_IBEMU = 66
"""Protocol number of the fabric manager's routes (``ip route`` shows ``proto 66``)."""
MULTIPATH_HASH_SEED = 0x1BE0
SYSCTL = Path("/proc/sys/net/ipv4")

ROUTER_SYSCTLS = {
    "ip_forward": "1",
    "fib_multipath_hash_policy": "1",
    "conf/all/ignore_routes_with_linkdown": "1",
    "conf/default/ignore_routes_with_linkdown": "1",
    "conf/all/rp_filter": "0",
    "conf/default/rp_filter": "0",
    "conf/all/send_redirects": "0",
    "conf/default/send_redirects": "0",
}
USER_ROUTER_SYSCTLS = {**ROUTER_SYSCTLS, "ip_forward": "0"}
"""A user-datapath router: the kernel keeps the FIB (the manager writes it) and forwards nothing."""
HOST_SYSCTLS = {
    "ip_forward": "0",
    "conf/all/ignore_routes_with_linkdown": "1",
    "conf/default/ignore_routes_with_linkdown": "1",
    "conf/all/rp_filter": "0",
    "conf/default/rp_filter": "0",
}


def set_sysctls(ns: str, values: Mapping[str, str], *, optional: Iterable[str] = ()) -> None:
    """Write ``net.ipv4`` sysctls inside ``ns`` (/proc/sys/net is the opening thread's)."""
    skip = set(optional)
    with netns.entered(ns):
        for key, value in values.items():
            try:
                (SYSCTL / key).write_text(value)
            except FileNotFoundError:
                if key not in skip:
                    raise KernelError(f"{ns}: this kernel has no net.ipv4.{key.replace('/', '.')}") from None


def multipath_seed(router: str) -> int:
    """A router's own ECMP hash seed, fixed by its name.

    One seed for all would make every router of a path pick the same way for a given flow
    (an edge's choice of aggregation switch would decide the aggregation's choice of core:
    ECMP polarization, half the core idle); real switches seed their hashes apart.
    """
    return zlib.crc32(router.encode()) & 0x7FFFFFFF or MULTIPATH_HASH_SEED


def router_sysctls(ns: str, seed: int = MULTIPATH_HASH_SEED, *, forward: bool = True) -> None:
    """``forward`` False: the user datapath forwards, the kernel only holds the routes."""
    set_sysctls(ns, {**(ROUTER_SYSCTLS if forward else USER_ROUTER_SYSCTLS), "fib_multipath_hash_seed": str(seed)},
                optional=["fib_multipath_hash_seed"])


def host_sysctls(ns: str) -> None:
    set_sysctls(ns, HOST_SYSCTLS)


def ip_lines(ns: str, lines: Sequence[str]) -> None:
    """``ip -n ns -batch -`` (addresses, neighbours, routes)."""
    batch("ip", lines, netns=ns)


def address_lines(ifname: str, ip: str, peer_ip: str, peer_mac: str, prefix_len: int = 31) -> list[str]:
    """An interface's address and its peer as a permanent neighbour."""
    return [f"addr add {ip}/{prefix_len} dev {ifname}",
            f"neigh replace {peer_ip} lladdr {peer_mac} dev {ifname} nud permanent"]


def host_route_line(ifname: str, gateway: str) -> str:
    """A host's only route beyond its cable: the emulated range, via its first-hop router."""
    return f"route add {EMULATED_NET} via {gateway} dev {ifname}"


# ------------------------------------------------------------------ host ingress guard

FN_SKB_PULL_DATA = 39
GUARD_HEADERS = 38
"""Ethernet, IPv4 without options, UDP ports: what the guard reads."""


def guard_program() -> bytes:
    """SCHED_CLS, direct action: drop IPv4 (no options) / UDP to port 4791, pass the rest.

    A frame sent from a packet socket arrives with only its Ethernet header in the linear
    part of the skb (what direct packet access sees): the headers are pulled in first
    (``bpf_skb_pull_data``), or the guard would pass every such frame."""
    a = Asm()

    def headers_in_reach(otherwise: str) -> None:
        """R2 = data; jump to ``otherwise`` unless GUARD_HEADERS bytes are in the linear part."""
        a.ldx(4, R2, R6, bpf.SKB_DATA)
        a.ldx(4, R3, R6, bpf.SKB_DATA_END)
        a.mov(R4, R2)
        a.alu64("add", R4, GUARD_HEADERS)
        a.jmp("jgt", R4, R3, otherwise, reg=True)

    a.mov(R6, R1)
    headers_in_reach("pull")
    a.label("check")
    a.ldx(2, R4, R2, 12)
    a.jmp("jne", R4, 0x0008, "pass")            # ethertype 0x0800 (little-endian load)
    a.ldx(1, R4, R2, 14)
    a.jmp("jne", R4, 0x45, "pass")              # IPv4, 20-byte header
    a.ldx(1, R4, R2, 23)
    a.jmp("jne", R4, socket.IPPROTO_UDP, "pass")
    a.ldx(2, R4, R2, 36)
    a.jmp("jne", R4, socket.htons(ROCEV2_UDP_PORT), "pass")
    a.movi(R0, bpf.TC_ACT_SHOT)
    a.exit()
    a.label("pull")                             # the headers into the linear part, if the frame has them
    a.ldx(4, R4, R6, bpf.SKB_LEN)
    a.jmp("jlt", R4, GUARD_HEADERS, "pass")
    a.mov(R1, R6)
    a.movi(R2, GUARD_HEADERS)
    a.call(FN_SKB_PULL_DATA)
    a.jmp("jne", R0, 0, "pass")
    headers_in_reach("pass")  # the pull moved the data: load it again
    a.goto("check")
    a.label("pass")
    a.movi(R0, bpf.TC_ACT_OK)
    a.exit()
    return a.assemble()


def guard_hosts(ports: Iterable[tuple[str, str]]) -> None:
    """The ingress guard on each ``(namespace, interface)`` of a host (one program for all)."""
    prog = bpf.load_program(guard_program(), name="roce_guard")
    try:
        by_ns: dict[str, list[clsact.BpfHook]] = {}
        for ns, ifname in ports:
            by_ns.setdefault(ns, []).append(clsact.BpfHook(ifname, prog))
        for ns, hooks in by_ns.items():
            clsact.attach_bpf(ns, hooks, parent=clsact.INGRESS, prio=1, name="roce_guard",
                              what=f"{ns}: ingress guard")
    finally:
        os.close(prog)  # the filters keep the program alive


# ------------------------------------------------------------------ routes

RTM_NEWROUTE, RTM_DELROUTE = 24, 25
RT_TABLE_MAIN, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 0, 1
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_MULTIPATH = 1, 4, 5, 9
_RTMSG = struct.Struct("=BBBBBBBBI")
RTM_NEWNEIGH, NDA_DST, NDA_LLADDR, NUD_PERMANENT = 28, 1, 2, 0x80
_NDMSG = struct.Struct("=BxxxiHBB")
_RTNH = struct.Struct("=HBBi")
_PUT = netlink.NLM_F_REQUEST | netlink.NLM_F_ACK | netlink.NLM_F_CREATE | netlink.NLM_F_REPLACE
_DEL = netlink.NLM_F_REQUEST | netlink.NLM_F_ACK


class Hop(Protocol):
    """A route's next hop as the kernel takes it (``ibemu.roce.routes.NextHop`` is one)."""

    @property
    def ifname(self) -> str: ...

    @property
    def gateway(self) -> str: ...


Hops = Sequence[Hop]
"""A route's next hops (none: a route being deleted)."""


class RouteWriter:
    """Writes one router's routes (``prefix -> next hops``) over its own netlink socket."""

    def __init__(self, ns: str, ifnames: Iterable[str]) -> None:
        self.ns = ns
        self.ifindex = rtnl.ifindexes(ns, ifnames)
        self.sock = netlink.route_socket(ns)
        self.messages = 0

    def _message(self, kind: int, flags: int, seq: int, prefix: str, hops: Hops) -> bytes:
        net = ipaddress.IPv4Network(prefix)
        body = _RTMSG.pack(socket.AF_INET, net.prefixlen, 0, 0, RT_TABLE_MAIN, RTPROT_IBEMU,
                           RT_SCOPE_UNIVERSE, RTN_UNICAST, 0)
        body += netlink.attr(RTA_DST, net.network_address.packed)
        if len(hops) == 1:
            body += netlink.attr(RTA_GATEWAY, socket.inet_aton(hops[0].gateway))
            body += netlink.attr(RTA_OIF, struct.pack("=i", self.ifindex[hops[0].ifname]))
        elif hops:
            nested = b""
            for h in hops:
                gw = netlink.attr(RTA_GATEWAY, socket.inet_aton(h.gateway))
                nested += _RTNH.pack(_RTNH.size + len(gw), 0, 0, self.ifindex[h.ifname]) + gw
            body += netlink.attr(RTA_MULTIPATH, nested)
        return netlink.message(kind, flags, seq, body)

    def apply(self, put: Mapping[str, Hops], delete: Iterable[str] = ()) -> int:
        """Replace (or create) ``put`` and delete ``delete``, in one send; every ack checked."""
        msgs: list[bytes] = []
        for prefix, hops in put.items():
            if not hops:
                raise ValueError(f"{self.ns}: route to {prefix} without next hops")
            msgs.append(self._message(RTM_NEWROUTE, _PUT, len(msgs) + 1, prefix, hops))
        for prefix in delete:
            msgs.append(self._message(RTM_DELROUTE, _DEL, len(msgs) + 1, prefix, ()))
        if msgs:
            for i in range(0, len(msgs), 256):  # stay well inside the socket buffers
                netlink.request(self.sock, msgs[i:i + 256], f"{self.ns}: routes")
        self.messages += len(msgs)
        return len(msgs)

    def neighbours(self, entries: Iterable[tuple[str, str, bytes]]) -> int:
        """Permanent neighbours ``(ifname, address, MAC)``, replacing what is there.

        An interface set administratively down loses even its permanent neighbours; the
        manager puts them back when the cable returns, so no ARP (and no ARP timeout) is
        ever needed on a router's cable.
        """
        msgs: list[bytes] = []
        for ifname, ip, mac in entries:
            body = _NDMSG.pack(socket.AF_INET, self.ifindex[ifname], NUD_PERMANENT, 0, 0)
            body += netlink.attr(NDA_DST, socket.inet_aton(ip)) + netlink.attr(NDA_LLADDR, mac)
            msgs.append(netlink.message(RTM_NEWNEIGH, _PUT, len(msgs) + 1, body))
        if msgs:
            netlink.request(self.sock, msgs, f"{self.ns}: neighbours")
        return len(msgs)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
