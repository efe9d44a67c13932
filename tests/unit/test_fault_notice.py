"""Fault notices between switches (``ibemu.agents.switch``: ATTR_FAILOVER_CONFIG and
ATTR_FAULT_NOTICE) on an in-memory k=4 fat-tree routed by ``ftree_ar``: a cut cable's far
side announces what it lost, upstream switches move those LIDs to alternates, and every
host reaches every other again with the SM silent."""

from __future__ import annotations

import struct

import pytest

from ibemu.agents.actions import Action, Send
from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import ATTR_FAULT_NOTICE, SwitchAgent
from ibemu.sm.program import alt_blocks, failover_config, lft_blocks
from ibemu.sm.routing.alternates import compute_ar
from ibemu.testing.fromtopo import graph_of
from ibemu.testing.wiring import InMemoryFabric
from ibemu.topo.generators import generate
from ibemu.wire.madpacket import MAD_OFFSET

ATTR_FAILOVER_CONFIG = 0xFF31


def build(notices: bool = True) -> tuple[InMemoryFabric, dict[str, int], dict[str, str]]:
    topo = generate("fat-tree", k=4)
    graph = graph_of(topo)
    ar = compute_ar(graph, "ftree_ar")
    fab = InMemoryFabric(record_wire=False)
    by_guid = {nd.guid: nd for nd in topo.nodes.values()}
    top = max(p.lid for nd in graph.nodes.values() for p in nd.ports.values() if p.lid)
    for node in topo.nodes.values():
        if node.is_switch:
            sw = SwitchAgent(node_guid=node.guid, num_ports=node.num_ports, clock=fab.clock)
            sw.lft.set_top(top)
            for b, data in lft_blocks(ar.primary.lfts[node.guid], top).items():
                sw.lft.set_block(b, data)
            for b, data in alt_blocks(ar.alternates.get(node.guid, {}), top).items():
                sw.alternates[b] = data
            cfg = failover_config(graph, node.guid, notices=notices)
            sw.notices = bool(cfg[0] & 1)
            mask = int.from_bytes(cfg[32:], "little")
            sw.switch_ports = frozenset(p for p in range(1, 256) if mask >> p & 1)
            fab.add(node.name, sw)
        else:
            fab.add(node.name, CaAgent(node_guid=node.guid, num_ports=node.num_ports, clock=fab.clock))
    for link in topo.links:
        fab.connect(link.a.node, link.a.port, link.b.node, link.b.port)
    lids = {by_guid[g].name: nd.ports[min(p for p in nd.ports if p)].lid
            for g, nd in graph.nodes.items() if not nd.is_switch}
    edge_of: dict[str, str] = {}
    for link in topo.links:
        for a, b in ((link.a, link.b), (link.b, link.a)):
            if not topo.nodes[a.node].is_switch and topo.nodes[b.node].is_switch:
                edge_of[a.node] = b.node
    return fab, lids, edge_of


def walk(fab: InMemoryFabric, start: str, lid: int) -> str | None:
    """The host a frame for ``lid`` reaches from switch ``start``, as the kernel forwards:
    the LFT's port if up, else the first alternate up (None: dropped or looping)."""
    name = start
    for _ in range(16):
        agent = fab.agents[name]
        if not isinstance(agent, SwitchAgent):
            return name
        ports = [agent.lft.raw(lid), *agent.alternates_of(lid)]
        up = [p for p in ports if p in agent.ports and agent.ports[p].link_is_up]
        if not up:
            return None
        peer = fab.peer(name, up[0])
        if peer is None:
            return None
        name = peer[0]
    return None


def unreachable(fab: InMemoryFabric, lids: dict[str, int], edge_of: dict[str, str]) -> list[tuple[str, str]]:
    return [(src, dst) for src in lids for dst, lid in lids.items()
            if src != dst and walk(fab, edge_of[src], lid) != dst]


def cut_edge_uplink(fab: InMemoryFabric, edge_of: dict[str, str], host: str) -> tuple[str, str]:
    edge = edge_of[host]
    agent = fab.agents[edge]
    for port in sorted(agent.ports):
        peer = fab.peer(edge, port) if port else None
        if peer is not None and isinstance(fab.agents[peer[0]], SwitchAgent):
            fab.link_down(edge, port)
            return edge, peer[0]
    raise AssertionError("no uplink")


def test_all_pairs_reach_each_other_after_a_cut_with_notices() -> None:
    fab, lids, edge_of = build()
    assert unreachable(fab, lids, edge_of) == []
    host = sorted(lids)[0]
    _edge, agg = cut_edge_uplink(fab, edge_of, host)
    assert unreachable(fab, lids, edge_of) == []
    sent = fab.events_of("fault_notice_sent")
    assert sent and all(e.fields["lids"] >= 1 for e in sent)
    moved = [e for e in fab.events_of("local_failover") if e.fields.get("via") == "notice"]
    assert moved, "no switch moved LIDs on a notice"
    assert fab.agents[agg].stats["notices_sent"] >= 1


def test_without_notices_the_far_side_blackholes() -> None:
    fab, lids, edge_of = build(notices=False)
    host = sorted(lids)[0]
    cut_edge_uplink(fab, edge_of, host)
    broken = unreachable(fab, lids, edge_of)
    assert broken and all(dst in {h for h, e in edge_of.items() if e == edge_of[host]} for _s, dst in broken)
    assert not fab.events_of("fault_notice_sent")


def test_a_second_cut_still_converges_and_each_lid_is_announced_once() -> None:
    fab, lids, edge_of = build()
    hosts = sorted(lids)
    cut_edge_uplink(fab, edge_of, hosts[0])
    first = sum(a.stats["notices_sent"] for a in fab.agents.values() if isinstance(a, SwitchAgent))
    cut_edge_uplink(fab, edge_of, hosts[-1])
    assert unreachable(fab, lids, edge_of) == []
    again = sum(a.stats["notices_sent"] for a in fab.agents.values() if isinstance(a, SwitchAgent))
    assert again > first


def _notice(hop_count: int, lids: list[int]) -> bytes:
    from ibemu.wire.madcodec import dr_smp
    bitmap = bytearray(64)
    for lid in lids:
        bitmap[(lid % 512) >> 3] |= 1 << (lid & 7)
    mad = bytearray(dr_smp(0x02, ATTR_FAULT_NOTICE, path=[1] * hop_count, modifier=0, data=bytes(bitmap)))
    mad[3] = 0x05  # Trap
    return bytes(mad)


@pytest.mark.parametrize("hops", [1, 2])
def test_notices_from_far_away_or_non_switch_ports_are_counted_and_ignored(hops: int) -> None:
    fab, lids, edge_of = build()
    host = sorted(lids)[0]
    edge = edge_of[host]
    sw = fab.agents[edge]
    assert isinstance(sw, SwitchAgent)
    before = {lid: sw.lft.raw(lid) for lid in lids.values()}
    # from the host's port (not facing a switch), one hop; or a 2-hop route (not a neighbour)
    fab.send_mad(host, 1, 0xFFFF, 0, 0, _notice(hops, list(lids.values())))
    assert {lid: sw.lft.raw(lid) for lid in lids.values()} == before
    key = "notice_ignored" if hops == 1 else "notice_not_neighbour"
    if hops == 1:
        assert sw.stats[key] == 1
    else:  # relayed by the edge to its port 1: whoever is there counts it
        assert sum(a.stats["notice_not_neighbour"] for a in fab.agents.values()
                   if isinstance(a, SwitchAgent)) + sum(a.stats["smp_unsolicited_dropped"]
                                                        for a in fab.agents.values()) >= 1


def test_failover_config_get_set_and_bad_ports() -> None:
    from ibemu.testing.wiring import InMemoryFabric as Fab
    from ibemu.wire.madcodec import dr_smp
    fab = Fab()
    fab.add("sm", CaAgent(node_guid=0x10, clock=fab.clock))
    sw = fab.add("sw", SwitchAgent(node_guid=0x20, num_ports=4, clock=fab.clock))
    fab.connect("sm", 1, "sw", 1)
    data = bytearray(64)
    data[0] = 1
    data[32:] = ((1 << 2) | (1 << 3)).to_bytes(32, "little")
    got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, dr_smp(0x02, ATTR_FAILOVER_CONFIG, path=[1], data=bytes(data)))
    assert got and struct.unpack_from("!H", got[-1].mad, 4)[0] & 0x7FFF == 0
    assert isinstance(sw, SwitchAgent) and sw.notices and sw.switch_ports == {2, 3}
    data[32:] = (1 << 9).to_bytes(32, "little")  # port 9 of a 4-port switch
    got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, dr_smp(0x02, ATTR_FAILOVER_CONFIG, path=[1], data=bytes(data)))
    assert struct.unpack_from("!H", got[-1].mad, 4)[0] & 0x7FFF == 0x001C
    assert sw.switch_ports == {2, 3}


def _new_generation(fab: InMemoryFabric, generation: int) -> None:
    """What the SM's FailoverConfig Set of a new pass does on every switch."""
    for name, agent in fab.agents.items():
        if isinstance(agent, SwitchAgent):
            cfg = bytearray(64)
            cfg[0] = 1
            struct.pack_into("!I", cfg, 4, generation)
            cfg[32:] = sum(1 << p for p in agent.switch_ports).to_bytes(32, "little")
            assert agent._attr_failover_config(0x02, 0, cfg, 0, 1) == 0
            fab.handle(name, agent._pending_actions)
            agent._pending_actions = []


def test_a_new_generation_ends_the_repairs_and_reports_them() -> None:
    fab, lids, edge_of = build()
    hosts = sorted(lids)
    edge, agg = cut_edge_uplink(fab, edge_of, hosts[0])
    repaired = {n for n, a in fab.agents.items() if isinstance(a, SwitchAgent) and a._repaired}
    assert repaired  # some switches moved entries on notices
    tables = {n: bytes(fab.agents[n].lft.get_block(0)) for n in repaired}
    _new_generation(fab, 1)
    for name, agent in fab.agents.items():
        if isinstance(agent, SwitchAgent):
            cfg = bytearray(64)
            assert agent._attr_failover_config(0x01, 0, cfg, 0, 1) == 0
            ended = struct.unpack_from("!I", cfg, 8)[0]
            assert (ended > 0) == (name in repaired)  # what the SM reads to rewrite their tables
            assert not agent._repaired and not agent._dead_ends and not agent._announced
    assert {n: bytes(fab.agents[n].lft.get_block(0)) for n in repaired} == tables  # left for the SM
    assert len(fab.events_of("repairs_ended")) == len(repaired)
    port = next(p for p in fab.agents[edge].ports if p and fab.peer(edge, p) and fab.peer(edge, p)[0] == agg)
    fab.link_up(edge, port)
    cut_edge_uplink(fab, edge_of, hosts[-1])  # a second fault after the repairs ended
    assert unreachable(fab, lids, edge_of) == []


def test_a_notice_from_a_switch_the_sm_did_not_list_is_counted_and_ignored() -> None:
    """Every switch that would hear the aggregation switch's notice has that port struck off
    its FailoverConfig (a neighbour unknown to the SM, e.g. cabled since): each counts the
    notice as ignored and keeps its LFT; the pod's other hosts stay cut off from the far side."""
    fab, lids, edge_of = build()
    host = sorted(lids)[0]
    edge = edge_of[host]
    agg = next(p[0] for n in sorted(fab.agents[edge].ports) if n and (p := fab.peer(edge, n)) is not None
               and isinstance(fab.agents[p[0]], SwitchAgent))
    listeners = {}
    for n in sorted(fab.agents[agg].ports):
        p = fab.peer(agg, n) if n else None
        if p is not None and p[0] != edge and isinstance(fab.agents[p[0]], SwitchAgent):
            sw = fab.agents[p[0]]
            assert isinstance(sw, SwitchAgent)
            sw.switch_ports = sw.switch_ports - {p[1]}
            listeners[p[0]] = {lid: sw.lft.raw(lid) for lid in lids.values()}
    assert listeners
    cut_edge_uplink(fab, edge_of, host)
    assert fab.agents[agg].stats["notices_sent"] >= 1
    for name, before in listeners.items():
        sw = fab.agents[name]
        assert isinstance(sw, SwitchAgent)
        assert sw.stats["notice_ignored"] >= 1, name
        assert {lid: sw.lft.raw(lid) for lid in lids.values()} == before
    assert unreachable(fab, lids, edge_of)  # nobody upstream moved: the far side blackholes


def _notices(actions: list[Action]) -> list[tuple[int, bytes]]:
    return sorted((a.port, bytes(a.packet[MAD_OFFSET + 64:MAD_OFFSET + 128])) for a in actions
                  if isinstance(a, Send) and struct.unpack_from("!H", a.packet, MAD_OFFSET + 16)[0] == ATTR_FAULT_NOTICE)


def test_notices_at_loss_of_signal_are_link_downs_and_not_sent_twice() -> None:
    """``announce_port_lost`` (the agent host's carrier thread, at the cut, before the agent
    has taken the port down) sends what ``link_down`` would, and ``link_down`` after it sends
    nothing more, for every switch port of the tree."""
    fab_a, _lids, _edge_of = build()
    fab_b, _lids, _edge_of = build()
    checked = 0
    for name, a in fab_a.agents.items():
        if not isinstance(a, SwitchAgent):
            continue
        b = fab_b.agents[name]
        assert isinstance(b, SwitchAgent)
        for port in sorted(p for p in a.ports if p):
            early = a.announce_port_lost(port)
            assert _notices(early) == _notices(b.link_down(port))
            assert _notices(a.link_down(port)) == []
            checked += bool(_notices(early))
    assert checked >= 8, "the tree must have ports whose loss is announced"
