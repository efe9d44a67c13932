"""Direct-action eBPF classifiers on clsact hooks, and the raw rtnetlink they are written with.

``attach_bpf(ns, hooks, ...)`` puts one ``bpf`` filter (direct action) on the ingress or egress
of each hooked interface of a namespace, creating its clsact qdisc first where asked: one
netlink send and its acks per namespace. The message helpers (``attr``, ``request``,
``route_socket`` and the constants) also serve other raw rtnetlink writers (routes,
neighbours, qdiscs).
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ibemu.kernel import netns, rtnl
from ibemu.kernel.commands import KernelError

NLMSGHDR = struct.Struct("=IHHII")
TCMSG = struct.Struct("=BxxxiIII")
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_REPLACE = 0x1, 0x4, 0x200, 0x400, 0x100
NLMSG_ERROR = 2
RTM_NEWQDISC, RTM_NEWTFILTER = 36, 44
TC_H_ROOT = 0xFFFFFFFF
TC_H_CLSACT, TC_H_CLSACT_HANDLE = 0xFFFFFFF1, 0xFFFF0000
INGRESS, EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
"""The clsact hooks, as a filter's parent."""
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT = 6, 7, 8, 1
NLA_F_NESTED = 0x8000
ETH_P_ALL = 0x0003


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * (-n % 4)


def message(kind: int, flags: int, seq: int, body: bytes) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def request(sock: socket.socket, msgs: list[bytes], what: str) -> None:
    """Send ``msgs`` (sequence numbers 1..n) and check every ack."""
    sock.send(b"".join(msgs))
    pending, errors = len(msgs), []
    while pending:
        data = sock.recv(1 << 16)
        off = 0
        while off + NLMSGHDR.size <= len(data):
            length, kind, _f, _seq, _pid = NLMSGHDR.unpack_from(data, off)
            if length < NLMSGHDR.size:
                break
            if kind == NLMSG_ERROR:
                err = struct.unpack_from("=i", data, off + NLMSGHDR.size)[0]
                if err:
                    errors.append(os.strerror(-err))
                pending -= 1
            off += (length + 3) & ~3
    if errors:
        raise KernelError(f"{what}: {len(errors)} of {len(msgs)} failed ({errors[0]})")


def route_socket(ns: str) -> socket.socket:
    """An rtnetlink socket in ``ns`` (1 MiB of receive buffer for the acks of large batches)."""
    with netns.entered(ns):
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return sock


@dataclass(frozen=True, slots=True)
class BpfHook:
    """A program for one interface; ``add_clsact``: create its clsact qdisc first."""

    ifname: str
    prog_fd: int
    add_clsact: bool = True


def attach_bpf(ns: str, hooks: Sequence[BpfHook], *, parent: int, prio: int, name: str, what: str) -> None:
    """A direct-action ``bpf`` filter (all protocols, priority ``prio``, named ``name``) on the
    ``parent`` hook (INGRESS or EGRESS) of each interface in ``hooks``, all in ``ns``."""
    if not hooks:
        return
    idx = rtnl.ifindexes(ns, [h.ifname for h in hooks])
    create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    bodies: list[tuple[int, bytes]] = []
    for h in hooks:
        if h.add_clsact:
            bodies.append((RTM_NEWQDISC, TCMSG.pack(0, idx[h.ifname], TC_H_CLSACT_HANDLE, TC_H_CLSACT, 0)
                           + attr(TCA_KIND, b"clsact\0")))
        options = (attr(TCA_BPF_FD, struct.pack("=I", h.prog_fd)) + attr(TCA_BPF_NAME, name.encode() + b"\0")
                   + attr(TCA_BPF_FLAGS, struct.pack("=I", TCA_BPF_FLAG_ACT_DIRECT)))
        bodies.append((RTM_NEWTFILTER, TCMSG.pack(0, idx[h.ifname], 0, parent, (prio << 16) | socket.htons(ETH_P_ALL))
                       + attr(TCA_KIND, b"bpf\0") + attr(TCA_OPTIONS | NLA_F_NESTED, options)))
    sock = route_socket(ns)
    try:
        request(sock, [message(kind, create, seq, body) for seq, (kind, body) in enumerate(bodies, 1)], what)
    finally:
        sock.close()
