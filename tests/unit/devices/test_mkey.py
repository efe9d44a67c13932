"""M_Key protection in the switch and CA agents: levels 0-3, violations, trap 256, the lease."""

from __future__ import annotations

import struct

import pytest

from ibemu.agents.actions import DeliverMad, MKeyChange
from ibemu.testing.wiring import InMemoryFabric
from ibemu.wire import madcodec as mb
from ibemu.wire.madattrs import decode_trap256, notice_fields

from .fabrics import chain
from .minism import LFT, NODE_INFO, PORT_INFO, MiniSm

SEC = 1_000_000_000
KEY = 0x1122334455667788
BAD = 0x0BAD0BAD0BAD0BAD
S2 = [1, 3]  # DR path from the SM's port to s2


def secured(protect: int, lease_s: int = 0, *, where: tuple[list[int], int] = (S2, 0)) -> tuple[InMemoryFabric, MiniSm]:
    """chain(3) brought up; then the port at ``where`` (DR path, PortInfo modifier; default:
    s2's port 0) gets KEY, ``protect`` and ``lease_s`` by a PortInfo Set."""
    fab = chain(3)
    sm = MiniSm(fab, "sm")
    sm.bring_up()
    path, mod = where
    pi = sm.ok(path, PORT_INFO, mod=mod)
    got = sm.ok(path, PORT_INFO, mod=mod, method=mb.SET,
                data=mb.port_info_set(pi, m_key=KEY, m_key_protect=protect, m_key_lease_s=lease_s))
    assert struct.unpack_from("!Q", got)[0] == KEY and got[34] >> 6 == protect
    fab.delivered["sm"].clear()
    return fab, sm


def dr(fab: InMemoryFabric, method: int, attr: int, *, key: int, mod: int = 0, data: bytes = b"",
       path: list[int] = S2, tid: int = 0x77) -> list[DeliverMad]:
    """A DR SMP from the SM's port; the responses with its TID."""
    got = fab.send_mad("sm", 1, 0xFFFF, 0, 0, mb.dr_smp(method, attr, path=path, modifier=mod, tid=tid,
                                                         data=data, m_key=key))
    return [d for d in got if mb.tid(d.mad) == tid]


def traps256(fab: InMemoryFabric) -> list[DeliverMad]:
    return [d for d in fab.delivered["sm"] if d.mad[3] == 0x05 and notice_fields(mb.smp_data(d.mad))[1] == 256]


def violations(fab: InMemoryFabric, name: str = "s2", port: int = 0) -> int:
    return fab.agents[name].ports[port].m_key_violations


def test_no_key_changes_nothing() -> None:
    fab = chain(3)
    sm = MiniSm(fab, "sm")
    sm.bring_up()
    for key in (0, BAD):
        (r,) = dr(fab, mb.SET, PORT_INFO, key=key, data=mb.port_info_set(sm.ok(S2, PORT_INFO)))
        assert mb.status(r.mad) == 0
    assert violations(fab) == 0 and not traps256(fab)


def test_level0_gets_are_open_and_show_the_key_sets_need_it() -> None:
    fab, _sm = secured(0)
    (r,) = dr(fab, mb.GET, PORT_INFO, key=BAD)
    assert struct.unpack_from("!Q", mb.smp_data(r.mad))[0] == KEY
    pi = mb.smp_data(r.mad)
    assert dr(fab, mb.SET, PORT_INFO, key=BAD, data=mb.port_info_set(pi, m_key=BAD)) == []
    assert violations(fab) == 1 and fab.agents["s2"].ports[0].m_key == KEY
    (ok,) = dr(fab, mb.SET, PORT_INFO, key=KEY, data=mb.port_info_set(pi, lid=40))
    assert mb.status(ok.mad) == 0 and fab.agents["s2"].ports[0].lid == 40


def test_level1_reads_the_key_back_as_zero() -> None:
    fab, _sm = secured(1)
    (r,) = dr(fab, mb.GET, PORT_INFO, key=BAD)
    data = mb.smp_data(r.mad)
    assert struct.unpack_from("!Q", data)[0] == 0 and data[34] >> 6 == 1  # the protect bits are not secret
    (r,) = dr(fab, mb.GET, PORT_INFO, key=KEY)
    assert struct.unpack_from("!Q", mb.smp_data(r.mad))[0] == KEY
    assert len(dr(fab, mb.GET, NODE_INFO, key=BAD)) == 1
    assert dr(fab, mb.SET, LFT, key=BAD, data=bytes(64)) == []  # a Set with a bad key: dropped
    assert violations(fab) == 1 and fab.agents["s2"].lft.get_block(0) != bytes(64)
    assert fab.agents["s2"].stats["mkey_get_open"] == 2


@pytest.mark.parametrize("protect", [2, 3])
def test_levels_2_and_3_need_the_key_for_gets(protect: int) -> None:
    fab, _sm = secured(protect)
    assert dr(fab, mb.GET, NODE_INFO, key=BAD) == []
    assert dr(fab, mb.GET, PORT_INFO, key=0) == []
    assert violations(fab) == 2
    (r,) = dr(fab, mb.GET, PORT_INFO, key=KEY)
    assert struct.unpack_from("!H", mb.smp_data(r.mad), 44)[0] == 2  # M_KeyViolations


def test_lid_routed_smps_are_checked_too() -> None:
    fab, sm = secured(2)
    lid = next(n.lid for n in sm.nodes.values() if n.description == "s2")
    got = fab.send_mad("sm", 1, lid, 0, 0, mb.lr_smp(mb.GET, NODE_INFO, tid=0x55, m_key=BAD))
    assert [d for d in got if mb.tid(d.mad) == 0x55] == [] and violations(fab) == 1
    got = fab.send_mad("sm", 1, lid, 0, 0, mb.lr_smp(mb.GET, NODE_INFO, tid=0x56, m_key=KEY))
    assert len([d for d in got if mb.tid(d.mad) == 0x56]) == 1


def test_violation_sends_trap_256_to_the_master_sm() -> None:
    fab, sm = secured(2)
    dr(fab, mb.SET, LFT, key=BAD, mod=0, data=bytes(64))
    (trap,) = traps256(fab)
    lid = {n.description: n.lid for n in sm.nodes.values()}
    assert trap.slid == lid["s2"] and trap.dlid == lid["sm"]
    data = mb.smp_data(trap.mad)
    assert data[0] == 0x80 | 2 and int.from_bytes(data[1:4], "big") == 2  # generic, security, switch
    assert notice_fields(data) == (1, 256, lid["s2"])
    d = decode_trap256(data)
    assert (d["method"], d["attr_id"], d["attr_mod"], d["m_key"]) == (mb.SET, LFT, 0, BAD)
    assert d["dr_notice"] == 1 and d["dr_hop_count"] == 2
    assert data[10 + 24 : 10 + 28] == bytes([0, 6, 1, 0])  # ReturnPath[0..2]: s1 in by 6, s2 by 1
    kinds = [e.kind for _n, e in fab.events if e.node_guid == fab.agents["s2"].node_guid]
    assert "mkey_violation" in kinds and "trap_sent" in kinds


def test_trap_repress_needs_the_key() -> None:
    fab, sm = secured(2)
    dr(fab, mb.GET, NODE_INFO, key=BAD)
    (trap,) = traps256(fab)
    lid = next(n.lid for n in sm.nodes.values() if n.description == "s2")
    repress = bytearray(trap.mad)
    repress[3] = 0x07
    struct.pack_into("!Q", repress, 24, BAD)
    fab.send_mad("sm", 1, lid, 0, 0, bytes(repress))
    assert violations(fab) == 2 and len(fab.agents["s2"].traps) == 2  # refused: a trap more
    struct.pack_into("!Q", repress, 24, KEY)
    fab.send_mad("sm", 1, lid, 0, 0, bytes(repress))
    assert len(fab.agents["s2"].traps) == 1  # the first one repressed, the second still pending
    assert fab.agents["s2"].stats["trap_repressed"] == 1


def test_lease_expiry_clears_the_protect_bits_and_keeps_the_key() -> None:
    fab, _sm = secured(2, lease_s=3)
    assert dr(fab, mb.GET, NODE_INFO, key=BAD) == []
    agent = fab.agents["s2"]
    assert agent.next_deadline() is not None
    fab.advance(2 * SEC)
    assert agent.ports[0].m_key_protect == 2
    fab.advance(2 * SEC)
    assert agent.ports[0].m_key_protect == 0 and agent.ports[0].m_key == KEY
    assert [e for _n, e in fab.events if e.kind == "mkey_lease_expired"]
    (r,) = dr(fab, mb.GET, PORT_INFO, key=BAD)  # level 0 now: a new SM can read the key
    assert struct.unpack_from("!Q", mb.smp_data(r.mad))[0] == KEY
    assert dr(fab, mb.SET, LFT, key=BAD, data=bytes(64)) == []  # Sets still need it


def test_a_valid_key_stops_the_lease() -> None:
    fab, _sm = secured(2, lease_s=3)
    dr(fab, mb.GET, NODE_INFO, key=BAD)
    fab.advance(2 * SEC)
    assert len(dr(fab, mb.GET, NODE_INFO, key=KEY)) == 1
    fab.advance(5 * SEC)
    assert fab.agents["s2"].ports[0].m_key_protect == 2
    assert fab.agents["s2"].stats["mkey_lease_stopped"] == 1


def test_ca_port_has_its_own_key() -> None:
    host = [1, 3, 3, 5]  # sm -> s1 -> s2 -> s3 -> h
    fab, _sm = secured(2, where=(host, 1))
    assert dr(fab, mb.GET, PORT_INFO, key=BAD, path=host) == []
    assert violations(fab, "h", 1) == 1 and violations(fab) == 0
    assert len(dr(fab, mb.GET, PORT_INFO, key=BAD)) == 1  # s2 has no key
    assert len(dr(fab, mb.GET, PORT_INFO, key=KEY, path=host)) == 1
    (trap,) = traps256(fab)
    assert int.from_bytes(mb.smp_data(trap.mad)[1:4], "big") == 1  # producer: a CA


def test_violation_asks_for_a_kernel_refresh_and_the_guard_image_follows() -> None:
    fab, _sm = secured(2, lease_s=5)
    agent = fab.agents["s2"]
    assert agent.mkey_guard(0)[:10] == struct.pack("!QBB", KEY, 2, 0)
    actions = agent.receive(6, b"")  # malformed: no key involved
    assert not any(isinstance(a, MKeyChange) for a in actions)
    dr(fab, mb.GET, NODE_INFO, key=BAD)
    assert agent.mkey_guard(0)[:10] == struct.pack("!QBB", KEY, 2, 1)  # lease running: all to the agent
    images = agent.sma_images(attrs=[PORT_INFO], ports=[0, 1])
    assert (0x10015, 0) in images and (0x10015, 1) not in images
