"""The fabric manager's decisions without a kernel: link messages in, route writes and events out."""

from __future__ import annotations

import struct
from typing import Any

from ibemu.events import EventLog
from ibemu.kernel.linkevents import IFF_RUNNING, IFF_UP, RTM_NEWLINK
from ibemu.roce.addressing import plan_addresses
from ibemu.roce.fabric_manager import FabricManager, PortState, link_states
from ibemu.roce.routes import NextHops, routers
from ibemu.topo import generate


class FakeWriter:
    def __init__(self) -> None:
        self.put: dict[str, NextHops] = {}
        self.deleted: list[str] = []
        self.neigh: list[tuple[str, str, bytes]] = []

    def apply(self, put: dict[str, NextHops], delete: Any = ()) -> int:
        self.put.update(put)
        self.deleted.extend(delete)
        return len(put) + len(list(delete))

    def neighbours(self, entries: Any) -> int:
        self.neigh.extend(entries)
        return len(self.neigh)


def manager() -> tuple[FabricManager, dict[str, FakeWriter]]:
    topo = generate("fat-tree", k=4)
    addrs = plan_addresses(topo)
    manifest = {"routers": {r: f"ns-{r}" for r in routers(topo)}, "addresses": addrs.to_dict(),
                "peer_macs": {r: {p.ifname: f"02aabbccdd{p.port:02x}" for p in addrs.node_ports(r)}
                              for r in routers(topo)}}
    fm = FabricManager(manifest, EventLog())
    writers = {r: FakeWriter() for r in fm.router_ns}
    fm.writers = writers  # type: ignore[assignment]
    for r in fm.router_ns:  # ifindex = port number
        fm.ports[r] = {p.port: PortState(p, bytes.fromhex(manifest["peer_macs"][r][p.ifname]))
                       for p in addrs.node_ports(r)}
    return fm, writers


def link_msg(index: int, flags: int) -> bytes:
    body = struct.pack("=BxHiII", 0, 1, index, flags, 0xFFFFFFFF)
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK, 0, 0, 0) + body


def test_link_messages_parse() -> None:
    data = link_msg(3, IFF_UP | IFF_RUNNING) + link_msg(4, IFF_UP) + b"\x01\x02"
    assert list(link_states(data)) == [(3, True, True), (4, True, False)]
    assert list(link_states(b"")) == [] and list(link_states(b"\xff" * 15)) == []


def test_bring_up_then_reroute_a_cut_and_its_return() -> None:
    fm, writers = manager()
    fm.bring_up()
    assert sum(len(w.put) for w in writers.values()) == 304
    assert fm.events.of("fabric_up")[0]["routes"] == 304
    for w in writers.values():
        w.put.clear()
    # agg3_0's port 3 (to core0) loses carrier: running goes, admin stays up
    fm.on_link_events("agg3_0", [(3, True, False)], 1000)
    (rr,) = fm.events.of("reroute")
    assert rr["reason"] == "link_down" and rr["t_detect"] == 1000 and rr["t_trap"] is None
    assert rr["t_detect"] <= rr["t_routed"] <= rr["t_programmed"]
    # agg3_0 keeps core1 upwards (12 routes); core0 has no other way down to pod 3 (4 routes)
    assert rr["local_covered"] == 12 and rr["local_blackholed"] == 4
    assert {r for r, w in writers.items() if w.put} == {"core0", "agg0_0", "agg1_0", "agg2_0", "agg3_0"}
    assert fm.events.of("carrier")[0]["up"] is False
    # the far end's own report of the same cable changes nothing
    fm.on_link_events("core0", [(4, True, False)], 1100)
    assert len(fm.events.of("reroute")) == 1
    # back: the neighbour is restored before the routes come back
    fm.on_link_events("agg3_0", [(3, True, True)], 2000)
    fm.on_link_events("core0", [(4, True, True)], 2001)
    assert writers["agg3_0"].neigh and writers["agg3_0"].neigh[0][0] == "agg3_0-3"
    up = fm.events.of("reroute")[-1]
    assert up["reason"] == "link_up" and fm.down == set()


def test_observing_manager_writes_nothing() -> None:
    fm, writers = manager()
    fm.reroute_enabled = False
    fm.bring_up()
    for w in writers.values():
        w.put.clear()
    fm.on_link_events("core0", [(4, False, False)], 5)
    (rr,) = fm.events.of("reroute")
    assert rr["t_programmed"] is None and rr["changes"] > 0 and rr["messages"] == 0
    assert not any(w.put for w in writers.values())
