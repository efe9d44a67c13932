"""The shipped scenarios load, the built-in default matches its copy, and valid input parses fully."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.scenario import builtin_names, builtin_text, load_builtin, load_scenario, loads_scenario
from ibemu.scenario.yamlnodes import parse_size
from ibemu.topo.model import NodeKind
from ibemu.topo.rates import LinkRate

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


def test_there_are_scenarios() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {
        "default",
        "leaf-spine",
        "torus",
        "dragonfly",
        "switch-failure",
        "flapping",
        "from-ibnetdiscover",
    } <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_loads(path: Path) -> None:
    s = load_scenario(path)
    assert s.name == path.stem
    assert s.description and path.read_text().startswith("#")  # each has its comment block
    assert s.topology.validate() == []
    assert s.sm.host in s.topology.nodes and s.topology.node(s.sm.host).kind is NodeKind.CA
    # every one breaks something, but the GPU clusters': they measure training steps (failures
    # under training are a scenario of their own)
    assert s.traffic and (s.faults or s.gpus is not None)
    for f in s.faults:
        assert 0 <= f.at_s < s.duration_s
        assert f.link is None or f.link in s.topology.links
    for t in s.traffic:
        assert all(s.topology.node(h).kind is NodeKind.CA for h in t.hosts)
        assert 0 <= t.start_s < t.stop_s <= s.duration_s


def test_builtin_default_is_the_shipped_default() -> None:
    assert builtin_names() == ["default"]
    assert builtin_text("default") == (ROOT / "scenarios" / "default.yaml").read_text()


def test_default_scenario_says_what_the_issue_promises() -> None:
    s = load_builtin()
    assert (s.topology_spec.generator, s.topology_spec.params["k"]) == ("fat-tree", 4)
    assert (s.sm.impl, s.sm.engine) == ("ibemu", "ftree")
    down = [f for f in s.faults if f.action == "link_down"]
    assert len(down) == 1 and down[0].link is not None
    ends = {e.node for e in down[0].link.ends}
    assert {s.topology.node(n).level for n in ends} == {2, 3}  # an aggregation uplink
    assert any(f.action == "link_up" and f.link is down[0].link for f in s.faults)
    assert all(t.start_s <= down[0].at_s < t.stop_s for t in s.traffic)  # under traffic


def test_explicit_topology_and_every_field() -> None:
    s = loads_scenario(
        """
name: explicit
topology:
  nodes:
    sw0: {kind: switch}
    sw1: {kind: switch, ports: 8, desc: "spine one", guid: 0x1234}
    h0: ca
    h1: {kind: ca, ports: 2}
  links:
    - [h0:1, sw0:1]
    - endpoints: [h1:1, sw0:2]
      rate: 4x HDR
      mtu: 2048
      delay_us: 3
      loss_pct: 0.5
    - [sw0:5, sw1:1]
    - [h1:2, sw1:2]
defaults: {rate: 200G, mtu: 4096}
fabric: {kind: roce, datapath: user}
sm: {impl: opensm, engine: updn, host: h1, sweep_interval_s: 0, lmc: 2}
traffic:
  - {kind: incast, to: h0, size: 1MiB, qps: 4, start_s: 1, stop_s: 9, sl: 3}
  - {kind: stream, from: h0, to: h1, rate_pps: 500}
faults:
  - {at_s: 2, action: port_flap, link: "sw0:5-sw1:1", period_s: 0.5, count: 3}
  - {at_s: 3, action: corrupt, percent: 0.01, link: h1:1, duration_s: 2}
  - {at_s: 4, action: smp_loss, percent: 10, switch: sw1}
  - {at_s: 5, action: switch_down, switch: sw1}
  - {at_s: 6, action: switch_up, switch: sw1}
duration_s: 10
record: {capture: all, json: out/x.json, plots: false}
""",
        "e.yaml",
    )
    t = s.topology
    assert t.node("sw0").num_ports == 5  # highest cabled port
    assert (t.node("sw1").guid, t.node("sw1").desc) == (0x1234, "spine one")
    lk = t.link_at("sw0", 2)
    assert lk is not None and (lk.rate, lk.mtu, lk.delay_us, lk.loss_pct) == (
        LinkRate(4, "HDR"),
        2048,
        3,
        0.5,
    )
    assert t.rate_of(t.link_at("h0", 1)) == LinkRate(4, "HDR")  # type: ignore[arg-type]  # 200G default
    assert (s.fabric.kind, s.fabric.datapath) == ("roce", "user")
    assert (s.sm.impl, s.sm.engine, s.sm.host, s.sm.sweep_interval_s, s.sm.lmc) == (
        "opensm",
        "updn",
        "h1",
        0,
        2,
    )
    incast = s.traffic[0]
    assert (incast.name, incast.dst, incast.hosts, incast.size, incast.qps, incast.sl) == (
        "incast0", "h0", ("h1", "h0"), 1 << 20, 4, 3,
    )  # fmt: skip
    assert (s.traffic[1].rate_pps, s.traffic[1].stop_s, s.traffic[1].size) == (500, 10, 256)
    flap = s.faults[0]
    assert (flap.action, str(flap.link), flap.period_s, flap.count) == (
        "port_flap",
        "sw0:5-sw1:1",
        0.5,
        3,
    )
    assert s.faults[2].switch == "sw1" and s.faults[2].percent == 10
    assert s.faults[0].where == "e.yaml:25 faults[0]"
    assert len(s.record.capture) == 4 and str(s.record.json) == "out/x.json"


@pytest.mark.parametrize(
    ("text", "n"),
    [
        (4096, 4096),
        ("64K", 65536),
        ("64KiB", 65536),
        ("64KB", 64000),
        ("1MiB", 1 << 20),
        ("1.5K", 1536),
        ("2 GiB", 2 << 30),
    ],
)
def test_sizes(text: object, n: int) -> None:
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["1.3B", "K", "-5", True, 1.5, "12 parsecs"])
def test_bad_sizes(text: object) -> None:
    assert parse_size(text) is None
