"""The model: lookups, interface names, rates, and validate()'s located problems."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibemu.errors import ConfigError
from ibemu.topo.model import Endpoint, NodeKind, Topology, make_guid
from ibemu.topo.names import MAX_NODE_NAME, MAX_PORT, ifname, name_problem, split_ifname
from ibemu.topo.rates import LinkRate, check_mtu, parse_rate


def small() -> Topology:
    t = Topology("t")
    t.add_switch("sw0", 4)
    t.add_switch("sw1", 4)
    t.add_ca("h0")
    t.add_ca("h1", 2)
    t.connect("h0", 1, "sw0", 1)
    t.connect("h1", 1, "sw0", 2)
    t.connect("h1", 2, "sw1", 1)
    t.connect("sw0", 3, "sw1", 3)
    return t


def messages(t: Topology) -> list[str]:
    return [str(p) for p in t.validate()]


def test_lookups() -> None:
    t = small()
    assert t.neighbors("sw0") == [(1, ("h0", 1)), (2, ("h1", 1)), (3, ("sw1", 3))]
    assert t.neighbor_names("h1") == ["sw0", "sw1"]
    assert t.link_at("sw0", 4) is None
    lk = t.link_at("sw1", 3)
    assert lk is not None and str(lk) == "sw0:3-sw1:3"
    assert lk.other("sw1") == Endpoint("sw0", 3)
    assert t.peer("h1", 2) == Endpoint("sw1", 1)
    ports = t.ports("h1")
    assert [p.guid for p in ports] == [t.node("h1").guid + 1, t.node("h1").guid + 2]
    assert ports[1].ifname == "h1-2" and ports[1].peer == ("sw1", 1)
    assert t.by_guid(t.node("sw1").guid) is t.node("sw1")
    assert t.by_guid(12345) is None
    c = t.counts()
    assert (c.nodes, c.switches, c.cas, c.links, c.switch_links, c.cabled_ports) == (
        4,
        2,
        2,
        4,
        1,
        8,
    )
    assert t.validate() == []


def test_guid_scheme() -> None:
    assert make_guid(NodeKind.SWITCH, 0) == 0x0A1BE00100000000
    assert make_guid(NodeKind.CA, 3) == 0x0A1BE00200000030
    t = small()
    assert t.node("h1").guid == make_guid(NodeKind.CA, 1)


def test_ifname_helpers() -> None:
    assert ifname("edge0_0", 3) == "edge0_0-3"
    assert split_ifname("edge0_0-3") == ("edge0_0", 3)
    with pytest.raises(ValueError):
        ifname("a", 0)
    t = small()
    with pytest.raises(ConfigError, match="sw0 has ports 1-4, not port 5"):
        t.ifname("sw0", 5)


@given(
    name=st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,10}", fullmatch=True),
    port=st.integers(1, MAX_PORT),
)
def test_ifname_fits_and_inverts(name: str, port: int) -> None:
    assert name_problem(name) is None
    n = ifname(name, port)
    assert len(n) <= 15
    assert split_ifname(n) == (name, port)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("abcdefghijkl", "node name 'abcdefghijkl' is 12 characters, at most 11"),
        ("0sw", "must start with a letter"),
        ("sw-1", "must start with a letter and use only letters, digits and '_'"),
        ("", "empty node name"),
    ],
)
def test_bad_names(name: str, message: str) -> None:
    t = Topology()
    with pytest.raises(ConfigError, match=message):
        t.add_switch(name, 4)
    assert MAX_NODE_NAME == 11


def test_add_node_rejects_what_it_cannot_represent() -> None:
    t = small()
    with pytest.raises(ConfigError, match="duplicate node name 'sw0'"):
        t.add_switch("sw0", 8)
    with pytest.raises(ConfigError, match=r"ca h9 has 3 ports, expected 1\.\.2"):
        t.add_ca("h9", 3)
    with pytest.raises(ConfigError, match=r"switch s9 has 256 ports, expected 1\.\.255"):
        t.add_switch("s9", 256)


def test_validate_reports_each_problem() -> None:
    t = small()
    t.connect("sw0", 9, "sw1", 2)  # port beyond the count
    t.connect("sw1", 4, "ghost", 1)  # dangling
    t.connect("sw0", 4, "sw0", 4)  # self-link (same port)
    t.connect("sw1", 3, "h0", 1)  # both ports already used
    t.add_link("sw1:2", "sw0:0")  # management port
    t.add_ca("h2", guid=t.node("h1").guid + 2)  # collides with h1's port 2 GUID
    t.add_ca("h3", desc="x" * 65)
    t.connect("h3", 1, "sw1", 3, origin="f.ibnd:7")
    got = messages(t)
    expected_errors = [
        "link sw0:9-sw1:2: sw0:9: no port 9; sw0 has ports 1-4",
        "link sw1:4-ghost:1: dangling port: ghost:1 refers to no node 'ghost'",
        "link sw0:4-sw0:4: self-link sw0:4-sw0:4: a node cannot be cabled to itself",
        "link sw1:2-sw0:0: sw0:0: port 0 is the management port; sw0 has ports 1-4",
        "link sw1:3-h0:1: port sw1:3 is used twice: by sw1:3-h0:1 and by sw0:3-sw1:3",
        "link sw1:3-h0:1: port h0:1 is used twice: by sw1:3-h0:1 and by h0:1-sw0:1",
        "link sw1:2-sw0:0: port sw1:2 is used twice: by sw1:2-sw0:0 and by sw0:9-sw1:2",
        "f.ibnd:7: port sw1:3 is used twice: by h3:1-sw1:3 and by sw0:3-sw1:3",
        f"node h2: duplicate GUID 0x{t.node('h2').guid:016x}: node h2 and port h1:2",
        "node h3: NodeDescription is over 64 bytes",
    ]
    for line in expected_errors:
        assert line in got, (line, got)
    assert all(p.severity == "error" for p in t.validate()[: len(expected_errors)])
    with pytest.raises(ConfigError, match="self-link"):
        t.check()


def test_validate_warnings() -> None:
    t = small()
    t.add_switch("sw2", 2)
    t.add_switch("sw3", 2)
    t.add_ca("h5")
    t.connect("sw2", 1, "sw3", 1)
    warn = [str(p) for p in t.validate() if p.severity == "warning"]
    assert warn == [
        "node h5: ca h5 has no link",
        "topology: fabric is split into 2 disconnected parts: 4 nodes around h0; 2 nodes around sw2",
    ]
    assert t.errors() == []


@pytest.mark.parametrize(
    ("text", "rate", "gbps"),
    [
        ("4x EDR", LinkRate(4, "EDR"), 100),
        ("4xHDR", LinkRate(4, "HDR"), 200),
        ("ndr", LinkRate(4, "NDR"), 400),
        ("100G", LinkRate(4, "EDR"), 100),
        ("56Gbps", LinkRate(4, "FDR"), 56),
        ("25G", LinkRate(1, "EDR"), 25),
        ("300 Gb/s", LinkRate(12, "EDR"), 300),
        (40, LinkRate(4, "QDR"), 40),
        ("12x HDR", LinkRate(12, "HDR"), 600),
    ],
)
def test_parse_rate(text: object, rate: LinkRate, gbps: float) -> None:
    assert parse_rate(text) == rate
    assert rate.gbps == gbps


@pytest.mark.parametrize("text", ["3x EDR", "4x QQR", "33G", "fast", True, None])
def test_parse_rate_rejects(text: object) -> None:
    with pytest.raises(ConfigError, match="rate like"):
        parse_rate(text)


def test_mtu() -> None:
    assert check_mtu(2048) == 2048
    for bad in (1500, 0, "4096", True):
        with pytest.raises(ConfigError, match="expected an IB MTU"):
            check_mtu(bad)


def test_effective_rate_and_graph_key() -> None:
    a, b = small(), small()
    assert a.graph_key() == b.graph_key()
    b.links[0].rate = LinkRate(4, "HDR")
    assert a.graph_key() != b.graph_key()
    a.links[0].rate = LinkRate(4, "EDR")  # explicit default == implicit default
    assert a.graph_key() == small().graph_key()
    g = a.to_networkx()
    assert g.number_of_nodes() == 4 and g.number_of_edges() == 4
