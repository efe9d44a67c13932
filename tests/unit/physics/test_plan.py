"""build_nodes: a topology's cables, rates, delays, credits and QoS in the model."""

from __future__ import annotations

import pytest

from ibemu.physics.link import SWITCH_MODELS, data_gbps
from ibemu.physics.model import EthConfig
from ibemu.physics.plan import build_nodes
from ibemu.physics.qos import Sl2Vl, VlArb
from ibemu.scenario import loads_scenario
from ibemu.topo.rates import parse_rate

TEXT = """topology:
  nodes:
    sw0: {kind: switch, ports: 3}
    sw1: {kind: switch, ports: 3}
    a: ca
    b: ca
  links:
    - [a:1, sw0:1]
    - {endpoints: [sw0:3, sw1:3], rate: NDR, cable_m: 30}
    - {endpoints: [b:1, sw1:1], delay_us: 1}
defaults: {rate: 4x HDR}
fabric: {datapath: user}
"""


def test_ib_nodes_from_a_scenario() -> None:
    s = loads_scenario(TEXT, "x.yaml")
    sw = SWITCH_MODELS["ib-hdr"]
    qmap = Sl2Vl((1,) * 16)
    nodes = build_nodes(s.topology, kind="ib", switch=sw, data_vls=2, sl2vl=qmap, vlarb=VlArb(low=((1, 4),)))
    assert set(nodes) == {"sw0", "sw1", "a", "b"}
    trunk = nodes["sw0"].ports[3]
    assert trunk.link.gbps == data_gbps(parse_rate("NDR")) and trunk.link.propagation == 150
    assert nodes["a"].ports[1].link.gbps == data_gbps(parse_rate("4x HDR"))
    assert nodes["b"].ports[1].link.propagation == 1000
    assert trunk.peer == ("sw1", 3)
    assert trunk.credits[0] == sw.buffer_bytes // 64 and trunk.credits[1] == sw.buffer_bytes // 64
    assert trunk.credits[2] == 0  # not operated
    assert nodes["sw0"].ports[1].credits[0] is None  # a host never runs out of buffer
    assert nodes["a"].ports[1].credits[0] == sw.buffer_bytes // 64
    assert nodes["sw0"].sl2vl[(0, 3)] == qmap and nodes["a"].sl2vl[(0, 1)] == qmap
    assert nodes["sw0"].latency_ns == 130 and nodes["a"].latency_ns == 0


def test_eth_nodes_and_mismatched_models() -> None:
    s = loads_scenario(TEXT, "x.yaml")
    nodes = build_nodes(s.topology, kind="eth", switch=SWITCH_MODELS["eth"])
    assert nodes["sw0"].eth == EthConfig(buffer_bytes=SWITCH_MODELS["eth"].buffer_bytes)
    assert nodes["sw0"].ports[3].link.framing_bytes == 20
    with pytest.raises(ValueError, match="not for a ib fabric"):
        build_nodes(s.topology, kind="ib", switch=SWITCH_MODELS["eth"])
