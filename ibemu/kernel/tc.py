"""The kernel forwarding plane of a switch: its LFT as tc u32 filters on a shared block.

The fallback for a kernel that refuses the BPF LFT classifier (``ibemu.kernel.lft_map``,
which fabrics use where it loads).

Every port of a switch has a clsact qdisc whose ingress is the switch's shared filter block.
In the block:

- prio 1: directed-route SMPs (VL15 and the permissive DLID) match and stop (no action):
  they continue up the stack to the SMA's packet socket, which relays them hop by hop.
  LID-routed SMPs are switched by the LFT like data, as a real switch does.
- prio 2: a u32 hash table of 256 buckets keyed on the low byte of the DLID; each LFT entry
  is one filter ``match DLID -> mirred egress redirect dev p<port>`` with the handle
  ``1:<dlid & 0xff>:<(dlid >> 8) + 1>``, so an entry is replaced or deleted by handle alone.
- no match (the switch's own LID, LIDs without a route): the frame reaches the SMA, which
  counts unroutable ones as the spec's PortRcvSwitchRelayErrors.

This kernel has no gact ("pass"/"drop" actions), so nothing here depends on them. u32 offsets
at ingress start at the LRH (the Ethernet header is already pulled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ibemu.kernel import rtnl
from ibemu.kernel.packet import ETH_P_IB
from ibemu.kernel.tc_netlink import BlockFilters, U32Route

BLOCK = 1
PROTO = "0x88b5"
HT = "1"
NO_ROUTE = 0xFF


def setup_lines(ifnames: Iterable[str]) -> list[str]:
    """What ``KernelLft.setup`` writes over netlink, as ``tc -batch`` lines (a root test checks
    that both build the same filters): clsact on every port sharing block 1, the
    directed-route rule, the LFT hash table and the link into it."""
    lines = [f"qdisc add dev {name} ingress_block {BLOCK} clsact" for name in ifnames]
    lines += [
        f"filter add block {BLOCK} prio 1 protocol {PROTO} handle 800::1 u32 match u32 0xf000ffff 0xf000ffff at 0 "
        "classid 1:15",
        f"filter add block {BLOCK} prio 2 protocol {PROTO} handle {HT}: u32 divisor 256",
        f"filter add block {BLOCK} prio 1 protocol {PROTO} handle 800::2 u32 ht 800:: match u8 0 0 "
        f"hashkey mask 0x000000ff at 0 link {HT}:",
    ]
    return lines


def _handle(lid: int) -> str:
    return f"{HT}:{lid & 0xFF:x}:{(lid >> 8) + 1:x}"


def lft_lines(changes: Mapping[int, int], *, installed: Mapping[int, int],
              ifnames: Mapping[int, str]) -> list[str]:
    """``tc -batch`` lines equivalent to ``KernelLft.apply`` (for debugging and docs)."""
    lines = []
    for lid, port in sorted(changes.items()):
        old = installed.get(lid)
        if port in (0, NO_ROUTE):
            if old is not None:
                lines.append(f"filter del block {BLOCK} prio 2 protocol {PROTO} handle {_handle(lid)} u32")
        elif old != port:
            verb = "replace" if old is not None else "add"
            lines.append(
                f"filter {verb} block {BLOCK} prio 2 protocol {PROTO} handle {_handle(lid)} u32 "
                f"ht {HT}:{lid & 0xFF:x}: match u16 {lid:#06x} 0xffff at 2 "
                f"action mirred egress redirect dev {ifnames[port]}"
            )
    return lines


class KernelLft:
    """The LFT of one switch as installed in tc: set up once, then minimal netlink updates."""

    def __init__(self, ns: str, ifnames: Mapping[int, str]) -> None:
        """``ifnames`` maps each cabled port number to its interface in ``ns``."""
        self.ns = ns
        self.ifnames = dict(ifnames)
        self.ports = sorted(ifnames)
        self.installed: dict[int, int] = {}
        self._ifindex: dict[int, int] = {}
        self._filters: BlockFilters | None = None

    def setup(self) -> None:
        """clsact + the shared block's skeleton (``setup_lines``), over netlink in one send."""
        index = rtnl.ifindexes(self.ns, self.ifnames.values())
        self._ifindex = {p: index[name] for p, name in self.ifnames.items()}
        self._filters = BlockFilters(self.ns, block=BLOCK, prio=2, protocol=ETH_P_IB, ht=1)
        self._filters.setup_switch(self._ifindex.values())

    def apply(self, changes: Mapping[int, int]) -> int:
        """Install ``changes`` (LID -> port; 0/0xFF = no route); returns kernel operations.

        Only entries that differ from what is installed are written.
        """
        if self._filters is None:
            raise RuntimeError("KernelLft.apply before setup()")
        put: list[tuple[U32Route, bool]] = []
        new_ports: dict[int, int] = {}
        delete: list[int] = []
        for lid, port in changes.items():
            if not 0 < lid < 0xC000:
                raise ValueError(f"LID {lid:#x} is not a unicast LID")
            old = self.installed.get(lid)
            if port in (0, NO_ROUTE):
                if old is not None:
                    delete.append(lid)
            elif old != port:
                if port not in self._ifindex:
                    raise ValueError(f"{self.ns}: port {port} is not cabled (cabled: {self.ports})")
                put.append((U32Route(lid, self._ifindex[port]), old is not None))
                new_ports[lid] = port
        n = self._filters.apply(put, delete)
        self.installed.update(new_ports)
        for lid in delete:
            del self.installed[lid]
        return n

    def close(self) -> None:
        if self._filters is not None:
            self._filters.close()
            self._filters = None
