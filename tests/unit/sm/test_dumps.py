"""OpenSM's dump files from ibemu's SM state (``ibemu.sm.dumps``): formats, order, the writer."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from ibemu.agents.switch import SwitchAgent
from ibemu.sm import dumps
from ibemu.sm.graph import NodeType, SmNode, SmPort, SubnetGraph
from ibemu.sm.manager import SmConfig, SubnetManager
from ibemu.testing.madport import InMemoryPort
from tests.unit.sm.helpers import fat_tree, minhop, run


async def until(cond: Callable[[], bool], real_s: float = 10.0) -> None:
    """Poll ``cond`` on the mock clock with a real-time limit: the files are written in a
    worker thread, and the autojumping clock races ahead while the loop waits for it (a
    mock-time limit expired before the thread had run, one run in three)."""
    deadline = time.monotonic() + real_s
    while not cond():
        assert time.monotonic() < deadline, "not within the real-time limit"
        await trio.sleep(0.01)

# Lines the real OpenSM (3.3.x, Debian 12) wrote for a k=4 fat-tree of ibemu (facts, for the format)
OSM_LST_LINE = ("{ SW Ports:04 SystemGUID:0a1be00100000000 NodeGUID:0a1be00100000000 PortGUID:0a1be00100000000 "
                "VenID:0A1BE0 DevID:B001 Rev:00000000 {ibemu core0} LID:0002 PN:01 } "
                "{ SW Ports:04 SystemGUID:0a1be00100000040 NodeGUID:0a1be00100000040 PortGUID:0a1be00100000040 "
                "VenID:000A1BE0 DevID:B0010000 Rev:00000000 {ibemu agg0_0} LID:000D PN:03 } PHY=4x LOG=ACT SPD=25")
OSM_LST_CA = ("{ CA-SM Ports:01 SystemGUID:0a1be00200000000 NodeGUID:0a1be00200000000 PortGUID:0a1be00200000001 "
              "VenID:0A1BE0 DevID:B002 Rev:00000000 {h0 HCA-1} LID:0001 PN:01 } "
              "{ SW Ports:04 SystemGUID:0a1be00100000060 NodeGUID:0a1be00100000060 PortGUID:0a1be00100000060 "
              "VenID:000A1BE0 DevID:B0010000 Rev:00000000 {ibemu edge0_0} LID:0011 PN:01 } PHY=4x LOG=ACT SPD=25")


def port_info(lid: int, sm_lid: int, *, state: int = 4, width: int = 2, ext: int = 2, cap: int = 0x4000) -> bytes:
    pi = bytearray(64)
    struct.pack_into("!HHI", pi, 16, lid, sm_lid, cap)
    pi[31], pi[32], pi[35], pi[62] = width, 0x20 | state, 0x44, ext << 4
    return bytes(pi)


def small_graph() -> tuple[SubnetGraph, dict[tuple[int, int], bytes]]:
    """core0 (LID 2), agg0_0 (LID 13), edge0_0 (LID 17), h0 (LID 1, the SM) as OpenSM saw them."""
    g = SubnetGraph(sm_guid=0x0A1BE00200000000)
    info: dict[tuple[int, int], bytes] = {}
    for guid, desc, lid in ((0x0A1BE00100000000, "ibemu core0", 2), (0x0A1BE00100000040, "ibemu agg0_0", 13),
                            (0x0A1BE00100000060, "ibemu edge0_0", 17)):
        node = g.add(SmNode(guid, NodeType.SWITCH, 4, desc, system_guid=guid, vendor_id=0x0A1BE0, device_id=0xB001))
        for num in range(5):
            node.ports[num] = SmPort(num, guid, lid=lid if num == 0 else 0)
            info[(guid, num)] = port_info(lid if num == 0 else 0, 1)
    h0 = g.add(SmNode(0x0A1BE00200000000, NodeType.CA, 1, "h0 HCA-1", system_guid=0x0A1BE00200000000,
                      vendor_id=0x0A1BE0, device_id=0xB002))
    h0.ports[1] = SmPort(1, 0x0A1BE00200000001, lid=1)
    info[(h0.guid, 1)] = port_info(1, 1)
    g.connect(0x0A1BE00100000000, 1, 0x0A1BE00100000040, 3)
    g.connect(0x0A1BE00100000040, 1, 0x0A1BE00100000060, 3)
    g.connect(h0.guid, 1, 0x0A1BE00100000060, 1)
    return g, info


def test_subnet_lst_lines_are_opensms_field_for_field() -> None:
    g, info = small_graph()
    lines = dumps.subnet_lst(g, info).splitlines()
    assert OSM_LST_LINE in lines and OSM_LST_CA in lines
    assert len(lines) == 6  # 3 cables, each from both ends
    # in OpenSM's map order: GUIDs compared byte-reversed (core0 ...00 first, h0 ...00 00 02 ...)
    firsts = [line.split("NodeGUID:")[1][:16] for line in lines]
    assert firsts == sorted(firsts, key=lambda x: dumps.map_order(int(x, 16)))
    assert firsts[0] == "0a1be00100000000"
    # a port not Active, a width OpenSM has no name for, no extended speeds
    info[(0x0A1BE00100000000, 1)] = port_info(0, 1, state=2, width=3, ext=0, cap=0)
    info[(0x0A1BE00100000000, 0)] = port_info(2, 1, cap=0)
    first = dumps.subnet_lst(g, info).splitlines()[0]
    assert first.endswith("PHY=?? LOG=INI SPD=10")
    parsed = dumps.parse_subnet_lst(dumps.subnet_lst(g, info))
    assert {(link.local.node_guid, link.local.port, link.far.node_guid, link.far.port) for link in parsed} >= {
        (0x0A1BE00100000000, 1, 0x0A1BE00100000040, 3), (0x0A1BE00200000000, 1, 0x0A1BE00100000060, 1)}
    assert [link.local.sm for link in parsed].count(True) == 1


def test_lfts_dump_lists_every_routed_lid_with_its_owner_and_skips_unrouted() -> None:
    g, _info = small_graph()
    core = 0x0A1BE00100000000
    lfts = {core: {1: 1, 2: 0, 13: 1}, 0x0A1BE00100000040: {1: 1, 2: 3, 13: 0, 17: 1}}
    text = dumps.lfts_dump(g, lfts, 17)
    assert text.startswith("Unicast lids [0-17] of switch Lid 2 guid 0x0a1be00100000000 ('ibemu core0'):\n"
                           "0x0001 001 # Channel Adapter portguid 0x0a1be00200000001: 'h0 HCA-1'\n"
                           "0x0002 000 # Switch portguid 0x0a1be00100000000: 'ibemu core0'\n"
                           "0x000d 001 # Switch portguid 0x0a1be00100000040: 'ibemu agg0_0'\n"
                           "17 lids dumped\n")
    assert "0x0011 001 # Switch portguid 0x0a1be00100000060: 'ibemu edge0_0'" in text
    assert "edge0_0'):" not in text  # a switch without routes has no table
    parsed = dumps.parse_lfts(text)
    assert parsed[core].ports == lfts[core] and parsed[core].top == 17 and parsed[core].lid == 2
    # a LID nobody owns, a port past the switch's last
    text = dumps.lfts_dump(g, {core: {5: 2, 6: 9}}, 6)
    assert "0x0005 002 # unknown node and type\n" in text and "0x0006" not in text


def test_guid2lid_is_opensms_cache_format() -> None:
    text = dumps.guid2lid({0x0A1BE00100000090: 0x17, 0x0A1BE00200000081: 0x16, 0x99: 0})
    assert text == "0x0a1be00100000090 0x0017 0x0017\n\n0x0a1be00200000081 0x0016 0x0016\n\n"
    assert dumps.parse_guid2lid(text) == {0x0A1BE00100000090: 0x17, 0x0A1BE00200000081: 0x16}


@pytest.mark.parametrize(("parse", "bad"), [
    (dumps.parse_subnet_lst, "{ SW Ports:04 } nonsense\n"),
    (dumps.parse_lfts, "Unicast lids [0-3] of switch Lid 2 guid 0x01 ('x'):\n0x0001 001 # a\ngarbage\n"),
    (dumps.parse_guid2lid, "0x01 0x0001 0x0001\n\n0x02 zz\n"),
])
def test_parsers_name_the_bad_line(parse, bad: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"line \d+"):
        parse(bad)


def test_the_sm_writes_the_files_after_bring_up_and_after_a_reroute(tmp_path: Path) -> None:
    _topo, fab = fat_tree(4)
    port = InMemoryPort(fab, "h0")
    sm = SubnetManager(port, SmConfig(dump_dir=str(tmp_path / "sm")), route_fn=minhop)  # type: ignore[arg-type]

    async def written(count: int) -> None:
        await until(lambda: sm.stats["dumps"] >= count, 30.0)

    def read() -> tuple[list[dumps.LstLink], dict[int, dumps.SwitchLft], dict[int, int]]:
        d = tmp_path / "sm"
        assert sorted(p.name for p in d.iterdir()) == sorted(dumps.FILES)  # no .tmp left behind
        return (dumps.parse_subnet_lst((d / dumps.SUBNET_LST).read_text()),
                dumps.parse_lfts((d / dumps.LFTS_DUMP).read_text()),
                dumps.parse_guid2lid((d / dumps.GUID2LID).read_text()))

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
            await written(1)
            links, lfts, g2l = read()
            assert len(links) == 96 and {x.state for x in links} == {"ACT"}
            assert len(lfts) == 20 and all(len(t.ports) == 36 and t.top == 36 for t in lfts.values())
            # LIDs as the devices carry them; every LFT entry leads to its LID
            agents = fab.agents
            carried = {a.port_guid(num): p.lid  # type: ignore[attr-defined]
                       for a in agents.values() for num, p in a.ports.items()  # type: ignore[attr-defined]
                       if p.lid and (num == 0 or not isinstance(a, SwitchAgent))}
            assert g2l == carried
            assert_lfts_deliver(links, lfts)
            fab.link_down("edge1_0", 3)
            port.pump()
            for _ in range(5):
                await trio.sleep(0)
            await sm.step()
            await written(2)
            links2, lfts2, _ = read()
            assert len(links2) == 94 and lfts2 != lfts
            assert_lfts_deliver(links2, lfts2)

    run(main)


def test_the_files_wait_for_a_pass_in_progress(tmp_path: Path) -> None:
    _topo, fab = fat_tree(4)
    sm = SubnetManager(InMemoryPort(fab, "h0"), SmConfig(dump_dir=str(tmp_path)), route_fn=minhop)  # type: ignore[arg-type]

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
            await until(lambda: sm.stats["dumps"] >= 1)
            sm._dirty[sm.graph.switches()[0].guid] = 1  # a trap waits: its pass comes first
            sm._dumps_wake.set()
            await trio.sleep(1.0)
            assert sm.stats["dumps"] == 1
            sm._dirty.clear()
            await until(lambda: sm.stats["dumps"] >= 2)

    run(main)


def test_a_dump_dir_that_fails_costs_the_files_not_the_sm(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    _topo, fab = fat_tree(4)
    sm = SubnetManager(InMemoryPort(fab, "h0"), SmConfig(dump_dir=str(tmp_path / "afile" / "sub")),  # type: ignore[arg-type]
                       route_fn=minhop)

    async def main() -> None:
        async with sm.running():
            assert await sm.full_sweep("cold")
            await until(lambda: bool(sm.stats["dump_errors"]))
            await sm.light_sweep()  # still serving
        assert sm.stats["dumps"] == 0

    run(main)


def assert_lfts_deliver(links: list[dumps.LstLink], lfts: dict[int, dumps.SwitchLft]) -> None:
    """Walk every switch's every entry through the cables of the subnet.lst: it must end at
    the node owning the LID (the switch itself for port 0)."""
    cable = {(x.local.node_guid, x.local.port): x.far for x in links}
    for sw in lfts.values():
        for lid, out in sw.ports.items():
            guid, hops = sw.guid, 0
            while True:
                if out == 0:
                    assert lfts[guid].lid == lid
                    break
                far = cable[(guid, out)]
                if far.kind != "SW":
                    assert far.lid == lid, (hex(sw.guid), lid)
                    break
                guid, hops = far.node_guid, hops + 1
                out = lfts[guid].ports[lid]
                assert hops < 16, "loop"
