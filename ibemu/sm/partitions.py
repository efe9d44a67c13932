"""Partitions ibemu's SM programs: P_KeyTables of CA ports and of the switch ports facing them,
and the switches' partition enforcement bits (``python -m ibemu.sm --partitions JSON``, from a
scenario's ``partitions:``).

Each partition has a P_Key (0x0001-0x7FFF), members (node GUIDs of CAs, each a full or a
limited member; or every CA) and an enforcement mode (``both``, ``in``, ``out``, ``off``, as
OpenSM's ``part_enforce``). :func:`tables` gives every CA port the table

    entry 0: 0xFFFF (the default partition, every port a full member: management and
             traffic on the default key go on as without partitions), then
    entries 1..: the P_Key of each partition the CA is in, bit 15 set for a full member,

and the switch port at the far end of the CA's cable the same table (what the CA may send is
what the port lets in, what it may receive what the port lets out). That switch port's
PortInfo gets PartitionEnforcementInbound/Outbound from the modes of the CA's partitions
(their union; a CA in no partition: the union of every partition's mode, so it is fenced off
from them too). Ports between switches are left alone (no enforcement), as OpenSM does.

:func:`program_partitions` writes, over directed routes, only the tables and PortInfos that
differ from what it wrote before (a cold sweep writes them all), after LIDs and before
activation. Deviations from OpenSM: the default partition is 0xFFFF with every port a full
member (OpenSM's stock ``Default=0x7fff : ALL, SELF=full`` makes CAs limited members of it);
no IPoIB/multicast groups (``ipoib`` flags, MGIDs) are created; members are whole CAs (every
port), not single port GUIDs.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from ibemu.sm.discovery import ATTR_PKEY_TABLE, ATTR_PORT_INFO, Discovery, End
from ibemu.wire import madcodec as mb

DEFAULT_PKEY = 0xFFFF
FULL = 0x8000
ENFORCE_MODES = ("both", "in", "out", "off")
ENFORCE_BITS = {"both": 0x8 | 0x4, "in": 0x8, "out": 0x4, "off": 0}
"""PortInfo PartitionEnforcementInbound (bit 3) / Outbound (bit 2) of each mode (FilterRaw
bits stay 0: raw packets pass, as OpenSM leaves them)."""
SWITCH_PKEY_CAP = 32
"""P_Key entries of an ibemu switch's external port (SwitchInfo.PartitionEnforcementCap):
a CA can be in ``SWITCH_PKEY_CAP - 1`` partitions besides the default one."""
BLOCK = 32


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    pkey: int
    members: tuple[tuple[int, bool], ...] = ()
    """(CA node GUID, full member); empty with ``everyone``: every CA."""
    everyone: bool = False
    everyone_full: bool = True
    enforce: str = "both"

    def __post_init__(self) -> None:
        if not 0x0001 <= self.pkey <= 0x7FFF:
            raise ValueError(f"partition {self.name}: P_Key {self.pkey:#x} is not within 0x0001..0x7fff")
        if self.enforce not in ENFORCE_MODES:
            raise ValueError(f"partition {self.name}: enforce must be one of {', '.join(ENFORCE_MODES)}")

    def membership(self, guid: int) -> bool | None:
        """True: full member, False: limited, None: not a member."""
        if self.everyone:
            return self.everyone_full
        for g, full in self.members:
            if g == guid:
                return full
        return None


@dataclass(frozen=True, slots=True)
class SmPartitions:
    partitions: tuple[Partition, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        return json.dumps([{"name": p.name, "pkey": p.pkey, "members": [[g, f] for g, f in p.members],
                            "everyone": p.everyone, "everyone_full": p.everyone_full, "enforce": p.enforce}
                           for p in self.partitions])

    @classmethod
    def from_json(cls, text: str) -> SmPartitions:
        items: list[dict[str, Any]] = json.loads(text)
        return cls(tuple(Partition(str(d["name"]), int(d["pkey"]),
                                   tuple((int(g), bool(f)) for g, f in d.get("members") or ()),
                                   bool(d.get("everyone")), bool(d.get("everyone_full", True)),
                                   str(d.get("enforce", "both"))) for d in items))

    def table(self, guid: int) -> list[int]:
        """The P_KeyTable of CA ``guid``'s ports (and of the switch ports facing them)."""
        out = [DEFAULT_PKEY]
        for p in self.partitions:
            m = p.membership(guid)
            if m is not None:
                out.append(p.pkey | (FULL if m else 0))
        if len(out) > SWITCH_PKEY_CAP:
            raise ValueError(f"CA {guid:#x} is in {len(out) - 1} partitions: a switch port holds "
                             f"{SWITCH_PKEY_CAP} P_Keys, the default one included")
        return out

    def enforcement(self, guid: int) -> int:
        """PortInfo partition bits of the switch port facing CA ``guid``."""
        mine = [p for p in self.partitions if p.membership(guid) is not None] or list(self.partitions)
        bits = 0
        for p in mine:
            bits |= ENFORCE_BITS[p.enforce]
        return bits


def blocks(table: list[int], entries: int) -> list[bytes]:
    """``table`` padded with 0 to ``entries`` as 64-byte P_KeyTable blocks."""
    padded = table + [0] * (max(entries, len(table)) - len(table))
    padded += [0] * (-len(padded) % BLOCK)
    return [struct.pack(f"!{BLOCK}H", *padded[i : i + BLOCK]) for i in range(0, len(padded), BLOCK)]


def _ca_ends(disc: Discovery) -> Iterable[tuple[End, End]]:
    """(CA port, the switch port facing it) of every cable from a CA to a switch."""
    for node in disc.graph.nodes.values():
        if node.is_switch:
            continue
        for num, p in node.ports.items():
            if p.peer is None:
                continue
            far = disc.graph.nodes.get(p.peer[0])
            if far is not None and far.is_switch:
                yield (node.guid, num), p.peer


async def program_partitions(disc: Discovery, parts: SmPartitions, written: dict[tuple[End, int], bytes]) -> dict[str, int]:
    """Write the partitions' tables and enforcement bits (module docstring); ``written`` is
    what earlier passes wrote (updated). Counts of Sets done and failed."""
    counts = {"tables": 0, "ports": 0, "failed": 0}

    async def smp(what: str, key: tuple[End, int], path: list[int], attr: int, mod: int, data: bytes,
                  end: End | None = None) -> None:
        r = await disc.set_attr(f"partitions: {what}", path, attr, mod, data, end=end)
        if r is None:
            counts["failed"] += 1
            return
        written[key] = bytes([data[43] & 0x0F]) if attr == ATTR_PORT_INFO else data
        if attr == ATTR_PKEY_TABLE and mod == 0 and not disc.graph.nodes[key[0][0]].is_switch:
            disc.pkeys[key[0]] = r.data  # entry 0 is 0xFFFF: set_pkeys leaves it be
        counts["tables" if attr == ATTR_PKEY_TABLE else "ports"] += 1

    async with trio.open_nursery() as n:
        for (ca, cnum), (sw, snum) in _ca_ends(disc):
            table = parts.table(ca)
            ca_node, sw_node = disc.graph.nodes[ca], disc.graph.nodes[sw]
            ca_path = list(ca_node.ports[cnum].dr_path)
            for b, data in enumerate(blocks(table, BLOCK)):
                if written.get(((ca, cnum), b)) != data:
                    n.start_soon(smp, "CA P_KeyTable", ((ca, cnum), b), ca_path, ATTR_PKEY_TABLE, b, data)
            sw_path = list(sw_node.dr_path)
            data = blocks(table, BLOCK)[0]
            if written.get(((sw, snum), 0)) != data:
                n.start_soon(smp, "switch P_KeyTable", ((sw, snum), 0), sw_path, ATTR_PKEY_TABLE, snum << 16, data)
            bits = parts.enforcement(ca)
            pi = disc.port_info.get((sw, snum))
            if pi is not None and (written.get(((sw, snum), -1)) != bytes([bits]) or pi[43] & 0x0F != bits):
                n.start_soon(smp, "PortInfo", ((sw, snum), -1), sw_path, ATTR_PORT_INFO, snum,
                             mb.port_info_set(pi, partition_flags=bits), (sw, snum))
    return counts
