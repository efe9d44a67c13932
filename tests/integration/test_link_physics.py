"""The IB user datapath times frames by the link model: a flow offered above the cable's rate
arrives at the cable's rate in emulated time, never faster (``fabric.linkplane``).

One switch, two hosts, 4x EDR cables, dilation 1000 (the flow is 3,000 frames/s of real time);
LFTs written into the switch agent (no SM). h0 offers 20% more than the line rate for 1.5 s of
real time from a raw socket; h1's raw socket stamps each frame in the kernel. Achieved rate:
the frames' wire bytes over the emulated time between the receptions of the middle 80%.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ibemu import clock
from ibemu.fabric.agents import make_agents
from ibemu.fabric.runtime import FabricRuntime
from ibemu.kernel import ownership
from ibemu.kernel.packet import kernel_stamp, open_packet_socket, stamp_received
from ibemu.physics.link import LinkModel
from ibemu.testing.livephysics import program
from ibemu.testing.static_routes import assign_lids, minhop_lfts
from ibemu.topo import generate
from ibemu.wire import fast
from tests.integration.live import fabric_in_thread

pytestmark = pytest.mark.root

DILATION = 1000
OFFER = 1.2


def test_a_flow_arrives_at_the_cable_rate_in_emulated_time(state_dir: Path, tmp_path: Path) -> None:
    topo = generate("single-switch", hosts=2)
    lids = assign_lids(topo)
    lfts = minhop_lfts(topo, lids)
    state = ownership.RunState(ownership.new_run_id(), scenario="pytest-link-physics")
    clock.configure(DILATION)
    try:
        rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp_path,
                           mad_sockets=False)
        with fabric_in_thread(rt, emulated_clock=True) as live:
            time.sleep(0.5)  # every carrier seen
            live.on_loop(program, live.host, lids, lfts)
            a, b = rt.plan.nodes["h0"].ports[1], rt.plan.nodes["h1"].ports[1]
            tx = open_packet_socket(rt.plan.nodes["h0"].ns, a.ifname, 0x0003)
            rx = open_packet_socket(rt.plan.nodes["h1"].ns, b.ifname, 0x88B5, buffer_bytes=32 << 20)
            stamp_received(rx)
            tpl = fast.NativeTemplate(slid=lids["h0"], dlid=lids["h1"], destqp=0x100,
                                      eth=fast.ethernet_header(a.peer_mac, a.mac))
            frames = [tpl.packet(0x0A, i, bytes(4096), ext=fast.reth(0, 0, 4096)) for i in range(16)]
            wire = len(frames[0]) - 14 + LinkModel.of(topo.defaults.rate).framing_bytes
            line_gbps = LinkModel.of(topo.defaults.rate).gbps
            per_ms = OFFER * line_gbps * 1e9 / (wire * 8) / DILATION / 1000
            stamps: list[int] = []

            def drain() -> None:
                while True:
                    try:
                        data, anc, _, _ = rx.recvmsg(9216, 64)
                    except BlockingIOError:
                        return
                    if len(data) > 4000 and (t := kernel_stamp(anc)) is not None:
                        stamps.append(t)

            owed, sent, t0 = 0.0, 0, time.perf_counter()
            tick = t0
            while time.perf_counter() - t0 < 1.5:
                owed += per_ms
                while owed >= 1:
                    tx.send(frames[sent % len(frames)])
                    sent += 1
                    owed -= 1
                drain()
                tick += 0.001
                time.sleep(max(0.0, tick - time.perf_counter()))
            end = time.perf_counter() + 1.5
            while time.perf_counter() < end:
                drain()
                time.sleep(0.005)
            offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
            fid = live.on_loop(lambda: live.host.links.report_links(final=True))  # type: ignore[union-attr]
            tx.close()
            rx.close()
    finally:
        clock.configure(1)
    emu = sorted(s - offset for s in stamps)  # real monotonic ns; emulated spans are these / DILATION
    lo, hi = len(emu) // 10, len(emu) * 9 // 10
    window = emu[lo:hi]
    assert len(window) > 500, (len(stamps), sent)
    real_ns = window[-1] - window[0]
    gbps = (len(window) - 1) * wire * 8 / (real_ns / DILATION)
    assert gbps <= line_gbps * 1.005, gbps  # never faster than the cable (20% more was offered)
    assert gbps >= line_gbps * 0.90, gbps  # and close to it (the figure, 97%+, is the benchmark's)
    assert fid and all(r["frames"] for r in fid)
