"""Direct-action eBPF classifiers on clsact hooks.

``attach_bpf(ns, hooks, ...)`` puts one ``bpf`` filter (direct action) on the ingress or egress
of each hooked interface of a namespace, creating its clsact qdisc first where asked: one
netlink send and its acks per namespace (``ibemu.kernel.netlink``).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ibemu.kernel import rtnl
from ibemu.kernel.netlink import (
    NLA_F_NESTED,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    attr,
    message,
    request,
    route_socket,
)

TCMSG = struct.Struct("=BxxxiIII")
RTM_NEWQDISC, RTM_NEWTFILTER = 36, 44
TC_H_ROOT = 0xFFFFFFFF
TC_H_CLSACT, TC_H_CLSACT_HANDLE = 0xFFFFFFF1, 0xFFFF0000
INGRESS, EGRESS = 0xFFFFFFF2, 0xFFFFFFF3
"""The clsact hooks, as a filter's parent."""
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_BPF_FD, TCA_BPF_NAME, TCA_BPF_FLAGS, TCA_BPF_FLAG_ACT_DIRECT = 6, 7, 8, 1
ETH_P_ALL = 0x0003


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
