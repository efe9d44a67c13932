"""Real RDMA traffic through a live k=4 fabric routed by ibemu's SM: perftest tests byte-checked,
collectives checked element by element, streams, and malformed frames counted, never raised."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.hca.nic import HcaPort
from ibemu.hca.transport.timers import ack_timeout_ns
from ibemu.kernel import ownership
from ibemu.kernel.packet import open_packet_socket
from ibemu.topo import generate
from ibemu.traffic import collectives, perftest, stream
from ibemu.traffic.endpoints import close_ports, host_address, open_ports, query_lid
from ibemu.wire import fast
from tests.integration.live import Running, fabric_in_thread

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("traffic")
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-traffic")
    rt = FabricRuntime(generate("fat-tree", k=4), make_agents=make_agents, state=state, run_dir=tmp,
                       sm="ibemu", sm_engine="ftree")
    with fabric_in_thread(rt) as running:
        yield running


def lids(live: Running) -> dict[str, int]:
    assert live.host is not None
    return {n: live.on_loop(lambda n=n: live.host.nodes[n].agent.lid(1))  # type: ignore[union-attr]
            for n in (f"h{i}" for i in range(16))}


def run_on_ports(live: Running, names: list[str], fn, **open_kw):  # type: ignore[no-untyped-def]
    """Open ``names``' ports, serve them, run ``await fn(ports)``; close them."""
    ids = lids(live)
    ports = open_ports([host_address(live.rt.plan, n, ids[n]) for n in names], **open_kw)

    async def main():  # type: ignore[no-untyped-def]
        async with trio.open_nursery() as nursery:
            for p in ports.values():
                await nursery.start(p.serve)
            with trio.fail_after(60):
                result = await fn(ports)
            nursery.cancel_scope.cancel()
        return result

    try:
        return trio.run(main)
    finally:
        close_ports(ports)


@pytest.mark.parametrize("test", ["write_bw", "read_bw", "send_bw"])
def test_bandwidth_tests_move_every_byte_across_five_switches(live: Running, test: str) -> None:
    opts = perftest.PerfOptions(test=test, size=20000, iterations=300, qps=2, tx_depth=8)

    async def fn(ports: dict[str, HcaPort]):  # type: ignore[no-untyped-def]
        a, b = perftest.Side.create(ports["h1"], opts), perftest.Side.create(ports["h15"], opts)
        for mr in b.mrs:  # distinct contents on the two sides
            mr.buf[:] = os.urandom(mr.length)
        a.connect(b.info())
        b.connect(a.info())
        result = await perftest.run_sides(a, b)
        return a, b, result

    a, b, r = run_on_ports(live, ["h1", "h15"], fn)
    assert isinstance(r, perftest.BwResult)
    assert r.iterations == 300 and r.bytes == 300 * 20000 and r.avg_mibps > 0
    assert r.packets == 300 * 5  # 20,000 B at MTU 4096
    for mine, theirs in zip(a.mrs, b.mrs, strict=True):
        if test == "read_bw":
            assert mine.buf == theirs.buf  # the READs brought the server's bytes
        else:
            assert theirs.buf == mine.buf  # WRITE and SEND delivered the client's bytes
    assert "BW average[MiB/sec]" in perftest.report(r)


@pytest.mark.parametrize("test", ["write_lat", "send_lat"])
def test_latency_ping_pong(live: Running, test: str) -> None:
    opts = perftest.PerfOptions(test=test, size=64, iterations=200)
    r = run_on_ports(live, ["h2", "h9"], lambda ports: perftest.run_local(ports["h2"], ports["h9"], opts))
    assert isinstance(r, perftest.LatResult) and len(r.samples_ns) == 200
    s = r.stats_us()
    assert 0 < s["t_min"] <= s["t_typical"] <= s["p99"] <= s["t_max"]
    assert "t_typical[usec]" in perftest.report(r)


@pytest.mark.parametrize("kind", ["allreduce", "alltoall"])
def test_collectives_over_all_sixteen_hosts_are_exact(live: Running, kind: str) -> None:
    names = [f"h{i}" for i in range(16)]
    r = run_on_ports(live, names, lambda ports: collectives.run_collective(
        kind, [ports[n] for n in names], 64 * 1024, iterations=2))
    assert r.wrong == 0 and r.ranks == 16 and len(r.seconds) == 2
    factor = 2 * 15 / 16 if kind == "allreduce" else 15 / 16
    assert r.busbw_gbs == pytest.approx(r.algbw_gbs * factor)
    assert "busbw" in collectives.nccl_header()


@pytest.mark.parametrize("n", [16, 5])
def test_tree_allreduce_is_exact_piece_by_piece(live: Running, n: int) -> None:
    """A double binary tree (odd n: rank 0 inside both trees), 4 KiB pieces so that several
    follow each other up and down each tree; every element of every rank checked."""
    names = [f"h{i}" for i in range(n)]

    async def fn(ports: dict[str, HcaPort]):  # type: ignore[no-untyped-def]
        g = collectives.CollectiveGroup("allreduce", [ports[x] for x in names], 40 * 1024, algorithm="tree",
                                        tree_chunk=4096)
        times = [await g.run(i) for i in range(2)]
        g.close()
        return g, times

    g, times = run_on_ports(live, names, fn)
    assert g.wrong == 0 and len(times) == 2 and min(times) > 0
    assert min(len(p) for p in g.pieces) > 1
    assert {r.index for r in g.ranks if r.tx} == set(range(n))  # every rank sent


def test_a_jobs_rc_timers_reach_its_qps(live: Running) -> None:
    """``rc_timeout``/``rc_retry_cnt`` (a job's NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT): every QP
    of the group gets them; the sums stay exact."""
    names = ["h0", "h5", "h10"]
    rc = collectives.RcTimers.from_spec({"rc_timeout": 18, "rc_retry_cnt": 3})

    async def fn(ports: dict[str, HcaPort]):  # type: ignore[no-untyped-def]
        g = collectives.CollectiveGroup("allreduce", [ports[x] for x in names], 16 * 1024, rc=rc)
        t = await g.run(0)
        g.close()
        return g, t

    g, t = run_on_ports(live, names, fn)
    qps = [qp for r in g.ranks for qp in (*r.tx.values(), *r.rx.values())]
    assert len(qps) == 6 and g.wrong == 0 and t > 0
    assert {qp.req.timeout_ns for qp in qps} == {ack_timeout_ns(18)} and ack_timeout_ns(rc.timeout) == pytest.approx(1.074e9, rel=1e-3)
    assert {qp.req.retry_cnt for qp in qps} == {3}
    assert collectives.RcTimers.from_spec({}) == collectives.RcTimers(14, 7)  # IBA's 67 ms, 7 retries


def test_a_collective_that_stalls_after_its_flows_stop_is_ended_and_located(live: Running) -> None:
    """A ring whose last rank never runs (its HCA answers, its task is absent): the others
    wait for ever for an immediate, and no QP errs. Once the flow's stop is set, ``stall_bound``
    ends it after ``stall_s`` without a completion and says where each rank waits. A real
    collective that keeps completing after the stop is left to finish."""
    names = ["h0", "h5", "h10"]

    async def fn(ports: dict[str, HcaPort]):  # type: ignore[no-untyped-def]
        g = collectives.CollectiveGroup("allreduce", [ports[x] for x in names], 16 * 1024)
        stop = trio.Event()
        stop.set()
        t0 = trio.current_time()
        with pytest.raises(collectives.CollectiveStalled) as stalled:
            async with collectives.stall_bound([g], stop), trio.open_nursery() as n:
                for r in g.ranks[:-1]:
                    n.start_soon(collectives._ring_allreduce, r, g.ranks, g.count, 0)
        waited = trio.current_time() - t0
        g.close()
        g2 = collectives.CollectiveGroup("allreduce", [ports[x] for x in names], 16 * 1024)
        async with collectives.stall_bound([g2], stop):  # progress after the stop: not cut
            for it in range(3):
                await g2.run(it)
        g2.close()
        return g, str(stalled.value), waited, g2

    g, msg, waited, g2 = run_on_ports(live, names, fn)
    assert g.stall_s == pytest.approx(2 * 8 * ack_timeout_ns(14) / 1e9) and g.stall_s <= waited < 2 * g.stall_s + 1
    assert "rank 0 (LID" in msg and "waits for step 0x0" in msg and "0 sent unacknowledged" in msg, msg
    assert "rank 2 (LID" in msg and "not waiting" in msg.split("rank 2 (LID")[1], msg  # the one that never ran
    assert g2.wrong == 0


@pytest.mark.parametrize("transport", ["rc", "ud"])
def test_streams_record_every_delivery(live: Running, transport: str) -> None:
    opts = stream.StreamOptions(rate_pps=5000, size=128, transport=transport, count=2000)

    async def fn(ports: dict[str, HcaPort]) -> stream.StreamRecord:
        return await stream.Stream(ports["h3"], ports["h12"], opts).run()

    rec = run_on_ports(live, ["h3", "h12"], fn, timestamps=True)
    assert rec.sent == 2000 and rec.delivered == 2000 and rec.lost == 0 and not rec.errors
    assert sorted(rec.recv_seq) == list(range(2000))
    t = list(rec.recv_t_ns)
    assert t == sorted(t) and t[0] >= rec.sent_t_ns[0]  # kernel stamps, on the monotonic clock


def test_processes_sharing_a_host_see_only_their_qps(live: Running) -> None:
    """Two ports on h4's cable with disjoint QP ranges: each transport sees only its frames."""
    ids = lids(live)
    addr = [host_address(live.rt.plan, n, ids[n]) for n in ("h4", "h8")]
    first = open_ports(addr, qpns=(0x100, 0x200))
    second = open_ports(addr, qpns=(0x200, 0x300))
    opts = perftest.PerfOptions(test="send_bw", size=4096, iterations=100)

    async def main() -> tuple[object, object]:
        async with trio.open_nursery() as nursery:
            for p in (*first.values(), *second.values()):
                await nursery.start(p.serve)
            with trio.fail_after(30):
                r1 = await perftest.run_local(first["h4"], first["h8"], opts)
                r2 = await perftest.run_local(second["h8"], second["h4"], opts)
            nursery.cancel_scope.cancel()
        return r1, r2

    try:
        r1, r2 = trio.run(main)
        assert r1.iterations == r2.iterations == 100  # type: ignore[attr-defined]
        for ports in (first, second):
            assert all(p.hca.stats.unknown_qp == 0 for p in ports.values())
    finally:
        close_ports(first)
        close_ports(second)


def test_malformed_frames_are_counted_not_raised(live: Running) -> None:
    """Frames with bad CRCs and garbage reach h6's transport from its edge switch's side."""
    ids = lids(live)
    plan = live.rt.plan
    h6 = plan.nodes["h6"].ports[1]
    edge = plan.nodes[h6.peer_node]
    raw = open_packet_socket(edge.ns, edge.ports[h6.peer_port].ifname)
    opts = perftest.PerfOptions(test="write_bw", size=4096, iterations=200)

    async def fn(ports: dict[str, HcaPort]):  # type: ignore[no-untyped-def]
        eth = fast.ethernet_header(h6.mac, h6.peer_mac)
        good = fast.NativeTemplate(slid=ids["h7"], dlid=ids["h6"], destqp=0x11).packet(0x04, 0, b"x" * 64)
        bad_crc = bytearray(good)
        bad_crc[30] ^= 0xFF
        short = bytearray(good[:24])
        short[1] = (short[1] & ~3) | 2
        for frame in (bad_crc, short, os.urandom(300), good[:-1]):
            raw.send(eth + bytes(frame))
        return await perftest.run_local(ports["h7"], ports["h6"], opts), ports["h6"].hca.stats

    try:
        r, stats = run_on_ports(live, ["h6", "h7"], fn)
    finally:
        raw.close()
    assert r.iterations == 200  # the port kept working
    assert stats.crc_errors >= 1 and stats.malformed >= 2


def test_a_host_learns_its_lid_from_its_mad_socket(live: Running) -> None:
    ids = lids(live)
    assert query_lid(live.rt.plan.nodes["h5"].ns) == ids["h5"] != 0


def test_open_ports_names_unknown_hosts(live: Running, tmp_path: Path) -> None:
    from ibemu.errors import ConfigError

    with pytest.raises(ConfigError, match="no host 'nosuch'"):
        host_address(live.rt.plan, "nosuch", 5)
    with pytest.raises(ConfigError, match="no LID"):
        host_address(live.rt.plan, "h1", 0)
