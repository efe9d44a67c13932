"""QoS the SM programs: data VLs, SL -> VL maps and VL arbitration, from a scenario's
``fabric.qos`` (``python -m ibemu.sm --qos JSON``).

After LIDs and routes and before activation (ports are still in Init, where IBA wants
OperationalVLs changed), :func:`program_qos` writes, over directed routes:

- PortInfo: OperationalVLs (the VLCap code of ``vls``) and VLHighLimit, on every port of a live
  link (switch ports and CA ports);
- SLtoVLMappingTable: the one map on every CA port, and on every switch for every (input,
  output) pair of its live ports, input port 0 (the switch's own management port) included;
- VLArbitrationTable: block 1 (low priority) and block 3 (high) on every port of a live link,
  each up to the port's VLArbitrationLowCap / HighCap (8) entries.

Deviations: the same map and tables everywhere (OpenSM's per-port-group and per-switch QoS
policies are not offered); programmed on the cold sweep only (a switch that joins later keeps
its defaults until the next full sweep).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import trio

from ibemu.physics.qos import NUM_SLS, VlArb, code_of_vls
from ibemu.sm.discovery import ATTR_PORT_INFO, Discovery, End
from ibemu.wire import madcodec as mb
from ibemu.wire.madattrs import sl2vl_table, vl_arb_block

ATTR_SL2VL = 0x0017
ATTR_VL_ARB = 0x0018
BLOCK_LOW, BLOCK_HIGH = 1, 3


@dataclass(frozen=True, slots=True)
class SmQos:
    vls: int = 1
    sl2vl: tuple[int, ...] = ()
    """16 VLs; empty: SL mod vls."""
    vlarb_high: tuple[tuple[int, int], ...] = ()
    vlarb_low: tuple[tuple[int, int], ...] = ()
    vl_high_limit: int = 0

    def __post_init__(self) -> None:
        code_of_vls(self.vls)  # raises on a bad count
        if self.sl2vl and len(self.sl2vl) != NUM_SLS:
            raise ValueError("an SL -> VL map has 16 entries")
        VlArb(high=self.vlarb_high, low=self.vlarb_low, high_limit=self.vl_high_limit)

    def sl_to_vl(self) -> tuple[int, ...]:
        return self.sl2vl or tuple(sl % self.vls for sl in range(NUM_SLS))

    def tables(self) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """(high, low): as given, or with neither given every VL once in the low table."""
        if self.vlarb_high or self.vlarb_low:
            return self.vlarb_high, self.vlarb_low
        d = VlArb.default(self.vls)
        return d.high, d.low

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SmQos:
        d: dict[str, Any] = json.loads(text)
        return cls(vls=int(d.get("vls", 1)), sl2vl=tuple(d.get("sl2vl") or ()),
                   vlarb_high=tuple((int(v), int(w)) for v, w in d.get("vlarb_high") or ()),
                   vlarb_low=tuple((int(v), int(w)) for v, w in d.get("vlarb_low") or ()),
                   vl_high_limit=int(d.get("vl_high_limit", 0)))


def _live_ports(disc: Discovery) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for node in disc.graph.nodes.values():
        out[node.guid] = sorted(num for num, p in node.ports.items() if p.peer is not None and num)
    return out


async def program_qos(disc: Discovery, qos: SmQos) -> dict[str, int]:
    """Write ``qos`` into every live port (see the module docstring); counts of Sets that
    succeeded and failed per attribute."""
    counts = {"port_info": 0, "sl2vl": 0, "vlarb": 0, "failed": 0}
    sl2vl = sl2vl_table(qos.sl_to_vl())
    high, low = qos.tables()
    blocks = {BLOCK_LOW: vl_arb_block(low), BLOCK_HIGH: vl_arb_block(high)}
    opvls = code_of_vls(qos.vls)

    async def smp(kind: str, path: list[int], attr: int, mod: int, data: bytes, end: End | None = None) -> None:
        ok = await disc.set_attr(f"QoS {kind}", path, attr, mod, data, end=end) is not None
        counts[kind if ok else "failed"] += 1

    async with trio.open_nursery() as n:
        for guid, ports in _live_ports(disc).items():
            node = disc.graph.nodes[guid]
            for num in ports:
                pi = disc.port_info.get((guid, num))
                path = list(node.dr_path if node.is_switch else node.ports[num].dr_path)
                if pi is not None:
                    n.start_soon(smp, "port_info", path, ATTR_PORT_INFO, num,
                                 mb.port_info_set(pi, operational_vls=opvls, vl_high_limit=qos.vl_high_limit),
                                 (guid, num))
                for block, data in blocks.items():
                    n.start_soon(smp, "vlarb", path, ATTR_VL_ARB, (block << 16) | (num if node.is_switch else 0),
                                 data)
                if node.is_switch:
                    for inp in (0, *ports):
                        n.start_soon(smp, "sl2vl", path, ATTR_SL2VL, (inp << 8) | num, sl2vl)
                else:
                    n.start_soon(smp, "sl2vl", path, ATTR_SL2VL, 0, sl2vl)
    return counts
