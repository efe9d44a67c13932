"""OpenSM's dump files from OpenSM and from ibemu's SM for the same live k=4 fat-tree, diffed.

The unmodified OpenSM brings the fabric up first (``-D 0x47``: its VERBOSE and ROUTING log
flags make it write ``opensm-subnet.lst`` and ``opensm-lfts.dump``; ``guid2lid`` is its
cache) and is stopped; ibemu's SM (``--dump-dir``) then takes the same fabric over. Its LIDs
come from the same place (ports keep the LIDs they carry), so the files must agree on
everything but the routes: subnet.lst byte for byte, guid2lid as a mapping, every switch's
LFT covering the same LIDs, and every entry of both tables leading to its LID.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibemu.fabric import ibemusm, opensm
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.fabric.umad2sim import umad2sim_path
from ibemu.kernel import ownership
from ibemu.sm import dumps
from ibemu.topo import generate
from tests.integration.live import Running, fabric_in_thread

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(umad2sim_path() is None, reason="libumad2sim.so missing (apt-get install ibsim-utils)"),
    pytest.mark.skipif(not opensm.opensm_available(), reason="opensm missing (apt-get install opensm)"),
]

ENGINE = "minhop"  # both SMs have it; on ties they may pick different ports (real differences)


def wait_files(d: Path, names: tuple[str, ...], timeout_s: float = 20.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while not all((d / n).exists() and (d / n).stat().st_size for n in names):
        assert time.monotonic() < deadline, f"no {names} in {d}: {sorted(p.name for p in d.iterdir())}"
        time.sleep(0.05)
    return {n: (d / n).read_text() for n in names}


class Dumps:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.topo = generate("fat-tree", k=4)
        self.state = ownership.RunState(ownership.new_run_id(), scenario="pytest-sm-dumps")
        self.rt = FabricRuntime(self.topo, make_agents=make_agents, state=self.state, run_dir=tmp)
        self.osm: dict[str, str] = {}
        self.ours: dict[str, str] = {}
        self.ours_dir = tmp / "ibemu"
        self.live: Running | None = None


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dumps]:
    tmp = tmp_path_factory.mktemp("sm-dumps")
    d = Dumps(tmp)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ownership, "STATE_DIR", tmp / "state")
        with fabric_in_thread(d.rt) as live:
            d.live = live
            ns = d.rt.plan.nodes["h0"].ns
            osm_dir = tmp / "opensm"
            proc = opensm.start(ns, osm_dir, engine=ENGINE, extra=["-D", "0x47"])
            try:
                opensm.wait_subnet_up(proc, osm_dir)
                d.osm = wait_files(osm_dir, dumps.FILES)
            finally:
                opensm.stop(proc)
            sm = ibemusm.start(ns, d.ours_dir, engine=ENGINE, extra=["--sweep-interval", "1"])
            try:
                ibemusm.wait_subnet_up(sm, d.ours_dir)
                d.ours = wait_files(d.ours_dir, dumps.FILES)
                yield d
            finally:
                opensm.stop(sm)


def test_subnet_lst_and_guid2lid_agree_with_opensms(both: Dumps) -> None:
    osm, ours = dumps.parse_subnet_lst(both.osm[dumps.SUBNET_LST]), dumps.parse_subnet_lst(both.ours[dumps.SUBNET_LST])
    assert len(osm) == len(ours) == 96  # 48 cables, each from both ends
    assert both.ours[dumps.SUBNET_LST] == both.osm[dumps.SUBNET_LST]  # same order, fields, LIDs, SM flag
    g2l = dumps.parse_guid2lid(both.osm[dumps.GUID2LID])
    assert dumps.parse_guid2lid(both.ours[dumps.GUID2LID]) == g2l and len(g2l) == 36
    topo_guids = {n.guid for n in both.topo.nodes.values() if n.is_switch}
    topo_guids |= {n.guid + 1 for n in both.topo.nodes.values() if not n.is_switch}  # CA port GUIDs
    assert set(g2l) == topo_guids


def test_lfts_cover_the_same_lids_and_every_entry_of_both_reaches_its_lid(both: Dumps) -> None:
    links = dumps.parse_subnet_lst(both.osm[dumps.SUBNET_LST])
    osm, ours = dumps.parse_lfts(both.osm[dumps.LFTS_DUMP]), dumps.parse_lfts(both.ours[dumps.LFTS_DUMP])
    assert set(osm) == set(ours) and len(osm) == 20
    same = total = 0
    for guid, table in osm.items():
        mine = ours[guid]
        assert (mine.lid, mine.desc, mine.top) == (table.lid, table.desc, table.top)
        assert set(mine.ports) == set(table.ports) and len(table.ports) == 36
        same += sum(mine.ports[lid] == port for lid, port in table.ports.items())
        total += len(table.ports)
    for tables in (osm, ours):
        walk_all(links, tables)
    print(f"LFT entries equal in OpenSM's and ibemu's {ENGINE}: {same} of {total}")
    assert same >= total // 2  # the same engine: most entries agree (the rest are ties broken otherwise)


def test_a_cut_cable_rewrites_ibemus_files(both: Dumps) -> None:
    assert both.live is not None and both.rt.fabric is not None
    events = both.ours_dir / "events.jsonl"
    written = sum(1 for line in events.read_text().splitlines() if '"dumps_written"' in line)
    ns, ifname = both.rt.plan.nodes["edge1_0"].ns, both.topo.ifname("edge1_0", 3)
    both.rt.fabric.links.set_up(ns, ifname, False)
    try:
        deadline = time.monotonic() + 20
        while True:
            records = [json.loads(x) for x in events.read_text().splitlines() if '"dumps_written"' in x]
            if len(records) > written:
                break
            assert time.monotonic() < deadline, "the SM wrote no dump after the reroute"
            time.sleep(0.05)
        links = dumps.parse_subnet_lst((both.ours_dir / dumps.SUBNET_LST).read_text())
        assert len(links) == 94
        walk_all(links, dumps.parse_lfts((both.ours_dir / dumps.LFTS_DUMP).read_text()))
    finally:
        both.rt.fabric.links.set_up(ns, ifname, True)


def walk_all(links: list[dumps.LstLink], tables: dict[int, dumps.SwitchLft]) -> None:
    """Every entry of every table, followed hop by hop over the cables of ``links``, ends at
    the port owning its LID (port 0: the switch itself)."""
    cable = {(x.local.node_guid, x.local.port): x.far for x in links}
    for sw in tables.values():
        for lid, out in sw.ports.items():
            guid, hops = sw.guid, 0
            while out != 0:
                far = cable[(guid, out)]
                if far.kind != "SW":
                    assert far.lid == lid, f"{sw.desc}: LID {lid} ends at {far.desc}"
                    break
                guid, hops = far.node_guid, hops + 1
                out = tables[guid].ports[lid]
                assert hops < 8, f"{sw.desc}: LID {lid} loops"
            else:
                assert tables[guid].lid == lid, f"{sw.desc}: LID {lid} ends at switch {tables[guid].desc}"
