"""ibemu's SM with an M_Key: it keys every port at bring-up, uses the key in every SMP, and
logs the trap 256 a rogue SMP without the key causes (no sweep follows)."""

from __future__ import annotations

import struct

import trio

from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.sm import activate
from ibemu.sm.manager import SmConfig, SubnetManager
from ibemu.testing.madport import InMemoryPort
from ibemu.wire import madcodec as mb
from tests.unit.sm.helpers import fat_tree, minhop, run, unreachable_pairs
from tests.unit.sm.test_manager import link_ports_active, settle

KEY = 0xC0FFEE0012345678


def keyed_ports(fab: object) -> list[tuple[int, int, int]]:
    """(M_Key, protect, lease) of every port that holds one."""
    out = []
    for a in fab.agents.values():  # type: ignore[attr-defined]
        ports = [a.ports[0]] if isinstance(a, SwitchAgent) else list(a.ports.values())
        out += [(p.m_key, p.m_key_protect, p.m_key_lease_period) for p in ports]
    return out


def test_bring_up_keys_every_port_and_a_rogue_smp_is_trapped() -> None:
    _topo, fab = fat_tree(4)
    port = InMemoryPort(fab, "h0")
    sm = SubnetManager(port, SmConfig(m_key=KEY, m_key_protect=2, m_key_lease_s=60), route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
            assert set(keyed_ports(fab)) == {(KEY, 2, 60)} and len(keyed_ports(fab)) == 36
            assert link_ports_active(fab) and not unreachable_pairs(fab)
            assert sm.transport.stats["timeouts"] == 0
            # a second sweep reads everything back with the key and changes nothing
            sets = sm.transport.stats["sent"]
            await sm.full_sweep("heavy")
            assert sm.events.counts["reroute"] == 0
            assert sm.transport.stats["timeouts"] == 0 and sm.transport.stats["sent"] > sets
            # a rogue SM on another host: an LFT Set to a switch without the key
            rogue = fab.agents["h15"]
            assert isinstance(rogue, CaAgent)
            sw = next(n for n in sm.graph.nodes.values() if n.is_switch)
            agent = next(a for a in fab.agents.values() if a.node_guid == sw.guid)
            assert isinstance(agent, SwitchAgent)
            before = agent.lft.get_block(0)
            got = fab.send_mad("h15", 1, sw.ports[0].lid, 0, 0,
                               mb.lr_smp(mb.SET, 0x19, modifier=0, tid=9, data=bytes(64), m_key=1))
            assert [d for d in got if mb.tid(d.mad) == 9] == []  # no answer
            assert agent.lft.get_block(0) == before and agent.ports[0].m_key_violations == 1
            await settle(port)
            (ev,) = sm.events.of("mkey_violation")
            assert ev["issuer_lid"] == sw.ports[0].lid and ev["lidaddr"] == rogue.ports[1].lid
            assert ev["method"] == mb.SET and ev["attr"] == 0x19 and ev["m_key"] == "0x1"
            assert not sm._dirty and sm.stats["mkey_violations"] == 1
            for _ in range(3):
                await settle(port)
                await trio.sleep(0.01)
            assert not agent.traps  # the SM's TrapRepress carried the key,
            assert not agent.ports[0].m_key_lease_deadline  # and stopped the lease the violation started
            # with the key, the same Set works
            got = fab.send_mad("h15", 1, sw.ports[0].lid, 0, 0,
                               mb.lr_smp(mb.GET, 0x19, modifier=0, tid=10, m_key=KEY))
            assert [mb.smp_data(d.mad) for d in got if mb.tid(d.mad) == 10] == [before]

    run(main)


def test_keys_already_held_are_not_written_again() -> None:
    keys = activate.MKeys(KEY, 1, 5)
    pi = bytearray(64)
    struct.pack_into("!Q", pi, 0, KEY)
    struct.pack_into("!H", pi, 26, 5)
    pi[34] = 1 << 6
    assert keys.held_by(bytes(pi))
    pi[34] = 2 << 6
    assert not keys.held_by(bytes(pi))
