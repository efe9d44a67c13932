"""ibemu's SM programs partitions into real device agents in memory: P_KeyTables of CA ports
and of the switch ports facing them, the enforcement bits, and the switches then keep
partitions apart (inbound and outbound, with full and limited members)."""

from __future__ import annotations

import pytest

from ibemu.agents.forwarder import Reason
from ibemu.agents.switch import SwitchAgent
from ibemu.sm.manager import SmConfig, SubnetManager
from ibemu.sm.partitions import Partition, SmPartitions, blocks
from ibemu.testing.madport import InMemoryPort
from ibemu.topo import generate
from ibemu.wire import fast
from tests.unit.sm.helpers import fabric_from_topology, minhop, run


def _setup(parts_of: object) -> tuple[object, object, SubnetManager]:
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=2)
    fab = fabric_from_topology(topo)
    g = {n.name: n.guid for n in topo.cas()}
    parts = parts_of(g)  # type: ignore[operator]
    sm = SubnetManager(InMemoryPort(fab, "h0"), SmConfig(partitions=SmPartitions.from_json(parts.to_json())),
                       route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")

    run(main)
    return topo, fab, sm


def _facing(topo: object, fab: object, host: str) -> tuple[SwitchAgent, int]:
    link = topo.link_at(host, 1)  # type: ignore[attr-defined]
    far = link.b if link.a.node == host else link.a
    agent = fab.agents[far.node]  # type: ignore[attr-defined]
    assert isinstance(agent, SwitchAgent)
    return agent, far.port


def _pkt(fab: object, src: str, dst: str, pkey: int) -> bytes:
    a, b = fab.agents[src], fab.agents[dst]  # type: ignore[attr-defined]
    return fast.NativeTemplate(slid=a.lid(1), dlid=b.lid(1), destqp=0x10, pkey=pkey).packet(0x04, 1, b"p" * 8)


def _deliver(topo: object, fab: object, src: str, dst: str, pkey: int) -> Reason | None:
    """Walk a data packet from ``src`` to ``dst`` through the switches' forwarders."""
    pkt = _pkt(fab, src, dst, pkey)
    sw, port = _facing(topo, fab, src)
    for _ in range(8):
        v = sw.forwarder.decide(pkt, port)
        if not v.port:
            return v.reason
        link = topo.link_at(sw_name(fab, sw), v.port)  # type: ignore[attr-defined]
        far = link.b if (link.a.node, link.a.port) == (sw_name(fab, sw), v.port) else link.a
        if far.node == dst:
            return None
        sw, port = fab.agents[far.node], far.port  # type: ignore[attr-defined]
    raise AssertionError("loop")


def sw_name(fab: object, sw: SwitchAgent) -> str:
    return next(n for n, a in fab.agents.items() if a is sw)  # type: ignore[attr-defined]


def test_sm_programs_tables_and_enforcement_and_switches_keep_partitions_apart() -> None:
    def parts(g: dict[str, int]) -> SmPartitions:
        return SmPartitions((
            Partition("a", 0x0001, ((g["h0"], True), (g["h2"], True), (g["h3"], False))),
            Partition("b", 0x0002, ((g["h1"], True), (g["h3"], True)), enforce="in"),
        ))
    topo, fab, sm = _setup(parts)
    assert sm.stats["partition_failed"] == 0 and sm.stats["partition_tables"] > 0
    agents = fab.agents  # type: ignore[attr-defined]
    assert agents["h0"].pkeys(1)[:3] == [0xFFFF, 0x8001, 0]
    assert agents["h3"].pkeys(1)[:4] == [0xFFFF, 0x0001, 0x8002, 0]
    for host, bits in (("h0", 12), ("h1", 8), ("h2", 12), ("h3", 12)):
        sw, port = _facing(topo, fab, host)
        assert sw.pkeys(port)[:3] == agents[host].pkeys(1)[:3], host
        assert sw.ports[port].partition_flags == bits, host
    spine = agents["spine0"]
    assert all(spine.ports[n].partition_flags == 0 for n in spine.ports)  # between switches: none
    # members reach each other; a limited member reaches a full one only
    assert _deliver(topo, fab, "h0", "h2", 0x8001) is None
    assert _deliver(topo, fab, "h3", "h0", 0x0001) is None
    assert _deliver(topo, fab, "h1", "h3", 0x8002) is None
    assert _deliver(topo, fab, "h0", "h2", 0xFFFF) is None  # the default partition
    # cross-partition: dropped at the sender's switch port (inbound) or the receiver's (outbound)
    assert _deliver(topo, fab, "h0", "h1", 0x8002) is Reason.PKEY_INBOUND
    assert _deliver(topo, fab, "h0", "h3", 0x8003) is Reason.PKEY_INBOUND
    assert _deliver(topo, fab, "h3", "h0", 0x8001) is Reason.PKEY_INBOUND  # h3 is a limited member of a
    sw0, p0 = _facing(topo, fab, "h0")
    sw3, p3 = _facing(topo, fab, "h3")
    assert sw0.ports[p0].counters.port_rcv_constraint_errors == 2
    assert sw3.ports[p3].counters.port_rcv_constraint_errors == 1
    # h1's port enforces inbound only (b's mode is "in"): a's key from h2 leaves towards h1
    # (h1's own HCA would refuse it)
    assert _deliver(topo, fab, "h2", "h1", 0x8001) is None
    # outbound: h2's port rejects b's key leaving towards h2 (h2 is not in b, mode both)
    assert _deliver(topo, fab, "h3", "h2", 0x8002) is Reason.PKEY_OUTBOUND
    sw2, p2 = _facing(topo, fab, "h2")
    assert sw2.ports[p2].counters.port_xmit_constraint_errors == 1


def test_a_second_pass_writes_nothing_and_changes_are_written() -> None:
    def parts(g: dict[str, int]) -> SmPartitions:
        return SmPartitions((Partition("all", 0x0005, everyone=True, everyone_full=False, enforce="out"),))
    topo, fab, sm = _setup(parts)
    agents = fab.agents  # type: ignore[attr-defined]
    assert agents["h1"].pkeys(1)[:2] == [0xFFFF, 0x0005]
    sw, port = _facing(topo, fab, "h1")
    assert sw.ports[port].partition_flags == 4
    written = dict(sm._pkeys_written)

    async def again() -> None:
        async with sm.running():
            await sm._program_partitions()

    tables = sm.stats["partition_tables"]
    run(again)
    assert sm.stats["partition_tables"] == tables and sm._pkeys_written == written


def test_partition_checks() -> None:
    with pytest.raises(ValueError, match=r"0x0001\.\.0x7fff"):
        Partition("x", 0x8001)
    with pytest.raises(ValueError, match="enforce"):
        Partition("x", 1, enforce="sometimes")
    many = SmPartitions(tuple(Partition(f"p{i}", i + 1, ((7, True),)) for i in range(32)))
    with pytest.raises(ValueError, match="32 P_Keys"):
        many.table(7)
    assert [len(b) for b in blocks([0xFFFF, 1], 32)] == [64]
    assert SmPartitions().enforcement(1) == 0
