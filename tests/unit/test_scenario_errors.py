"""A table of bad scenario files, each with the exact located error expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.scenario import ScenarioError, load_scenario, loads_scenario

FT = "topology:\n  generator: fat-tree\n  k: 4\n"  # lines 1-3
LS = "topology:\n  generator: leaf-spine\n  leaves: 2\n  spines: 1\n  uplinks_per_leaf: 2\n"  # 1-5
NEEDS_USER = "needs fabric.datapath: user (the kernel datapath forwards in tc, without delay, loss or corruption)"

CASES: list[tuple[str, str, str]] = [
    # (id, scenario text, the exact first problem)
    ("empty", "", "x.yaml:1: empty scenario: expected a mapping with at least a 'topology' key"),
    ("not-a-mapping", "- a\n", "x.yaml:1: expected a mapping, got a list"),
    ("no-topology", "name: x\n", "x.yaml:1: missing required key 'topology'"),
    (
        "yaml-syntax",
        FT + "faults: [\n",
        "x.yaml:5: YAML syntax error: expected the node content, but found '<stream end>'",
    ),
    (
        "unknown-top-key",
        FT + "durration_s: 5\n",
        "x.yaml:4 durration_s: unknown key (did you mean 'duration_s'?); expected one of: name, description, "
        "topology, defaults, fabric, sm, partitions, traffic, faults, duration_s, record, time, gpus",
    ),
    ("duplicate-key", FT + "  k: 6\n", "x.yaml:4 topology.k: duplicate key (first at line 3)"),
    (
        "odd-k",
        "topology:\n  generator: fat-tree\n  k: 5\n",
        "x.yaml:3 topology.k: k must be even, got 5",
    ),
    (
        "k-not-int",
        "topology:\n  generator: fat-tree\n  k: four\n",
        "x.yaml:3 topology.k: expected an integer in 2..64, got 'four'",
    ),
    (
        "k-missing",
        "topology:\n  generator: fat-tree\n",
        "x.yaml:2 topology: missing k (switch radix (even))",
    ),
    (
        "unknown-param",
        FT + "  hosts: 3\n",
        "x.yaml:4 topology.hosts: unknown key (did you mean 'hosts_per_edge'?); expected one of: generator, name, "
        "k, levels, hosts_per_edge",
    ),
    (
        "unknown-generator",
        "topology:\n  generator: fat-tee\n",
        "x.yaml:2 topology.generator: unknown generator 'fat-tee' (did you mean 'fat-tree'?); known: fat-tree, "
        "leaf-spine, torus, mesh, dragonfly, ring, single-switch, gpu-rails",
    ),
    (
        "two-sources",
        "topology:\n  generator: ring\n  file: x.ibnd\n",
        "x.yaml:2 topology: give only one of generator, file or nodes (got generator, file)",
    ),
    (
        "no-source",
        "topology:\n  generater: ring\n",
        "x.yaml:2 topology: expected one of: generator, file, nodes; 'generater' (did you mean 'generator'?)",
    ),
    (
        "missing-ibnd",
        "topology:\n  file: nope.ibnd\n",
        "x.yaml:2 topology.file: no such file: nope.ibnd (a relative path starts at the scenario's folder)",
    ),
    (
        "bad-ibnd",
        "topology:\n  file: bad.ibnd\n",
        "x.yaml:2 topology.file: cannot import bad.ibnd: 1 problem(s) below",
    ),
    (
        "explicit-port-beyond",
        "topology:\n  nodes:\n    sw0: {kind: switch, ports: 4}\n    h0: ca\n  links:\n    - [h0:1, sw0:9]\n",
        "x.yaml:6 topology.links[0]: sw0:9: no port 9; sw0 has ports 1-4",
    ),
    (
        "explicit-bad-name",
        "topology:\n  nodes:\n    sw-0: switch\n  links: []\n",
        "x.yaml:3 topology.nodes.sw-0: node name 'sw-0' must start with a letter and use only letters, digits and '_'",
    ),
    (
        "explicit-bad-endpoint",
        "topology:\n  nodes:\n    sw0: switch\n  links:\n    - endpoints: [sw0, sw0:2]\n",
        "x.yaml:5 topology.links[0].endpoints[0]: expected an endpoint 'node:port', got 'sw0'",
    ),
    (
        "bad-rate",
        FT + "defaults:\n  rate: 4x QQR\n",
        "x.yaml:5 defaults.rate: expected a rate like '4x EDR', 'HDR' or '100G' (speeds: SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR; widths: 1x, 2x, 4x, 8x, 12x), got '4x QQR'",
    ),
    (
        "bad-mtu",
        FT + "defaults:\n  mtu: 1500\n",
        "x.yaml:5 defaults.mtu: expected an IB MTU, one of 256, 512, 1024, 2048, 4096, got 1500",
    ),
    (
        "delay-on-kernel",
        FT + "defaults:\n  delay_us: 5\n",
        f"x.yaml:5 defaults.delay_us: {NEEDS_USER}",
    ),
    (
        "fabric-kind",
        FT + "fabric:\n  kind: ethernet\n",
        "x.yaml:5 fabric.kind: expected one of ib, roce, got 'ethernet'",
    ),
    (
        "sm-engine",
        FT + "sm:\n  engine: ftre\n",
        "x.yaml:5 sm.engine: expected one of minhop, updn, ftree, dor, ftree_ar, updn_ar, got 'ftre' (did you mean 'ftree'?)",
    ),
    (
        "sm-host-switch",
        FT + "sm:\n  host: edge0_0\n",
        "x.yaml:5 sm.host: edge0_0 is a switch, expected a CA (host)",
    ),
    (
        "ftree-on-torus",
        "topology:\n  generator: torus\n  dims: [3, 3]\nsm:\n  engine: ftree\n",
        "x.yaml:5 sm.engine: ftree routes fat-trees, and torus-3x3 is not layered like one; use minhop, updn or dor",
    ),
    (
        "sweep-negative",
        FT + "sm:\n  sweep_interval_s: -1\n",
        "x.yaml:5 sm.sweep_interval_s: expected a number from 0 to 3600, got -1",
    ),
    (
        "duration-zero",
        FT + "duration_s: 0\n",
        "x.yaml:4 duration_s: expected a number > 0 and <= 86400, got 0",
    ),
    (
        "traffic-kind",
        FT + "traffic:\n  - kind: write_bandwidth\n",
        "x.yaml:5 traffic[0].kind: expected one of write_bw, read_bw, send_bw, write_lat, send_lat, allreduce, "
        "alltoall, incast, permutation, stream, training, got 'write_bandwidth' (did you mean 'write_bw'?)",
    ),
    (
        "traffic-no-kind",
        FT + "traffic:\n  - from: h0\n",
        "x.yaml:5 traffic[0]: missing required key 'kind' (one of write_bw, read_bw, send_bw, write_lat, "
        "send_lat, allreduce, alltoall, incast, permutation, stream, training)",
    ),
    (
        "traffic-unknown-host",
        FT + "traffic:\n  - kind: write_bw\n    from: h0\n    to: h99\n",
        "x.yaml:7 traffic[0].to: no host 'h99' (did you mean 'h9'?); fat-tree-k4 has 16: h0, h1, h2, ..., h15",
    ),
    (
        "traffic-missing-to",
        FT + "traffic:\n  - kind: send_lat\n    from: h0\n",
        "x.yaml:5 traffic[0]: missing required key 'to' (a host) for kind send_lat",
    ),
    (
        "traffic-same-host",
        FT + "traffic:\n  - kind: write_bw\n    from: h0\n    to: h0\n",
        "x.yaml:7 traffic[0].to: from and to are both h0; traffic needs two hosts",
    ),
    (
        "traffic-key-of-other-kind",
        FT + "traffic:\n  - kind: allreduce\n    from: h0\n",
        "x.yaml:6 traffic[0].from: not a key of kind allreduce; expected one of: name, kind, start_s, stop_s, sl, hosts, size, "
        "rc_timeout, rc_retry_cnt",
    ),
    (
        "traffic-size",
        FT + "traffic:\n  - kind: write_bw\n    from: h0\n    to: h1\n    size: 12 parsecs\n",
        "x.yaml:8 traffic[0].size: expected a size in bytes like 4096, '64KiB' or '1MiB', got '12 parsecs'",
    ),
    (
        "traffic-stop-before-start",
        FT
        + "traffic:\n  - kind: write_bw\n    from: h0\n    to: h1\n    start_s: 5\n    stop_s: 3\n",
        "x.yaml:9 traffic[0].stop_s: must be after start_s (5), got 3",
    ),
    (
        "traffic-qps",
        FT + "traffic:\n  - kind: write_bw\n    from: h0\n    to: h1\n    qps: 0\n",
        "x.yaml:8 traffic[0].qps: expected an integer from 1 to 1024, got 0",
    ),
    (
        "traffic-duplicate-host",
        FT + "traffic:\n  - kind: alltoall\n    hosts: [h0, h1, h0]\n",
        "x.yaml:6 traffic[0].hosts[2]: h0 is listed twice",
    ),
    (
        "traffic-incast-receiver-sends",
        FT + "traffic:\n  - kind: incast\n    to: h0\n    from: [h1, h0]\n",
        "x.yaml:7 traffic[0].from: h0 is the receiver; it cannot also send",
    ),
    (
        "traffic-duplicate-name",
        FT
        + "traffic:\n  - {name: a, kind: write_bw, from: h0, to: h1}\n  - {name: a, kind: write_bw, from: h1, to: h0}\n",
        "x.yaml:6 traffic[1].name: duplicate traffic name 'a' (first at traffic[0])",
    ),
    (
        "fault-port-beyond",
        FT + "faults:\n  - at_s: 1\n    action: link_down\n    link: edge0_0:9\n",
        "x.yaml:7 faults[0].link: no link edge0_0:9 — edge0_0 has ports 1-4",
    ),
    (
        "fault-second-entry",
        FT + "faults:\n  - {at_s: 1, action: link_down, link: edge0_0:3}\n"
        "  - at_s: 2\n    action: link_down\n    link: edge0_0:9\n",
        "x.yaml:8 faults[1].link: no link edge0_0:9 — edge0_0 has ports 1-4",
    ),
    (
        "fault-uncabled-port",
        "topology:\n  generator: fat-tree\n  k: 4\n  hosts_per_edge: 1\n"
        "faults:\n  - at_s: 1\n    action: link_down\n    link: edge0_0:2\n",
        "x.yaml:8 faults[0].link: no link edge0_0:2 — port 2 of edge0_0 is not cabled",
    ),
    (
        "fault-wrong-far-end",
        FT + "faults:\n  - at_s: 1\n    action: link_down\n    link: edge0_0:3-agg0_1:1\n",
        "x.yaml:7 faults[0].link: no link edge0_0:3-agg0_1:1 — edge0_0:3 goes to agg0_0:1",
    ),
    (
        "fault-no-direct-link",
        FT + "faults:\n  - at_s: 1\n    action: link_down\n    link: edge0_0-core0\n",
        "x.yaml:7 faults[0].link: no link between edge0_0 and core0 — edge0_0 is linked to h0, h1, agg0_0, agg0_1",
    ),
    (
        "fault-parallel-links",
        LS + "faults:\n  - at_s: 1\n    action: link_down\n    link: leaf0-spine0\n",
        "x.yaml:9 faults[0].link: 2 links join leaf0 and spine0 (leaf0:5, leaf0:6); name one by port",
    ),
    (
        "fault-link-syntax",
        FT + "faults:\n  - at_s: 1\n    action: link_down\n    link: edge0_0/3\n",
        "x.yaml:7 faults[0].link: expected a link like 'edge0_0:3', 'edge0_0:3-agg0_0:1' or 'edge0_0-agg0_0', got 'edge0_0/3'",
    ),
    (
        "fault-action",
        FT + "faults:\n  - at_s: 1\n    action: unplug\n",
        "x.yaml:6 faults[0].action: expected one of link_down, link_up, switch_down, switch_up, port_flap, "
        "smp_loss, corrupt, sm_down, sm_up, got 'unplug'",
    ),
    (
        "fault-after-end",
        FT + "duration_s: 10\nfaults:\n  - at_s: 12\n    action: link_down\n    link: edge0_0:3\n",
        "x.yaml:6 faults[0].at_s: 12 s is not before the end of the run (duration_s: 10)",
    ),
    (
        "fault-missing-at",
        FT + "faults:\n  - action: switch_down\n    switch: core0\n",
        "x.yaml:5 faults[0]: missing required key 'at_s' for action switch_down",
    ),
    (
        "fault-foreign-key",
        FT + "faults:\n  - at_s: 1\n    action: link_down\n    link: edge0_0:3\n    period_s: 2\n",
        "x.yaml:8 faults[0].period_s: not a key of action link_down; expected one of: at_s, action, link",
    ),
    (
        "fault-flap-needs-period",
        FT + "faults:\n  - at_s: 1\n    action: port_flap\n    link: edge0_0:3\n",
        "x.yaml:5 faults[0]: missing required key 'period_s' for action port_flap",
    ),
    (
        "fault-switch-is-host",
        FT + "faults:\n  - at_s: 1\n    action: switch_down\n    switch: h3\n",
        "x.yaml:7 faults[0].switch: h3 is a CA (host), expected a switch",
    ),
    (
        "fault-percent",
        FT + "faults:\n  - at_s: 1\n    action: smp_loss\n    percent: 120\n",
        "x.yaml:7 faults[0].percent: expected a number > 0 and <= 100, got 120",
    ),
    (
        "fault-corrupt-kernel",
        FT + "faults:\n  - at_s: 1\n    action: corrupt\n    percent: 1\n",
        f"x.yaml:6 faults[0].action: corrupt {NEEDS_USER}",
    ),
    (
        "fault-up-before-down",
        FT + "faults:\n  - at_s: 1\n    action: link_up\n    link: edge0_0:3\n",
        "x.yaml:5 faults[0]: link edge0_0:3-agg0_0:1 is not down at 1 s; bring it down first",
    ),
    (
        "fault-down-twice",
        FT
        + "faults:\n  - {at_s: 1, action: switch_down, switch: core0}\n  - {at_s: 2, action: switch_down, switch: core0}\n",
        "x.yaml:6 faults[1]: switch core0 is already down at 2 s (faults[0] at 1 s)",
    ),
    (
        "record-capture",
        FT + "record:\n  capture: [edge0_0:3, agg9_9:1]\n",
        "x.yaml:5 record.capture[1]: no link agg9_9:1 — no node 'agg9_9' (did you mean 'agg3_1'?)",
    ),
    (
        "record-plots",
        FT + "record:\n  plots: yes please\n",
        "x.yaml:5 record.plots: expected true or false, got 'yes please'",
    ),
    (
        "adaptive-routing-kernel",
        FT + "fabric:\n  adaptive_routing: true\nsm:\n  engine: ftree_ar\n",
        "x.yaml:5 fabric.adaptive_routing: needs fabric.datapath: user (the switches choose by the link "
        "model's queues; the kernel datapath has none)",
    ),
    (
        "adaptive-routing-no-groups",
        FT + "fabric:\n  datapath: user\n  adaptive_routing: true\nsm:\n  engine: ftree\n",
        "x.yaml:6 fabric.adaptive_routing: needs ibemu's SM with an adaptive engine (sm.engine: ftree_ar or "
        "updn_ar), which writes the groups, not ibemu ftree",
    ),
    (
        "adaptive-routing-mode",
        FT + "fabric:\n  datapath: user\n  adaptive_routing: {mode: sprinkle}\nsm:\n  engine: ftree_ar\n",
        "x.yaml:6 fabric.adaptive_routing.mode: expected one of packet, flowlet, got 'sprinkle'",
    ),
    ("rc-timeout-zero", FT + "traffic:\n  - {kind: allreduce, rc_timeout: 0}\n",
     "x.yaml:5 traffic[0].rc_timeout: expected an integer from 1 to 31, got 0"),
    ("rc-timeout-too-long", FT + "traffic:\n  - {kind: allreduce, rc_timeout: 32}\n",
     "x.yaml:5 traffic[0].rc_timeout: expected an integer from 1 to 31, got 32"),
    ("rc-retry-cnt", FT + "traffic:\n  - {kind: alltoall, rc_retry_cnt: 8}\n",
     "x.yaml:5 traffic[0].rc_retry_cnt: expected an integer from 0 to 7, got 8"),
    ("rc-timeout-bw", FT + "traffic:\n  - {kind: write_bw, from: h0, to: h1, rc_timeout: 18}\n",
     "x.yaml:5 traffic[0].rc_timeout: not a key of kind write_bw; expected one of: name, kind, start_s, "
     "stop_s, sl, from, to, size, qps, bidirectional, rate_pps"),
    (
        "adaptive-routing-gap-per-packet",
        FT + "fabric:\n  datapath: user\n  adaptive_routing: {flowlet_gap_us: 3}\nsm:\n  engine: ftree_ar\n",
        "x.yaml:6 fabric.adaptive_routing.flowlet_gap_us: applies to mode: flowlet only",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_scenario(text: str, expected: str, tmp_path: Path) -> None:
    (tmp_path / "bad.ibnd").write_text('Switch 2 "A"\n[3] "B"[1]\n')
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, "x.yaml", tmp_path)
    assert info.value.problems[0] == expected, info.value.problems
    assert str(info.value).splitlines()[0] == expected


def test_every_problem_is_reported_in_line_order() -> None:
    text = (
        FT
        + "sm:\n  engine: nope\ntraffic:\n  - kind: write_bw\n    from: h0\n    to: h77\nduration_s: -3\n"
    )
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, "x.yaml")
    lines = [int(p.split(":")[1].split()[0]) for p in info.value.problems]
    assert len(info.value.problems) == 3
    assert lines == sorted(lines) == [5, 9, 10]


def test_ibnd_problems_follow_the_scenario_line(tmp_path: Path) -> None:
    (tmp_path / "bad.ibnd").write_text('Switch 2 "A"\n[3] "B"[1]\n')
    with pytest.raises(ScenarioError) as info:
        loads_scenario("topology:\n  file: bad.ibnd\n", "x.yaml", tmp_path)
    assert info.value.problems[1] == f'{tmp_path / "bad.ibnd"}:2: port 3 is beyond "A"\'s 2 ports'


def test_missing_scenario_file() -> None:
    with pytest.raises(
        Exception, match=r"nope\.yaml: cannot read scenario: No such file or directory"
    ):
        load_scenario("nope.yaml")
