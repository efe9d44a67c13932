"""SLtoVLMappingTable (0x17) and VLArbitrationTable (0x18): Get/Set per the spec's layouts
(dissected with the scapy layers), per in/out port pair on a switch and per port on a CA, caps
consistent with PortInfo, and the tables as the link model takes them."""

from __future__ import annotations

import pytest

from ibemu.agents.ca import CaAgent
from ibemu.agents.port import VL_ARB_HIGH_CAP, VL_ARB_LOW_CAP
from ibemu.agents.switch import SwitchAgent
from ibemu.physics.qos import Sl2Vl, VlArb
from ibemu.wire import madcodec as mb
from ibemu.wire.mad import PortInfo, SLtoVLMappingTable, VLArbitrationTable
from ibemu.wire.madattrs import decode_sl2vl, decode_vl_arb_block, sl2vl_table, vl_arb_block

from .test_attributes import GUID, ask

MAP = (1, 0, 3, 2, 0, 1, 2, 3, 0, 0, 0, 0, 1, 1, 1, 15)


@pytest.fixture
def sw() -> SwitchAgent:
    return SwitchAgent(node_guid=GUID, num_ports=8, description="qos", link_up=[True] * 8)


def test_codecs_round_trip_and_match_the_scapy_layers() -> None:
    data = sl2vl_table(MAP)
    assert decode_sl2vl(data) == MAP
    layer = SLtoVLMappingTable(data)
    assert [getattr(layer, f"sl{i}_to_vl") for i in range(16)] == list(MAP)
    assert data[:2] == bytes([0x10, 0x32])  # SL0 in the high nibble of byte 0
    entries = [(0, 4), (1, 255), (7, 0)]
    block = vl_arb_block(entries)
    arb = VLArbitrationTable(block)
    assert [(getattr(arb, f"vl{i}"), getattr(arb, f"weight{i}")) for i in range(3)] == entries
    assert decode_vl_arb_block(block)[:3] == entries
    with pytest.raises(ValueError):
        sl2vl_table(MAP[:15])
    with pytest.raises(ValueError):
        vl_arb_block([(16, 1)])


def test_switch_sl2vl_per_input_output_pair(sw: SwitchAgent) -> None:
    mod = (3 << 8) | 5
    smp = ask(sw, 0x17, method=mb.SET, mod=mod, data=sl2vl_table(MAP))
    assert smp.status == 0
    got = ask(sw, 0x17, mod=mod)[SLtoVLMappingTable]
    assert [getattr(got, f"sl{i}_to_vl") for i in range(16)] == list(MAP)
    other = ask(sw, 0x17, mod=(4 << 8) | 5)[SLtoVLMappingTable]  # another pair: the default
    assert [getattr(other, f"sl{i}_to_vl") for i in range(16)] == [*range(15), 7]
    assert sw.sl2vl_map(3, 5) == Sl2Vl(MAP)
    assert ask(sw, 0x17, mod=(9 << 8) | 5).status == 0x1C  # no port 9
    assert ask(sw, 0x17, mod=(3 << 8) | 9).status == 0x1C


def test_ca_sl2vl_is_the_ingress_port() -> None:
    ca = CaAgent(node_guid=GUID, num_ports=2, link_up=[True, True])
    assert ask(ca, 0x17, method=mb.SET, mod=0x0102, data=sl2vl_table(MAP), ingress=2).status == 0
    assert ca.sl2vl_map(0, 2) == Sl2Vl(MAP)
    assert ca.sl2vl_map(0, 1) != Sl2Vl(MAP)


def test_vl_arbitration_blocks_caps_and_the_model_view(sw: SwitchAgent) -> None:
    pi = ask(sw, 0x15, mod=5)[PortInfo]
    assert (pi.vl_arbitration_high_cap, pi.vl_arbitration_low_cap) == (VL_ARB_HIGH_CAP, VL_ARB_LOW_CAP)
    assert sw.vl_arbitration(5) == VlArb.default(8)  # never set: round robin over OperationalVLs (VLCap)
    low = [(0, 32), (1, 0), (2, 16)] + [(3, 9)] * 7  # ten entries: two beyond the cap of 8
    assert ask(sw, 0x18, method=mb.SET, mod=(1 << 16) | 5, data=vl_arb_block(low)).status == 0
    assert ask(sw, 0x18, method=mb.SET, mod=(3 << 16) | 5, data=vl_arb_block([(1, 64)])).status == 0
    got = ask(sw, 0x18, mod=(1 << 16) | 5)[VLArbitrationTable]
    entries = [(getattr(got, f"vl{i}"), getattr(got, f"weight{i}")) for i in range(32)]
    assert entries[:8] == low[:8] and entries[8:] == [(0, 0)] * 24  # beyond the cap: zero
    # portions beyond a cap of 8 (entries 32-63) do not exist
    assert ask(sw, 0x18, mod=(2 << 16) | 5).status == 0x1C
    assert ask(sw, 0x18, mod=(4 << 16) | 5).status == 0x1C
    assert ask(sw, 0x18, mod=(5 << 16) | 5).status == 0x1C
    assert ask(sw, 0x18, mod=(1 << 16) | 9).status == 0x1C
    # the reserved nibble is not kept
    raw = bytearray(vl_arb_block([(2, 5)]))
    raw[0] |= 0xA0
    assert ask(sw, 0x18, method=mb.SET, mod=(3 << 16) | 6, data=bytes(raw))[VLArbitrationTable].rsv0 == 0
    # the link model's view: weight-0 entries left out, VLHighLimit from PortInfo
    pi_set = mb.port_info_set(bytes(ask(sw, 0x15, mod=5)[PortInfo]), vl_high_limit=3, operational_vls=3)
    assert ask(sw, 0x15, method=mb.SET, mod=5, data=pi_set).status == 0
    arb = sw.vl_arbitration(5)
    assert arb.high == ((1, 64),) and arb.low == ((0, 32), (2, 16), *[(3, 9)] * 5)
    assert arb.high_limit == 3
    assert sw.data_vls(5) == 4


def test_ca_vl_arbitration_is_the_ingress_port() -> None:
    ca = CaAgent(node_guid=GUID, num_ports=2, link_up=[True, True])
    assert ask(ca, 0x18, method=mb.SET, mod=(1 << 16) | 7, data=vl_arb_block([(0, 8)]), ingress=1).status == 0
    assert ca.vl_arbitration(1).low == ((0, 8),)
    assert ca.vl_arbitration(2) == VlArb.default(8)
