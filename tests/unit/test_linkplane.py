"""The IB user datapath's link-model adapter (``fabric.linkplane``) without sockets: what it
puts into the agents' PMA counters, the fabric log and the lag log."""

from __future__ import annotations

from typing import Any

from ibemu.events import Kind
from ibemu.fabric.linkplane import LinkPlane, link_record, match_key
from ibemu.physics.deadlock import find_credit_loops
from ibemu.physics.link import SWITCH_MODELS
from ibemu.physics.live import LinkStats
from ibemu.physics.sim import Flow
from ibemu.testing.physics import fabric_sim
from ibemu.topo.generators import generate


class Log:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any]]] = []

    def write(self, node: str, rec: dict[str, Any]) -> None:
        self.records.append((node, rec))


def plane_of(nodes: dict[str, Any], log: Log, counts: list[tuple[str, int, dict[str, int]]]) -> LinkPlane:
    return LinkPlane(nodes, SWITCH_MODELS["ib-edr"], sockets=lambda n, p: None, heads=lambda n, p: b"",
                     powered=lambda n: True, events=log,  # type: ignore[arg-type]
                     counts=lambda n, p, d: counts.append((n, p, d)))


def test_a_credit_loop_is_logged_once_with_its_ports_and_vls_and_xmit_wait_reaches_the_pma() -> None:
    sim, lids = fabric_sim(generate("ring", switches=5, hosts_per_switch=2), "minhop", buffer_bytes=4096)
    hosts = sorted(lids)
    for s in hosts:
        for d in hosts:
            if s != d:
                sim.add_flow(Flow(s, lids[d], size=2048, backlog=1))
    assert sim.run(300_000, check_deadlock_ns=20_000, stall_ns=20_000)  # deadlocked
    sim.run(sim.now + 2_000_000)  # stuck for long enough for the live plane's 1 ms
    log, counts = Log(), []
    lp = plane_of(sim.nodes, log, counts)
    lp.plane.now = sim.now
    try:
        lp.check_loops()
        lp.check_loops()
        loops = [r for _, r in log.records if r["kind"] == Kind.CREDIT_LOOP]
        assert len(loops) == 1
        hops = loops[0]["hops"]
        assert {h["switch"] for h in hops} == {f"sw{i}" for i in range(5)} and {h["vl"] for h in hops} == {0}
        assert loops[0]["stalled_us"] >= 1000
        assert len(find_credit_loops(sim.nodes, sim.now, 1_000_000)) == 1
        # the waits end when a frame goes; the stuck ports' past waits are counted already
        for node in sim.nodes.values():
            for p in node.ports.values():
                p.counters.xmit_wait_ns += 10_000  # as if each had waited 10 us more
        lp.push_counters()
        waits = {(n, p): d["port_xmit_wait"] for n, p, d in counts if "port_xmit_wait" in d}
        # switch ports only, 10 us at 4x EDR (4 bytes = 0.32 ns a tick) and more
        assert waits and all(n.startswith("sw") for n, _ in waits)
        assert min(waits.values()) >= 10_000 / 0.32 - 1
        counts.clear()
        lp.push_counters()
        assert counts == []  # nothing new: nothing pushed
    finally:
        lp.close()


def test_link_records_carry_the_late_departures_and_the_busy_times() -> None:
    st = LinkStats(100.0, frames=3, bytes=3 * 4138, late_ns=[0, 500, 2_500], busy_model_ns=662,
                   busy_real_ns=700)
    rec = link_record("sw0:2", st, 123)
    assert rec["kind"] == Kind.LINK_FIDELITY and rec["link"] == "sw0:2" and rec["since_ns"] == 123
    assert rec["samples"] == 3 and rec["max_us"] == 2.5 and rec["busy_model_ns"] == 662
    assert match_key(bytes(14) + bytes([0xF0, 0x10]) + bytes(range(40))) == bytes(range(18))


class QosAgent:
    """What ``sync_qos`` reads of a device agent: two data VLs, SL n -> VL n % 2."""

    def __init__(self, vls: int) -> None:
        self.vls, self.sets = vls, 0

    def qos_version(self) -> tuple[int, ...]:
        return (self.sets, self.vls)

    def data_vls(self, port: int) -> int:
        return self.vls

    def vl_arbitration(self, port: int) -> Any:
        from ibemu.physics.qos import VlArb
        return VlArb.default(self.vls)

    def sl2vl_map(self, in_port: int, out_port: int) -> Any:
        from ibemu.physics.qos import Sl2Vl
        return Sl2Vl(tuple(sl % self.vls for sl in range(16)))


def test_the_qos_the_sm_programmed_reaches_the_model_once_per_change() -> None:
    from ibemu.physics.model import Frame
    from ibemu.physics.plan import build_nodes

    nodes = build_nodes(generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1), kind="ib",
                        switch=SWITCH_MODELS["ib-edr"])
    log, counts = Log(), []
    lp = plane_of(nodes, log, counts)
    try:
        agents = {n: QosAgent(2) for n in nodes}
        assert lp.sync_qos(agents) == len(nodes)
        assert lp.sync_qos(agents) == 0  # nothing changed since
        up = nodes["leaf0"].ports[2]
        full = SWITCH_MODELS["ib-edr"].buffer_bytes // 64
        assert up.vls == 2 and up.credits[1] == full and up.credits[2] == 0
        lp.plane.arrive("leaf0", 1, Frame(4138, sl=1, dst=2, flow=b"k"), 0)
        lp.plane.run(10**6)
        assert up.credits[1] == full - 65 and up.credits[0] == full  # SL1 went on VL1
    finally:
        lp.close()


def test_the_report_goes_in_pieces_with_the_records_of_one_report(tmp_path: Any) -> None:
    """``tick_steps`` yields between the QoS tables, the counters, the credit loops and each
    piece of the link report (``report_parts``, 16 ports a piece), so the agent host's ticker
    can give its loop a checkpoint between them; the pieces write, in order, the records the
    report in one piece writes, in one interval."""
    from ibemu import clock
    from ibemu.events import read_events

    sim, _lids = fabric_sim(generate("fat-tree", k=4), "minhop")
    log, counts = Log(), []
    lp = plane_of(sim.nodes, log, counts)
    try:
        keys = sorted(lp.plane.stats)
        assert len(keys) > 32  # more than two pieces
        for i, key in enumerate(keys):  # every port sent i + 1 frames since the last report
            lp.plane.stats[key] = LinkStats(100.0, frames=i + 1, bytes=100 * (i + 1), late_ns=[i * 10])
        lp.lag_log = str(tmp_path / "one.jsonl")
        one = lp.report_links()
        for i, key in enumerate(keys):
            lp.plane.stats[key] = LinkStats(100.0, frames=i + 1, bytes=100 * (i + 1), late_ns=[i * 10])
        lp.lag_log = str(tmp_path / "pieces.jsonl")
        lp._last_report = clock.monotonic() - 10.0  # a report is due
        steps = sum(1 for _ in lp.tick_steps({}))
        assert steps == 2 + -(-len(keys) // 16)  # QoS, counters; then a yield before each piece
        pieces = read_events(tmp_path / "pieces.jsonl")
        strip = ("t_ns", "since_ns")
        assert [{k: v for k, v in r.items() if k not in strip} for r in pieces] == \
               [{k: v for k, v in r.items() if k not in strip} for r in one]
        assert len({r["since_ns"] for r in pieces}) == 1 and len(pieces) == len(keys)
    finally:
        lp.close()
