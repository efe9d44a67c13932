"""SMA answers: NodeInfo, NodeDescription, PortInfo, SwitchInfo, P_KeyTable, errors.

Responses are dissected with the scapy layers of ibemu.wire (strict decode, CRCs checked),
so field offsets are checked against an independent description of the layouts.
"""

from __future__ import annotations

import pytest

from ibemu.agents.actions import Send
from ibemu.agents.ca import CaAgent
from ibemu.agents.switch import SwitchAgent
from ibemu.wire import madcodec as mb
from ibemu.wire.decode import decode_native
from ibemu.wire.mad import DirectedRouteSMP, NodeInfo, PKeyTable, PortInfo, SwitchInfo
from ibemu.wire.madpacket import frame_mad

from .fabrics import chain
from .minism import MiniSm

GUID = 0x0002C90000ABCDEF


def ask(agent: SwitchAgent | CaAgent, attr: int, *, method: int = mb.GET, mod: int = 0,
        data: bytes = b"", ingress: int = 2, base_version: int = 1, class_version: int = 1) -> DirectedRouteSMP:
    """One hop DR SMP arriving on ``ingress``; returns the dissected response."""
    mad = bytearray(mb.dr_smp(method, attr, path=[1], modifier=mod, tid=0xABC, data=data))
    mad[0], mad[2] = base_version, class_version
    mad[6] = 1  # as it is on the first link
    acts = agent.receive(ingress, frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15))
    (send,) = [a for a in acts if isinstance(a, Send)]
    assert send.port == ingress
    smp = decode_native(send.packet)[DirectedRouteSMP]
    assert smp.tid == 0xABC and smp.d == 1 and smp.hop_pointer == 1
    assert smp.method == (0x81 if method in (mb.GET, mb.SET) else method | 0x80)
    return smp


@pytest.fixture
def sw() -> SwitchAgent:
    return SwitchAgent(node_guid=GUID, num_ports=36, description="leaf-7 ibemu", link_up=[True] * 36,
                       vendor_id=0x0002C9, device_id=0xCB20)


def test_switch_node_info(sw: SwitchAgent) -> None:
    ni = ask(sw, 0x11, ingress=17)[NodeInfo]
    assert (ni.node_type, ni.num_ports, ni.node_guid, ni.port_guid) == (2, 36, GUID, GUID)
    assert (ni.local_port_num, ni.vendor_id, ni.device_id, ni.base_version) == (17, 0x0002C9, 0xCB20, 1)
    assert ni.system_image_guid == GUID and ni.partition_cap == 32


def test_ca_node_info_port_guid_is_node_guid_plus_port() -> None:
    ca = CaAgent(node_guid=GUID, num_ports=2, link_up=[True, True])
    ni = ask(ca, 0x11, ingress=2)[NodeInfo]
    assert (ni.node_type, ni.num_ports, ni.port_guid, ni.local_port_num) == (1, 2, GUID + 2, 2)


def test_node_description(sw: SwitchAgent) -> None:
    smp = ask(sw, 0x10)
    assert bytes(smp.data)[:12] == b"leaf-7 ibemu" and bytes(smp.data)[12:] == bytes(52)


def test_switch_info_get_and_set(sw: SwitchAgent) -> None:
    si = ask(sw, 0x12)[SwitchInfo]
    assert si.linear_fdb_cap == 49152 and si.linear_fdb_top == 0 and si.port_state_change == 1
    data = mb.switch_info_set(bytes(ask(sw, 0x12).data), linear_fdb_top=200, clear_port_state_change=True)
    si = ask(sw, 0x12, method=mb.SET, data=data)[SwitchInfo]
    assert si.linear_fdb_top == 200 and si.port_state_change == 0
    assert sw.lft.top == 200
    sw.link_down(3)
    assert ask(sw, 0x12)[SwitchInfo].port_state_change == 1
    bad = mb.switch_info_set(data, linear_fdb_top=49152)
    smp = ask(sw, 0x12, method=mb.SET, data=bad)
    assert smp.status == 0x1C and smp[SwitchInfo].linear_fdb_top == 200


def test_switch_port_info_per_port(sw: SwitchAgent) -> None:
    sw.link_down(9)
    p5 = ask(sw, 0x15, mod=5, ingress=4)[PortInfo]
    assert (p5.local_port_num, p5.port_state, p5.port_phys_state) == (4, 2, 5)
    assert p5.link_width_active == 2 and p5.link_speed_ext_active == 2  # 4x EDR
    assert p5.neighbor_mtu == 5 and p5.mtu_cap == 5 and p5.operational_vls == 4 and p5.lid == 0
    p9 = ask(sw, 0x15, mod=9)[PortInfo]
    assert (p9.port_state, p9.port_phys_state, p9.link_width_active) == (1, 2, 0)
    p0 = ask(sw, 0x15, mod=0)[PortInfo]
    assert p0.port_state == 4 and p0.capability_mask & 0x8  # IsTrapSupported
    assert ask(sw, 0x15, mod=37).status == 0x1C


def test_port0_lid_set_and_get(sw: SwitchAgent) -> None:
    pi = bytes(ask(sw, 0x15, mod=0).data)
    p0 = ask(sw, 0x15, mod=0, method=mb.SET, data=mb.port_info_set(pi, lid=0x1234, sm_lid=1))[PortInfo]
    assert (p0.lid, p0.master_sm_lid) == (0x1234, 1)
    assert sw.lid == 0x1234
    assert ask(sw, 0x15, mod=0, method=mb.SET, data=mb.port_info_set(pi, lid=0xC000)).status == 0x1C
    assert sw.lid == 0x1234


def test_pkey_table(sw: SwitchAgent) -> None:
    pk = ask(sw, 0x16, mod=(3 << 16) | 0)[PKeyTable]
    assert pk.pkeys[0] == 0xFFFF and pk.pkeys[1:] == [0] * 31
    keys = [0xFFFF, 0x8001] + [0] * 30
    data = b"".join(k.to_bytes(2, "big") for k in keys)
    assert ask(sw, 0x16, mod=3 << 16, method=mb.SET, data=data)[PKeyTable].pkeys == keys
    assert ask(sw, 0x16, mod=3 << 16)[PKeyTable].pkeys == keys
    assert ask(sw, 0x16, mod=4 << 16)[PKeyTable].pkeys[1] == 0
    assert ask(sw, 0x16, mod=(3 << 16) | 1).status == 0x1C  # cap 32: one block
    ca = CaAgent(node_guid=GUID, link_up=[True])
    assert ask(ca, 0x16, mod=3, ingress=1).status == 0  # 128 entries: 4 blocks
    assert ask(ca, 0x16, mod=4, ingress=1).status == 0x1C


@pytest.mark.parametrize(("attr", "method", "mod", "status"), [
    (0x0020, mb.GET, 0, 0x0C),  # SMInfo to a switch
    (0x0099, mb.GET, 0, 0x0C),  # unknown attribute
    (0x0011, mb.SET, 0, 0x0C),  # NodeInfo is read-only
    (0x0010, mb.SET, 0, 0x0C),
    (0x0011, 0x12, 0, 0x08),  # GetTable: unsupported method
    (0x0019, mb.GET, 768, 0x1C),  # LFT block beyond the cap
])
def test_error_statuses(sw: SwitchAgent, attr: int, method: int, mod: int, status: int) -> None:
    assert ask(sw, attr, method=method, mod=mod).status == status


def test_bad_versions_get_status_4(sw: SwitchAgent) -> None:
    assert ask(sw, 0x11, class_version=2).status == 0x04
    assert ask(sw, 0x11, base_version=2).status == 0x04


def test_lid_routed_smp_to_the_switch_lid() -> None:
    fab = chain(2)
    nodes = MiniSm(fab, "sm").bring_up()
    lid = {n.description: n.lid for n in nodes.values()}
    fab.wire.clear()
    got = fab.send_mad("sm", 1, lid["s2"], 0, 0, mb.lr_smp(mb.GET, 0x11, tid=5))
    assert len(got) == 1 and got[0].slid == lid["s2"] and got[0].dlid == lid["sm"]
    assert mb.parse_node_info(mb.smp_data(got[0].mad)).node_guid == fab.agents["s2"].node_guid
    assert [r.src for r in fab.wire] == ["sm", "s1", "s2", "s1"]  # routed by the LFTs
    got = fab.send_mad("sm", 1, lid["h"], 0, 0, mb.lr_smp(mb.GET, 0x15, tid=6))
    pi = mb.parse_port_info(mb.smp_data(got[0].mad))
    assert pi.lid == lid["h"] and pi.port_state == 4 and pi.master_sm_lid == lid["sm"]


def _data(agent: SwitchAgent | CaAgent, attr: int, *, mod: int = 0, ingress: int = 2) -> bytes:
    """The 64 data bytes of the agent's answer to a one-hop DR Get arriving on ``ingress``."""
    mad = bytearray(mb.dr_smp(mb.GET, attr, path=[1], modifier=mod, tid=1))
    mad[6] = 1
    acts = agent.receive(ingress, frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15))
    (send,) = [a for a in acts if isinstance(a, Send)]
    return send.packet[28 + 64:28 + 128]


def test_sma_images_are_the_get_answers_with_the_kernels_keys(sw: SwitchAgent) -> None:
    """What the kernel SMA answers from: each image is the agent's own Get answer (PortInfo
    with LocalPortNum to be patched per ingress), keyed as the kernel looks it up."""
    ca = CaAgent(node_guid=GUID + 0x100, num_ports=2, link_up=[True, True])
    for agent, ingress in ((sw, 2), (ca, 2)):
        images = agent.sma_images()
        assert images[(0x10, 0)] == _data(agent, 0x10, ingress=ingress)
        assert images[(0x11, ingress)] == _data(agent, 0x11, ingress=ingress)
        pi = bytearray(images[(0x15, 1)])
        pi[28] = ingress
        assert bytes(pi) == _data(agent, 0x15, mod=1, ingress=ingress)
        pkey_key = (ingress << 16) | 0
        assert images[(0x16, pkey_key)] == _data(agent, 0x16, mod=pkey_key if agent.IS_SWITCH else 0,
                                                 ingress=ingress)
    assert sw.sma_images()[(0x12, 0)] == _data(sw, 0x12)
    assert (0x12, 0) not in ca.sma_images() and (0x15, 0) in sw.sma_images() and (0x15, 0) not in ca.sma_images()
    assert set(sw.sma_images(attrs=[0x15], ports=[3])) == {(0x15, 3)}


def test_port_info_keeps_the_error_thresholds_an_sm_set(sw: SwitchAgent) -> None:
    """LocalPhyErrors / OverrunErrors (byte 53) are read-write: OpenSM writes 8/8 and compares
    what it reads back; a port that forgot them got a PortInfo Set in every heavy sweep."""
    pi = bytearray(bytes(ask(sw, 0x15, mod=5).data))
    assert ask(sw, 0x15, mod=5)[PortInfo].local_phy_errors == 0
    pi[53] = 0x8A
    got = ask(sw, 0x15, mod=5, method=mb.SET, data=mb.port_info_set(bytes(pi)))[PortInfo]
    assert (got.local_phy_errors, got.overrun_errors) == (8, 10)
    again = ask(sw, 0x15, mod=5)[PortInfo]
    assert (again.local_phy_errors, again.overrun_errors) == (8, 10)
    assert ask(sw, 0x15, mod=6)[PortInfo].local_phy_errors == 0  # per port
