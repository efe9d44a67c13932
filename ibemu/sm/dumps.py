"""OpenSM's dump files from ibemu's SM state: ``opensm-subnet.lst``, ``opensm-lfts.dump``, ``guid2lid``.

Pure: the SM's view (``SubnetGraph``, the PortInfo it last read or wrote, its LFTs and LIDs)
goes in, the text of each file comes out; ``SubnetManager`` writes them (``SmConfig.dump_dir``,
atomic renames) after each heavy sweep and each reroute. SM developers diff these files
against OpenSM's own for the same fabric, so the formats are OpenSM's, field for field
(``osm_dump.c``: ``dump_topology_node``, ``dump_ucast_lfts``; ``osm_db_pack.c`` for
``guid2lid``), including its quirks:

- ``opensm-subnet.lst``: one line per cabled port (ports 1..N of every node), the local end
  then the far end. The far end's VenID is printed 8 digits wide and its DevID shifted into
  the upper 16 bits (OpenSM converts the 16-bit field with a 32-bit byte swap), the local
  end's 6 and 4 digits. A switch shows its port 0's LID; ``-SM`` follows the type of a node
  whose LID is the master SM's LID. SPD is 2.5/5/10, or the extended speed (14/25/50) when
  the port's CapabilityMask has IsExtendedSpeedsSupported; FDR10 (which OpenSM reads from the
  vendor's MLNX ExtendedPortInfo, an attribute ibemu's SM does not query) is never shown:
  ibemu's links never run FDR10.
- ``opensm-lfts.dump``: per switch, ``Unicast lids [0-TOP]`` then one line per LID that has
  a port (LIDs without a route are left out, as OpenSM leaves out port 255), and the
  closing line ``TOP lids dumped`` (OpenSM prints the top LID there, not a count).
- Nodes come in the order of OpenSM's GUID maps: keyed by the GUID in network byte order and
  compared as a little-endian integer, i.e. sorted by the byte-reversed GUID.
- ``guid2lid``: ``0xGUID 0xMIN 0xMAX`` and an empty line per port; OpenSM writes its hash
  table's order, here they are sorted by GUID (a reader must not depend on the order).

The parsers (``parse_*``) read both OpenSM's files and these (the diff tests use them); each
names the line it cannot read.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from ibemu.sm.graph import NodeType, SmNode, SubnetGraph

SUBNET_LST = "opensm-subnet.lst"
LFTS_DUMP = "opensm-lfts.dump"
GUID2LID = "guid2lid"
FILES = (SUBNET_LST, LFTS_DUMP, GUID2LID)

CAP_EXT_SPEEDS = 0x00004000  # PortInfo CapabilityMask: IsExtendedSpeedsSupported
CAP2_WIDTH_2X = 0x0010  # PortInfo CapabilityMask2: IsLinkWidth2xSupported
NO_PATH = 255

_TYPE_SHORT = {NodeType.SWITCH: "SW", NodeType.CA: "CA", NodeType.ROUTER: "Rt"}
_TYPE_LONG = {NodeType.SWITCH: "Switch", NodeType.CA: "Channel Adapter", NodeType.ROUTER: "Router"}
_STATE = {4: "ACT", 3: "ARM", 2: "INI"}
_SPEED = {1: "2.5", 2: "5", 4: "10"}
_SPEED_EXT = {1: "14", 2: "25", 4: "50"}
_WIDTH = {1: "1x", 2: "4x", 4: "8x", 8: "12x"}


def map_order(guid: int) -> int:
    """Sort key of OpenSM's GUID maps (network-order GUIDs compared as host integers)."""
    return int.from_bytes(guid.to_bytes(8, "big"), "little")


def print_desc(desc: str) -> str:
    """OpenSM's ``print_desc``: the NodeDescription with non-printable characters as blanks."""
    return "".join(c if " " <= c <= "~" else " " for c in desc)


@dataclass(frozen=True, slots=True)
class _PortView:
    lid: int = 0
    sm_lid: int = 0
    cap: int = 0
    cap2: int = 0
    state: int = 0
    width: int = 0
    speed: int = 0
    speed_ext: int = 0


def _port_view(data: bytes | None) -> _PortView:
    if not data or len(data) < 64:
        return _PortView()
    lid, sm_lid, cap = struct.unpack_from("!HHI", data, 16)
    cap2 = struct.unpack_from("!H", data, 60)[0]
    return _PortView(lid, sm_lid, cap, cap2, data[32] & 0x0F, data[31], data[35] >> 4, data[62] >> 4)


def _default(node: SmNode, num: int, port_info: Mapping[tuple[int, int], bytes]) -> tuple[_PortView, int]:
    """The PortInfo OpenSM takes a node's LID and SM flag from (a switch's port 0, a CA's own
    port) and that LID (the graph's, which the SM assigned, when the PortInfo has none)."""
    num = 0 if node.is_switch else num
    view = _port_view(port_info.get((node.guid, num)))
    port = node.ports.get(num)
    return view, view.lid or (port.lid if port else 0)


def _end(node: SmNode, num: int, port_info: Mapping[tuple[int, int], bytes], *, far: bool) -> str:
    view, lid = _default(node, num, port_info)
    port = node.ports[num]
    sm = "-SM" if lid and view.sm_lid == lid else ""
    if far:
        ven, dev = f"{node.vendor_id:08X}", f"{(node.device_id << 16) & 0xFFFFFFFF:04X}"
    else:
        ven, dev = f"{node.vendor_id:06X}", f"{node.device_id:04X}"
    return (f"{{ {_TYPE_SHORT.get(node.kind, '**')}{sm} Ports:{node.num_ports:02X} "
            f"SystemGUID:{node.system_guid:016x} NodeGUID:{node.guid:016x} PortGUID:{port.guid:016x} "
            f"VenID:{ven} DevID:{dev} Rev:{node.revision:08X} {{{print_desc(node.desc)}}} "
            f"LID:{lid:04X} PN:{num:02X} }}")


def _link(node: SmNode, num: int, port_info: Mapping[tuple[int, int], bytes]) -> str:
    """``PHY=4x LOG=ACT SPD=25`` of the local port (its width, state and speed)."""
    view = _port_view(port_info.get((node.guid, num)))
    default, _lid = _default(node, num, port_info)
    speed = _SPEED.get(view.speed, "??")
    if default.cap & CAP_EXT_SPEEDS and view.speed_ext:
        speed = _SPEED_EXT.get(view.speed_ext, "??")
    width = _WIDTH.get(view.width, "??")
    if view.width == 16 and default.cap2 & CAP2_WIDTH_2X:
        width = "2x"
    state = view.state or node.ports[num].state
    return f"PHY={width} LOG={_STATE.get(state, 'DWN')} SPD={speed}"


def node_links(graph: SubnetGraph, node: SmNode, port_info: Mapping[tuple[int, int], bytes]) -> str:
    """The ``opensm-subnet.lst`` lines of one node: each cabled port, both ends and the link."""
    lines = []
    for num, port in sorted(node.ports.items()):
        if num == 0 or port.peer is None:
            continue
        far = graph.nodes.get(port.peer[0])
        if far is None or port.peer[1] not in far.ports:
            continue
        lines.append(f"{_end(node, num, port_info, far=False)} "
                     f"{_end(far, port.peer[1], port_info, far=True)} {_link(node, num, port_info)}\n")
    return "".join(lines)


def subnet_lst(graph: SubnetGraph, port_info: Mapping[tuple[int, int], bytes]) -> str:
    """``opensm-subnet.lst``: every cabled port of every node, both ends and the link."""
    return "".join(node_links(graph, n, port_info) for n in in_map_order(graph.nodes.values()) if n.num_ports)


def in_map_order(nodes: Iterable[SmNode]) -> list[SmNode]:
    return sorted(nodes, key=lambda n: map_order(n.guid))


def lid_labels(graph: SubnetGraph) -> dict[int, str]:
    """LID -> what ``opensm-lfts.dump`` says after ``#`` (the same on every switch)."""
    out = {}
    for lid, (guid, num) in graph.lid_owners().items():
        far = graph.nodes[guid]
        out[lid] = (f"{_TYPE_LONG.get(far.kind, 'Unknown')} portguid 0x{far.ports[num].guid:016x}: "
                    f"'{print_desc(far.desc)}'")
    return out


def switch_lft(node: SmNode, lft: Mapping[int, int], top: int, labels: Mapping[int, str]) -> str:
    """One switch's table in ``opensm-lfts.dump``: LIDs 0..``top`` that have a port."""
    rows = [f"Unicast lids [0-{top}] of switch Lid {node.lid} guid 0x{node.guid:016x} "
            f"('{print_desc(node.desc)}'):\n"]
    last = node.num_ports  # OpenSM leaves out a port >= its number of physical ports (N + 1)
    for lid in range(top + 1):
        port = lft.get(lid, NO_PATH)
        if port <= last:
            rows.append(f"0x{lid:04x} {port:03d} # {labels.get(lid, 'unknown node and type')}\n")
    rows.append(f"{top} lids dumped\n")
    return "".join(rows)


def lfts_dump(graph: SubnetGraph, lfts: Mapping[int, Mapping[int, int]], top: int) -> str:
    """``opensm-lfts.dump``: every switch's unicast LFT, LIDs 0..``top``, named by owner."""
    labels = lid_labels(graph)
    return "".join(switch_lft(n, lfts[n.guid], top, labels) for n in in_map_order(graph.switches())
                   if n.guid in lfts)


def guid2lid(lids: Mapping[int, int]) -> str:
    """OpenSM's ``guid2lid`` cache: port GUID, its LID range (LMC 0: one LID)."""
    return "".join(f"0x{guid:016x} 0x{lid:04x} 0x{lid:04x}\n\n" for guid, lid in sorted(lids.items()) if lid)


def render(graph: SubnetGraph, port_info: Mapping[tuple[int, int], bytes],
           lfts: Mapping[int, Mapping[int, int]], lids: Mapping[int, int], top: int) -> dict[str, str]:
    """All three files (name -> text). ``lids``: port GUID -> LID (the SM's LID table, which
    keeps the GUIDs of nodes gone, as OpenSM's cache does)."""
    out: dict[str, list[str]] = {name: [] for name in FILES}
    for name, chunk in iter_render(graph, port_info, lfts, lids, top):
        out[name].append(chunk)
    return {name: "".join(chunks) for name, chunks in out.items()}


def iter_render(graph: SubnetGraph, port_info: Mapping[tuple[int, int], bytes],
                lfts: Mapping[int, Mapping[int, int]], lids: Mapping[int, int],
                top: int) -> Iterator[tuple[str, str]]:
    """``render`` in pieces, (file name, text): a node's links, a switch's table, the cache.
    On a large fabric the SM yields to its event loop between pieces (a k=8 fat-tree's tables
    are 1.1 MB), and starts over when a pass changed its state meanwhile."""
    for node in in_map_order(graph.nodes.values()):
        if node.num_ports:
            yield SUBNET_LST, node_links(graph, node, port_info)
    labels = lid_labels(graph)
    for node in in_map_order(graph.switches()):
        lft = lfts.get(node.guid)
        if lft is not None:
            yield LFTS_DUMP, switch_lft(node, lft, top, labels)
    yield GUID2LID, guid2lid(lids)


# ---------------------------------------------------------------------- parsing

@dataclass(frozen=True, slots=True)
class LstEnd:
    kind: str  # SW | CA | Rt, without -SM
    sm: bool
    num_ports: int
    node_guid: int
    port_guid: int
    desc: str
    lid: int
    port: int


@dataclass(frozen=True, slots=True)
class LstLink:
    local: LstEnd
    far: LstEnd
    width: str
    state: str
    speed: str


_END = re.compile(r"\{ (SW|CA|Rt|\*\*)(-SM)? Ports:([0-9A-F]+) SystemGUID:[0-9a-f]+ NodeGUID:([0-9a-f]+) "
                  r"PortGUID:([0-9a-f]+) VenID:[0-9A-F]+ DevID:[0-9A-F]+ Rev:[0-9A-F]+ \{(.*?)\} "
                  r"LID:([0-9A-F]+) PN:([0-9A-F]+) \}")
_LINK = re.compile(r"PHY=(\S+) LOG=(\S+) SPD=(\S+)$")


def _lst_end(m: re.Match[str]) -> LstEnd:
    return LstEnd(m[1], bool(m[2]), int(m[3], 16), int(m[4], 16), int(m[5], 16), m[6], int(m[7], 16), int(m[8], 16))


def parse_subnet_lst(text: str) -> list[LstLink]:
    """The links of an ``opensm-subnet.lst``; ValueError (with the line number) on a line
    that is not one."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        ends = list(_END.finditer(line))
        link = _LINK.search(line)
        if len(ends) != 2 or link is None:
            raise ValueError(f"line {i}: not an opensm-subnet.lst link: {line[:120]!r}")
        out.append(LstLink(_lst_end(ends[0]), _lst_end(ends[1]), link[1], link[2], link[3]))
    return out


@dataclass
class SwitchLft:
    guid: int
    lid: int
    desc: str
    top: int
    ports: dict[int, int]  # LID -> egress port (0: the switch itself)


_LFT_HEAD = re.compile(r"^Unicast lids \[0-(\d+)\] of switch Lid (\d+) guid 0x([0-9a-f]+) \('(.*)'\):$")
_LFT_ROW = re.compile(r"^0x([0-9a-f]{4}) (\d{3}) # ")
_LFT_END = re.compile(r"^(\d+) lids dumped$")


def parse_lfts(text: str) -> dict[int, SwitchLft]:
    """Switch GUID -> its table, from an ``opensm-lfts.dump``; ValueError on a stray line."""
    out: dict[int, SwitchLft] = {}
    cur: SwitchLft | None = None
    for i, line in enumerate(text.splitlines(), 1):
        if m := _LFT_HEAD.match(line):
            cur = SwitchLft(int(m[3], 16), int(m[2]), m[4], int(m[1]), {})
            out[cur.guid] = cur
        elif (m := _LFT_ROW.match(line)) and cur is not None:
            cur.ports[int(m[1], 16)] = int(m[2])
        elif (m := _LFT_END.match(line)) and cur is not None:
            cur = None
        elif line.strip():
            raise ValueError(f"line {i}: not an opensm-lfts.dump line: {line[:120]!r}")
    return out


def parse_guid2lid(text: str) -> dict[int, int]:
    """Port GUID -> base LID from a ``guid2lid`` file; ValueError on a stray line."""
    out = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 3:
                raise ValueError
            out[int(parts[0], 16)] = int(parts[1], 16)
        except ValueError:
            raise ValueError(f"line {i}: not a guid2lid line: {line[:120]!r}") from None
    return out
