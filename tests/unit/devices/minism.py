"""A tiny subnet manager over an InMemoryFabric: discover by DR, assign LIDs, route, activate.

Test helper only (the real SM lives in ibemu.sm): enough SM behaviour to program the
agents the way OpenSM does, through SMPs only, so tests can check LID-routed traffic,
traps and PMA afterwards.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ibemu.agents.actions import DeliverMad
from ibemu.testing.wiring import InMemoryFabric
from ibemu.wire import madcodec as mb

NODE_INFO, NODE_DESC, SWITCH_INFO, PORT_INFO, LFT = 0x11, 0x10, 0x12, 0x15, 0x19


@dataclass
class Node:
    guid: int
    node_type: int
    num_ports: int
    path: list[int]  # DR path from the SM port
    description: str = ""
    lid: int = 0
    links: dict[int, tuple[int, int]] = field(default_factory=dict)  # port -> (guid, port)
    in_port: int = 0  # port through which the SM reaches it


class MiniSm:
    def __init__(self, fab: InMemoryFabric, ca: str, port: int = 1) -> None:
        self.fab, self.ca, self.port = fab, ca, port
        self.tid = 0x1000
        self.nodes: dict[int, Node] = {}
        self.sm_lid = 1

    def query(self, path: list[int], attr: int, *, mod: int = 0, method: int = mb.GET,
              data: bytes = b"") -> DeliverMad:
        self.tid += 1
        got = self.fab.send_mad(self.ca, self.port, 0xFFFF, 0, 0,
                                mb.dr_smp(method, attr, path=path, modifier=mod, tid=self.tid, data=data))
        responses = [d for d in got if mb.tid(d.mad) == self.tid]
        assert len(responses) == 1, f"path {path} attr {attr:#x}: {len(responses)} responses"
        return responses[0]

    def ok(self, path: list[int], attr: int, **kw: object) -> bytes:
        d = self.query(path, attr, **kw)  # type: ignore[arg-type]
        assert d.status == 0 and mb.status(d.mad) == 0, f"status {mb.status(d.mad):#x}"
        return mb.smp_data(d.mad)

    def discover(self) -> dict[int, Node]:
        queue: deque[list[int]] = deque([[]])
        while queue:
            path = queue.popleft()
            ni = mb.parse_node_info(self.ok(path, NODE_INFO))
            if ni.node_guid in self.nodes:
                continue
            desc = self.ok(path, NODE_DESC).split(b"\0", 1)[0].decode()
            node = Node(ni.node_guid, ni.node_type, ni.num_ports, path, desc, in_port=ni.local_port_num)
            self.nodes[ni.node_guid] = node
            ports = range(1, ni.num_ports + 1) if ni.node_type == 2 else [ni.local_port_num]
            for p in ports:
                pi = mb.parse_port_info(self.ok(path, PORT_INFO, mod=p))
                if pi.phys_state != 5:
                    continue
                if ni.node_type != 2 and path:  # a CA reached from outside: do not walk through it
                    continue
                queue.append([*path, p] if ni.node_type == 2 or not path else [p])
        # links: ask each node's neighbours who they are
        for node in self.nodes.values():
            ports = range(1, node.num_ports + 1) if node.node_type == 2 else [node.in_port or self.port]
            for p in ports:
                if node.node_type != 2 and node.path:
                    p = node.in_port
                pi = mb.parse_port_info(self.ok(node.path, PORT_INFO, mod=p))
                if pi.phys_state != 5:
                    continue
                far_path = [*node.path, p] if node.node_type == 2 or not node.path else None
                if far_path is None:
                    continue
                far = mb.parse_node_info(self.ok(far_path, NODE_INFO))
                node.links[p] = (far.node_guid, far.local_port_num)
                self.nodes[far.node_guid].links[far.local_port_num] = (node.guid, p)
        return self.nodes

    def assign_lids(self) -> None:
        me = next(n for n in self.nodes.values() if n.path == [])
        order = [me, *sorted((n for n in self.nodes.values() if n is not me), key=lambda n: n.guid)]
        for lid, node in enumerate(order, start=self.sm_lid):
            node.lid = lid
            port = 0 if node.node_type == 2 else node.in_port or self.port
            pi = self.ok(node.path, PORT_INFO, mod=port)
            self.ok(node.path, PORT_INFO, mod=port, method=mb.SET,
                    data=mb.port_info_set(pi, lid=lid, sm_lid=self.sm_lid))

    def route(self) -> None:
        """Shortest-path LFTs (BFS from every destination), one LFT block, then the top."""
        top = max(n.lid for n in self.nodes.values())
        for sw in (n for n in self.nodes.values() if n.node_type == 2):
            block = bytearray(b"\xff" * 64)
            for dest in self.nodes.values():
                block[dest.lid] = 0 if dest is sw else self._next_hop(sw, dest)
            self.ok(sw.path, LFT, mod=0, method=mb.SET, data=bytes(block))
            si = self.ok(sw.path, SWITCH_INFO)
            self.ok(sw.path, SWITCH_INFO, method=mb.SET,
                    data=mb.switch_info_set(si, linear_fdb_top=top, clear_port_state_change=True))

    def _next_hop(self, sw: Node, dest: Node) -> int:
        seen = {sw.guid}
        queue: deque[tuple[int, int]] = deque((g, p) for p, (g, _q) in sorted(sw.links.items()))
        for g, _p in queue:
            seen.add(g)
        while queue:
            guid, first = queue.popleft()
            if guid == dest.guid:
                return first
            node = self.nodes[guid]
            if node.node_type != 2:
                continue
            for _p, (g, _q) in sorted(node.links.items()):
                if g not in seen:
                    seen.add(g)
                    queue.append((g, first))
        return 0xFF

    def set_state(self, state: int) -> None:
        for node in self.nodes.values():
            ports = [p for p in node.links] if node.node_type == 2 else [node.in_port or self.port]
            for p in ports:
                pi = self.ok(node.path, PORT_INFO, mod=p)
                self.ok(node.path, PORT_INFO, mod=p, method=mb.SET,
                        data=mb.port_info_set(pi, port_state=state))

    def bring_up(self) -> dict[int, Node]:
        self.discover()
        self.assign_lids()
        self.route()
        self.set_state(3)
        self.set_state(4)
        return self.nodes
