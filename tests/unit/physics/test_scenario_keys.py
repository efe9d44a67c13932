"""Scenario keys of the link model: cable lengths, switch models, QoS; located errors and
warnings; rates on the kernel datapath said in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.physics.link import NS_PER_METRE
from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.topo.rates import parse_rate

SS = "topology:\n  generator: single-switch\n  hosts: 2\n"  # lines 1-3
USER = "fabric:\n  datapath: user\n"


def _problems(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as e:
        loads_scenario(text, "x.yaml")
    return e.value.problems


def test_cable_m_becomes_propagation_and_defaults_reach_the_links() -> None:
    s = loads_scenario(SS + USER + "defaults:\n  cable_m: 20\n  loss_pct: 1\n", "x.yaml")
    assert all(lk.delay_us == pytest.approx(20 * NS_PER_METRE / 1000) for lk in s.topology.links)
    assert all(lk.cable_m == 20 and lk.loss_pct == 1 for lk in s.topology.links)
    assert s.warnings == ()


def test_explicit_link_keeps_its_own_delay() -> None:
    text = ("topology:\n  nodes:\n    sw: {kind: switch, ports: 2}\n    a: ca\n    b: ca\n  links:\n"
            "    - {endpoints: [a:1, sw:1], cable_m: 100}\n    - {endpoints: [b:1, sw:2], delay_us: 0}\n"
            + USER + "defaults:\n  delay_us: 3\n")
    s = loads_scenario(text, "x.yaml")
    delays = sorted(lk.delay_us for lk in s.topology.links)
    assert delays == [0.0, pytest.approx(0.5)]


@pytest.mark.parametrize(("text", "problem"), [
    (SS + USER + "defaults:\n  delay_us: 1\n  cable_m: 3\n",
     "x.yaml:8 defaults.cable_m: give the propagation as delay_us or as cable_m, not both"),
    (SS + "defaults:\n  cable_m: 3\n",
     "x.yaml:5 defaults.cable_m: needs fabric.datapath: user (the kernel datapath forwards in tc, "
     "without delay, loss or corruption)"),
    (SS + USER + "defaults:\n  cable_m: -1\n", "x.yaml:7 defaults.cable_m: expected a number from 0 to 100000, got -1"),
    (SS + "fabric:\n  switch: {latency_ns: 100}\n",
     "x.yaml:5 fabric.switch: switch latency and buffers need fabric.datapath: user "
     "(the kernel datapath forwards without either)"),
    (SS + USER + "  switch: {model: eth}\n",
     "x.yaml:6 fabric.switch.model: expected one of ib-edr, ib-hdr, ib-ndr, got 'eth'"),
    (SS + USER + "  switch: {latency_ns: -5}\n",
     "x.yaml:6 fabric.switch.latency_ns: expected an integer from 0 to 100000, got -5"),
    (SS + USER + "  switch: {buffer_kb: 2}\n",
     "x.yaml:6 fabric.switch.buffer_kb: 2 KiB cannot hold one 4096-byte-MTU packet (4222 bytes): "
     "nothing would pass; give at least 5 KiB"),
    (SS + "fabric:\n  qos: {vls: 3}\n",
     "x.yaml:5 fabric.qos.vls: a port operates 1, 2, 4 or 8 data VLs (the emulated ports' VLCap is VL0-VL7), got 3"),
    (SS + "fabric:\n  qos:\n    vls: 2\n    sl2vl: {0: 15}\n",
     "x.yaml:7 fabric.qos.sl2vl.0: VL15 carries subnet management packets only: data on it is dropped"),
    (SS + "fabric:\n  qos:\n    vls: 2\n    sl2vl: {1: 2}\n",
     "x.yaml:7 fabric.qos.sl2vl.1: VL2 is not operated: fabric.qos.vls is 2 (VL0-VL1)"),
    (SS + "fabric:\n  qos:\n    sl2vl: [0, 0]\n",
     "x.yaml:6 fabric.qos.sl2vl: expected 16 VLs (SL0..SL15), got 2; or a mapping {SL: VL}"),
    (SS + "fabric:\n  qos:\n    vls: 2\n    vlarb_low: [[0, 300]]\n",
     "x.yaml:7 fabric.qos.vlarb_low[0].weight: expected an integer from 0 to 255, got 300"),
    (SS + "fabric:\n  qos:\n    vlarb_low: [[1, 3]]\n",
     "x.yaml:6 fabric.qos.vlarb_low[0].vl: VL1 is not operated: fabric.qos.vls is 1"),
    (SS + "fabric:\n  qos:\n    vlarb_high: " + str([[0, 1]] * 9) + "\n",
     "x.yaml:6 fabric.qos.vlarb_high: at most 8 entries (the ports' VLArbitrationHighCap/LowCap), got 9"),
    (SS + "fabric:\n  qos:\n    vlarb_low: [0, 1]\n",
     "x.yaml:6 fabric.qos.vlarb_low[0]: expected [VL, weight], like [0, 64]"),
    (SS + "fabric:\n  kind: roce\n  qos: {vls: 2}\n",
     "x.yaml:6 fabric.qos: VLs, SL->VL maps and VL arbitration are InfiniBand's; a RoCE fabric's "
     "priorities are fabric.pfc and fabric.dscp_priority"),
    (SS + "defaults:\n  rate: 4x ZDR\n",
     "x.yaml:5 defaults.rate: expected a rate like '4x EDR', 'HDR' or '100G' (speeds: SDR, DDR, QDR, FDR10, "
     "FDR, EDR, HDR, NDR, XDR; widths: 1x, 2x, 4x, 8x, 12x), got '4x ZDR'"),
])
def test_bad_physics_keys(text: str, problem: str) -> None:
    assert _problems(text)[0] == problem


def test_a_rate_on_the_kernel_datapath_gets_one_line() -> None:
    s = loads_scenario(SS + "defaults:\n  rate: 4x HDR\n", "x.yaml")
    assert s.warnings == ("x.yaml:5 defaults.rate: warning: rates apply on the user datapath only "
                          "(fabric.datapath: user): the kernel datapath forwards as fast as the machine can, "
                          "the rate sets PortInfo's link width and speed",)
    assert loads_scenario(SS + USER + "defaults:\n  rate: 4x HDR\n", "x.yaml").warnings == ()
    assert loads_scenario(SS, "x.yaml").warnings == ()


def test_qos_parsed_and_starvation_warned() -> None:
    text = (SS + USER + "  qos:\n    vls: 4\n    sl2vl: {1: 1, 2: 2}\n    vlarb_high: [[1, 16]]\n"
            "    vlarb_low: [[0, 4], [2, 0]]\n    vl_high_limit: 4\n"
            "traffic:\n  - {name: bulk, kind: write_bw, from: h0, to: h1, sl: 2}\n")
    s = loads_scenario(text, "x.yaml")
    q = s.fabric.qos
    assert q is not None and q.vls == 4 and q.vl_high_limit == 4
    assert q.sl_to_vl()[:4] == (0, 1, 2, 3)
    assert q.vlarb_high == ((1, 16),) and q.vlarb_low == ((0, 4), (2, 0))
    assert len(s.warnings) == 1
    assert "VL2 gets no arbitration weight: traffic 'bulk' (sl 2) rides it" in s.warnings[0]
    assert s.warnings[0].startswith("x.yaml:7 fabric.qos: warning:")


def test_unlimited_high_priority_warned() -> None:
    text = (SS + USER + "  qos:\n    vls: 2\n    vlarb_high: [[1, 16]]\n    vlarb_low: [[0, 4]]\n"
            "    vl_high_limit: 255\n"
            "traffic:\n  - {name: hi, kind: write_bw, from: h0, to: h1, sl: 1}\n")
    s = loads_scenario(text, "x.yaml")
    assert any("can starve the low-priority ones [0]" in w for w in s.warnings)


def test_switch_spec_resolves_to_a_model() -> None:
    s = loads_scenario(SS + USER + "  switch: {model: ib-hdr, buffer_kb: 64}\n", "x.yaml")
    assert s.fabric.switch is not None
    m = s.fabric.switch.resolve(parse_rate("HDR"), ethernet=False)
    assert (m.name, m.latency_ns, m.buffer_bytes) == ("ib-hdr", 130, 65536)
    s = loads_scenario(SS + "fabric:\n  kind: roce\n  datapath: user\n  switch: {latency_ns: 700}\n", "x.yaml")
    assert s.fabric.switch is not None
    m = s.fabric.switch.resolve(parse_rate("100G"), ethernet=True)
    assert (m.name, m.latency_ns) == ("eth", 700)


def test_qos_reaches_ibemus_sm_and_opensms_options(tmp_path: Path) -> None:
    from ibemu.fabric import opensm
    from ibemu.scenario.runner import fabric_request
    from ibemu.sm.qos import SmQos

    text = SS + ("fabric:\n  qos: {vls: 4, sl2vl: {1: 1, 2: 3}, vlarb_low: [[0, 16], [1, 8], [3, 4]],"
                 " vl_high_limit: 2}\nsm:\n  impl: opensm\n")
    oq = SmQos.from_json(fabric_request(loads_scenario(text, "x.yaml")).sm_qos)
    conf = Path(opensm.write_config(tmp_path, None, None, qos=oq)).read_text().splitlines()
    assert conf == ["qos TRUE", "max_op_vls 3", "qos_high_limit 2", "qos_vlarb_high 0:0",
                    "qos_vlarb_low 0:16,1:8,3:4", "qos_sl2vl 0,1,3,3,0,1,2,3,0,1,2,3,0,1,2,3"]
    # neither table given: every operated VL once in the low table, as ibemu's SM writes it
    assert "qos_vlarb_low 0:1,1:1\n" in opensm.qos_options(SmQos(vls=2))

    s = loads_scenario(SS + "fabric:\n  qos: {vls: 2, vlarb_low: [[0, 4], [1, 2]]}\n", "x.yaml")
    req = fabric_request(s)
    q = SmQos.from_json(req.sm_qos)
    assert (q.vls, q.vlarb_low, q.sl_to_vl()[:3]) == (2, ((0, 4), (1, 2)), (0, 1, 0))
    assert fabric_request(loads_scenario(SS, "x.yaml")).sm_qos == ""


def test_ibemu_up_carries_qos_and_says_the_rate_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import argparse

    from ibemu.cli.fabric_cmd import request_from_args

    path = tmp_path / "q.yaml"
    path.write_text(SS + "defaults:\n  rate: NDR\nfabric:\n  qos: {vls: 2}\n")
    args = argparse.Namespace(topo=None, scenario=path, datapath=None, fabric=None, dilation=None,
                              sm="ibemu", sm_host=None, sm_engine=None)
    req = request_from_args(args)
    assert '"vls": 2' in req.sm_qos
    err = capsys.readouterr().err
    assert "defaults.rate: warning: rates apply on the user datapath only" in err
    args.datapath = "user"
    request_from_args(args)
    assert "rates apply" not in capsys.readouterr().err
    args.sm = "opensm"
    assert '"vls": 2' in request_from_args(args).sm_qos  # OpenSM gets it as its own options
