"""LFT filters written straight over rtnetlink: u32 + mirred on a shared tc block.

``tc -batch`` costs a process spawn (2-3 ms here) per update and pyroute2 has no shared
blocks, so LFT updates — the hot path of a reroute — use a small encoder for exactly the
messages they need: RTM_NEWTFILTER (u32 with one key and a mirred redirect) and
RTM_DELTFILTER, sent together and acknowledged one by one. Layouts: linux/rtnetlink.h,
linux/pkt_cls.h (tc_u32_sel, tc_u32_key), linux/tc_act/tc_mirred.h.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ibemu.kernel import netlink, netns
from ibemu.kernel.commands import KernelError
from ibemu.kernel.netlink import (
    NLA_F_NESTED,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    NLMSGHDR,
    attr,
)

NETLINK_ROUTE = 0
RTM_NEWTFILTER = 44
RTM_DELTFILTER = 45
TCM_IFINDEX_MAGIC_BLOCK = 0xFFFFFFFF

RTM_NEWQDISC = 36
TC_H_CLSACT = 0xFFFFFFF1
TC_H_CLSACT_HANDLE = 0xFFFF0000
TCA_KIND = 1
TCA_OPTIONS = 2
TCA_INGRESS_BLOCK = 13
TCA_U32_CLASSID = 1
TCA_U32_HASH = 2
TCA_U32_LINK = 3
TCA_U32_DIVISOR = 4
TCA_U32_SEL = 5
TCA_U32_ACT = 7
TCA_ACT_KIND = 1
TCA_ACT_OPTIONS = 2
TCA_MIRRED_PARMS = 2
TCA_BPF_FD = 6
TCA_BPF_NAME = 7
TCA_BPF_FLAGS = 8
TCA_BPF_FLAG_ACT_DIRECT = 1
TC_U32_TERMINAL = 1
TC_ACT_STOLEN = 4
TCA_EGRESS_REDIR = 1

_TCMSG = struct.Struct("=BxxxiIII")
_SEL_ONE_KEY = struct.pack("=BBBxHHhhI", TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0)
"""A u32 selector's header: terminal, one key (the key follows)."""


def _u32_handle(ht: int, bucket: int, node: int) -> int:
    return (ht << 20) | (bucket << 12) | node


@dataclass(frozen=True, slots=True)
class U32Route:
    """``match u16 <value> at <offset>`` in hash bucket ``value & 0xff`` -> redirect."""

    value: int
    egress_ifindex: int


class BlockFilters:
    """A netlink socket in one namespace, writing u32 filters into a shared block."""

    def __init__(self, ns: str, *, block: int, prio: int, protocol: int, ht: int = 1,
                 match_offset: int = 2) -> None:
        self.ns = ns
        self.block = block
        self.info = (prio << 16) | socket.htons(protocol)
        self.ht = ht
        if match_offset % 2:
            raise ValueError("u16 match offset must be even")
        self.word_off = match_offset & ~3
        self.shift = 16 if match_offset % 4 == 0 else 0
        with netns.entered(ns):
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._seq = 1
        self._actions: dict[int, bytes] = {}

    def handle(self, value: int) -> int:
        return _u32_handle(self.ht, value & 0xFF, (value >> 8) + 1)

    def _message(self, kind: int, flags: int, handle: int, options: bytes | None) -> bytes:
        # tcm_ifindex is a signed int: TCM_IFINDEX_MAGIC_BLOCK (0xFFFFFFFF) packs as -1.
        body = _TCMSG.pack(0, -1, handle, self.block, self.info)
        body += attr(TCA_KIND, b"u32\0")
        if options is not None:
            body += attr(TCA_OPTIONS | NLA_F_NESTED, options)
        self._seq += 1
        return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, flags, self._seq, 0) + body

    def _route_options(self, route: U32Route) -> bytes:
        value = route.value
        key = struct.pack("!IIii", 0xFFFF << self.shift, (value & 0xFFFF) << self.shift, self.word_off, 0)
        ht_bucket = _u32_handle(self.ht, value & 0xFF, 0)
        return (attr(TCA_U32_HASH, struct.pack("=I", ht_bucket)) + attr(TCA_U32_SEL, _SEL_ONE_KEY + key)
                + self._redirect(route.egress_ifindex))

    def _redirect(self, ifindex: int) -> bytes:
        """The filter's action, a mirred redirect to ``ifindex`` (one per port, built once)."""
        cached = self._actions.get(ifindex)
        if cached is None:
            mirred = struct.pack("=IIiiiiI", 0, 0, TC_ACT_STOLEN, 0, 0, TCA_EGRESS_REDIR, ifindex)
            act = attr(TCA_ACT_KIND, b"mirred\0") + attr(
                TCA_ACT_OPTIONS | NLA_F_NESTED, attr(TCA_MIRRED_PARMS, mirred))
            cached = self._actions[ifindex] = attr(TCA_U32_ACT | NLA_F_NESTED, attr(1 | NLA_F_NESTED, act))
        return cached

    def setup_switch(self, ifindexes: Iterable[int], *, vl15_classid: int = 0x00010015) -> None:
        """The switch's forwarding skeleton (what ``tc.setup_lines`` says, in one send).

        clsact on every port with this block as ingress; in the root table (800:), first a
        rule for directed-route SMPs (VL15, DLID 0xFFFF) that stops classification (the frame
        goes up to the SMA; LID-routed SMPs are switched by the LFT), then a link
        hashing the DLID's low byte into table ``ht`` (256 buckets) where the LFT lives.
        This object's prio is the LFT's; the root rules go one prio earlier.
        """
        msgs = []
        for idx in ifindexes:
            body = _TCMSG.pack(0, idx, TC_H_CLSACT_HANDLE, TC_H_CLSACT, 0)
            body += attr(TCA_KIND, b"clsact\0") + attr(TCA_INGRESS_BLOCK, struct.pack("=I", self.block))
            self._seq += 1
            msgs.append(NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWQDISC,
                                       NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, self._seq, 0) + body)
        create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        root_info, lft_info = self.info - (1 << 16), self.info
        # VL15 with the permissive DLID: directed-route SMPs, which the SMA must relay.
        vl15_key = struct.pack("!IIii", 0xF000FFFF, 0xF000FFFF, 0, 0)
        vl15_sel = struct.pack("=BBBxHHhhI", TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0) + vl15_key
        self.info = root_info
        msgs.append(self._message(RTM_NEWTFILTER, create, _u32_handle(0x800, 0, 1),
                                  attr(TCA_U32_CLASSID, struct.pack("=I", vl15_classid))
                                  + attr(TCA_U32_SEL, vl15_sel)))
        self.info = lft_info
        msgs.append(self._message(RTM_NEWTFILTER, create, _u32_handle(self.ht, 0, 0),
                                  attr(TCA_U32_DIVISOR, struct.pack("=I", 256))))
        link_key = struct.pack("!IIii", 0, 0, 0, 0)
        link_sel = struct.pack("!BBBxHHhhI", 0, 0, 1, 0, 0, 0, 0, 0x000000FF) + link_key
        self.info = root_info
        msgs.append(self._message(RTM_NEWTFILTER, create, _u32_handle(0x800, 0, 2),
                                  attr(TCA_U32_HASH, struct.pack("=I", _u32_handle(0x800, 0, 0)))
                                  + attr(TCA_U32_LINK, struct.pack("=I", _u32_handle(self.ht, 0, 0)))
                                  + attr(TCA_U32_SEL, link_sel)))
        self.info = lft_info
        first_seq = self._seq - len(msgs) + 1
        self._send_all(msgs)
        self._collect_acks(first_seq, len(msgs))

    def setup_switch_bpf(self, ifindexes: Iterable[int], prog_fd: int, *, name: str,
                         vl15_classid: int = 0x00010015) -> None:
        """The switch's forwarding skeleton with the LFT in a BPF program
        (``ibemu.kernel.lft_map``), in one send: clsact on every port with this block as
        ingress, the directed-route rule in the root table (one prio earlier, as in
        ``setup_switch``), and the direct-action ``bpf`` filter ``prog_fd`` at this prio."""
        create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
        msgs = []
        for idx in ifindexes:
            body = _TCMSG.pack(0, idx, TC_H_CLSACT_HANDLE, TC_H_CLSACT, 0)
            body += attr(TCA_KIND, b"clsact\0") + attr(TCA_INGRESS_BLOCK, struct.pack("=I", self.block))
            self._seq += 1
            msgs.append(NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWQDISC, create, self._seq, 0) + body)
        vl15_key = struct.pack("!IIii", 0xF000FFFF, 0xF000FFFF, 0, 0)
        vl15_sel = struct.pack("=BBBxHHhhI", TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0) + vl15_key
        lft_info = self.info
        self.info = lft_info - (1 << 16)
        msgs.append(self._message(RTM_NEWTFILTER, create, _u32_handle(0x800, 0, 1),
                                  attr(TCA_U32_CLASSID, struct.pack("=I", vl15_classid))
                                  + attr(TCA_U32_SEL, vl15_sel)))
        self.info = lft_info
        msgs.append(self._bpf_message(prog_fd, name, lft_info))
        first_seq = self._seq - len(msgs) + 1
        self._send_all(msgs)
        self._collect_acks(first_seq, len(msgs))

    def _bpf_message(self, prog_fd: int, name: str, info: int) -> bytes:
        """RTM_NEWTFILTER: a direct-action ``bpf`` filter (handle 1) at ``info``'s prio."""
        body = _TCMSG.pack(0, -1, 1, self.block, info) + attr(TCA_KIND, b"bpf\0")
        body += attr(TCA_OPTIONS | NLA_F_NESTED,
                      attr(TCA_BPF_FD, struct.pack("=I", prog_fd)) + attr(TCA_BPF_NAME, name.encode() + b"\0")
                      + attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT)))
        self._seq += 1
        return NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_NEWTFILTER,
                             NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, self._seq, 0) + body

    def apply(self, put: Sequence[tuple[U32Route, bool]], delete: Iterable[int] = ()) -> int:
        """Write routes (``(route, exists)``: replace if it exists, else create) and deletions.

        All messages go in one send; every ack is checked. Returns the message count.
        """
        msgs = []
        for route, exists in put:
            flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | (NLM_F_REPLACE if exists else NLM_F_EXCL)
            msgs.append(self._message(RTM_NEWTFILTER, flags, self.handle(route.value), self._route_options(route)))
        for value in delete:
            msgs.append(self._message(RTM_DELTFILTER, NLM_F_REQUEST | NLM_F_ACK, self.handle(value), None))
        if not msgs:
            return 0
        first_seq = self._seq - len(msgs) + 1
        self._send_all(msgs)
        self._collect_acks(first_seq, len(msgs))
        return len(msgs)

    def replace_dr_rule_with_bpf(self, prog_fd: int, *, name: str = "dr_relay", prio: int) -> None:
        """Hand directed-route SMPs to a direct-action BPF program (``ibemu.kernel.dr_relay``)
        instead of stopping them at the root rule: add it as a ``bpf`` filter at ``prio``
        (after the LFT's, which a permissive DLID never matches), then delete the root rule
        ``800::1`` that would stop them first. Frames the program does not take go on to the
        stack, i.e. the SMA, as before. ``tc filter show block 1`` shows both changes."""
        add = self._bpf_message(prog_fd, name, (prio << 16) | (self.info & 0xFFFF))
        root_info = self.info - (1 << 16)
        body = _TCMSG.pack(0, -1, _u32_handle(0x800, 0, 1), self.block, root_info) + attr(TCA_KIND, b"u32\0")
        self._seq += 1
        delete = NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_DELTFILTER, NLM_F_REQUEST | NLM_F_ACK,
                                self._seq, 0) + body
        self._send_all([add])
        self._collect_acks(self._seq - 1, 1)
        self._send_all([delete])
        self._collect_acks(self._seq, 1)

    def flush(self) -> None:
        """Delete every filter of the block (``tc filter del block N``), with their actions.

        For teardown: each mirred action sits on one kernel-wide list that every unregistering
        interface walks; a k=16 fabric routed by an SM holds ~430,000 of them, and deleting its
        namespaces with the filters still in place kept the kernel busy (RTNL held, no
        namespace could be created) for ~2.5 minutes. Flushed first, the list is short.
        """
        body = _TCMSG.pack(0, -1, 0, self.block, 0)
        self._seq += 1
        self._send_all([NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_DELTFILTER,
                                       NLM_F_REQUEST | NLM_F_ACK, self._seq, 0) + body])
        self._collect_acks(self._seq, 1)

    def _send_all(self, msgs: list[bytes]) -> None:
        chunk: list[bytes] = []
        size = 0
        for m in msgs:  # stay well inside the socket buffer per send
            if size + len(m) > 60_000 and chunk:
                self.sock.send(b"".join(chunk))
                chunk, size = [], 0
            chunk.append(m)
            size += len(m)
        if chunk:
            self.sock.send(b"".join(chunk))

    def _collect_acks(self, first_seq: int, count: int) -> None:
        failed = netlink.acks(self.sock, first_seq, count)
        if failed:
            seq, err = failed[0]
            raise KernelError(f"tc filter update in {self.ns}: {len(failed)} failed "
                              f"(message {seq - first_seq + 1}: {os.strerror(err)})")

    def close(self) -> None:
        self.sock.close()
