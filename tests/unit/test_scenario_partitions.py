"""``partitions:`` in a scenario: validated with located errors, carried to ibemu's SM."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.fabric import opensm
from ibemu.fabric.session import read_spec, request_from_spec, write_spec
from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.scenario.runner import fabric_request
from ibemu.sm.__main__ import parse_args
from ibemu.sm.partitions import SmPartitions

T = "topology:\n  generator: leaf-spine\n  leaves: 2\n  spines: 1\n  hosts_per_leaf: 2\nfabric:\n  datapath: user\n"
# lines 1-7; partitions: on line 8, its entries from line 9 (errors about the list name its first)


def _parts(body: str) -> str:
    return T + "partitions:\n" + body


BAD: list[tuple[str, str, str]] = [
    ("key-with-membership-bit", _parts("  - {name: a, pkey: 0x8001, members: [h0]}\n"),
     "x.yaml:9 partitions[0].pkey: expected a P_Key 0x0001-0x7ffe (bit 15, the membership, is given per member), "
     "got 0x8001"),
    ("key-zero", _parts("  - {name: a, pkey: 0, members: [h0]}\n"),
     "x.yaml:9 partitions[0].pkey: expected a P_Key 0x0001-0x7ffe (bit 15, the membership, is given "
     "per member), got 0x0"),
    ("key-default", _parts("  - {name: a, pkey: 0x7fff, members: [h0]}\n"),
     "x.yaml:9 partitions[0].pkey: 0x7fff is the default partition's key (every port is a full member of it); "
     "give 0x0001-0x7ffe"),
    ("key-twice", _parts("  - {name: a, pkey: 1, members: [h0]}\n  - {name: b, pkey: 1, members: [h1]}\n"),
     "x.yaml:10 partitions[1].pkey: P_Key 0x0001 is used twice (first at line 9)"),
    ("name-twice", _parts("  - {name: a, pkey: 1, members: [h0]}\n  - {name: a, pkey: 2, members: [h1]}\n"),
     "x.yaml:10 partitions[1].name: partition 'a' is named twice (first at line 9)"),
    ("member-twice", _parts("  - name: a\n    pkey: 1\n    members: [h0, {host: h0, membership: limited}]\n"),
     "x.yaml:11 partitions[0].members[1]: member h0 is named twice (first at line 11)"),
    ("unknown-host", _parts("  - {name: a, pkey: 1, members: [h9]}\n"),
     "x.yaml:9 partitions[0].members[0]: "),
    ("bad-membership", _parts("  - {name: a, pkey: 1, members: [{host: h0, membership: half}]}\n"),
     "x.yaml:9 partitions[0].members[0].membership: "),
    ("bad-enforce", _parts("  - {name: a, pkey: 1, members: ALL, enforce: sometimes}\n"),
     "x.yaml:9 partitions[0].enforce: "),
    ("no-members", _parts("  - {name: a, pkey: 1, members: []}\n"),
     "x.yaml:9 partitions[0].members: a partition needs members (a list of hosts, or ALL)"),
    ("missing-pkey", _parts("  - {name: a, members: ALL}\n"),
     "x.yaml:9 partitions[0]: missing required key 'pkey'"),
    ("overflow", _parts("".join(f"  - {{name: p{i}, pkey: {i + 1}, members: ALL}}\n" for i in range(32))),
     "x.yaml:9 partitions: P_Key table overflow: host h0 is in 32 partitions; a switch port facing it holds 32 "
     "P_Keys, the default one included"),
    ("opensm-modes", T + "sm: {impl: opensm}\npartitions:\n  - {name: a, pkey: 1, members: ALL}\n"
     "  - {name: b, pkey: 2, members: [h0], enforce: in}\n",
     "x.yaml:10 partitions: OpenSM enforces partitions one way for the subnet (part_enforce); these ask for "
     "both, in: give every partition the same enforce, or use sm.impl: ibemu"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_partitions(text: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, "x.yaml", tmp_path)
    assert info.value.problems[0].startswith(expected), info.value.problems


def test_partitions_reach_ibemus_sm(tmp_path: Path) -> None:
    scen = loads_scenario(_parts(
        "  - name: storage\n    pkey: 0x0010\n    members: [h0, {host: h2, membership: limited}]\n"
        "    enforce: in\n"
        "  - {name: everyone, pkey: 0x20, members: ALL, membership: limited}\n"), "x.yaml", tmp_path)
    a, b = scen.partitions
    assert (a.name, a.pkey, a.members, a.enforce) == ("storage", 0x10, (("h0", True), ("h2", False)), "in")
    assert b.everyone and not b.everyone_full and b.enforce == "both"
    req = fabric_request(scen)
    write_spec(tmp_path / "run", "r1", req)  # what the daemon of `ibemu up` reads
    text = request_from_spec(read_spec(tmp_path / "run")).sm_partitions
    assert text == req.sm_partitions
    args = parse_args(["--ns", "x", "--partitions", text])
    parts = SmPartitions.from_json(args.partitions)
    g = {n.name: n.guid for n in scen.topology.cas()}
    assert parts.table(g["h0"]) == [0xFFFF, 0x8010, 0x0020]
    assert parts.table(g["h2"]) == [0xFFFF, 0x0010, 0x0020]
    assert parts.table(g["h1"]) == [0xFFFF, 0x0020]
    assert parts.enforcement(g["h0"]) == 12 and parts.enforcement(g["h1"]) == 12


def test_no_partitions_nothing_for_the_sm(tmp_path: Path) -> None:
    assert not fabric_request(loads_scenario(T, "x.yaml", tmp_path)).sm_partitions


def test_opensm_gets_a_partitions_conf(tmp_path: Path) -> None:
    scen = loads_scenario(T + "sm: {impl: opensm}\npartitions:\n"
                          "  - {name: storage, pkey: 0x10, members: [h0, {host: h2, membership: limited}], enforce: out}\n"
                          "  - {name: all, pkey: 0x20, members: ALL, membership: limited, enforce: out}\n",
                          "x.yaml", tmp_path)
    parts = SmPartitions.from_json(fabric_request(scen).sm_partitions)
    topo = scen.topology
    guids = {n.guid: [n.port_guid(1)] for n in topo.cas()}
    text = opensm.partitions_conf(parts, guids)
    h0, h2 = topo.node("h0").port_guid(1), topo.node("h2").port_guid(1)
    assert text.splitlines()[1:] == ["Default=0x7fff : ALL=full ;",
                                     f"storage=0x0010 : {h0:#018x}=full, {h2:#018x}=limited ;",
                                     "all=0x0020 : ALL=limited ;"]
    assert opensm.part_enforce(parts) == "out"
    conf = opensm.write_config(tmp_path, None, parts)
    assert Path(conf).read_text() == "part_enforce out\n"
    assert opensm.write_config(tmp_path, None, None) == "/dev/null"
