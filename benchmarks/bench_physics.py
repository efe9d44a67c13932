"""Link physics figures: the model (ibemu/physics) driven by its reference event simulator.

Run: ``.venv/bin/python benchmarks/bench_physics.py``. Every figure is the model's, in
emulated time, printed beside the analytic expectation (``ibemu.physics.expect``); none comes
from the live datapath yet (the forwarders do not drive the model). The wall time each case
took is the simulator's own cost, shown last.
"""

from __future__ import annotations

import statistics
import time

from ibemu.physics import expect
from ibemu.physics.link import LinkModel, default_switch_model
from ibemu.physics.model import EthConfig, IbPortConfig, Kind
from ibemu.physics.sim import Flow, Simulator
from ibemu.testing.physics import fabric_sim
from ibemu.topo.generators import generate
from ibemu.topo.rates import parse_rate

SIZE = 4122  # a 4 KiB RC SEND: LRH 8 + BTH 12 + 4096 + ICRC 4 + VCRC 2
CABLE_M = 2.0


def star(kind: Kind, hosts: int, link: LinkModel, latency: int, *, buffer: int = 32 * 1024,
         eth: EthConfig | None = None) -> Simulator:
    sim = Simulator(kind, lambda sw, f: int(str(f.dst)[1:]) + 1)
    sim.add_switch("s", latency_ns=latency, eth=eth)
    for i in range(hosts):
        sim.add_host(f"h{i}", eth=eth)
        cfg = IbPortConfig(buffer_bytes=buffer) if kind == "ib" else None
        sim.cable(f"h{i}", 1, "s", i + 1, link, ib_a=cfg, ib_b=cfg)
    return sim


def line(name: str, model: str, analytic: str, note: str = "") -> None:
    print(f"  {name:<44} {model:>18}   {analytic:>18}   {note}")


def one_flow() -> None:
    print("One flow, one switch, 4 KiB packets, 2 m cables, 32 KiB per VL (frame bytes / data rate):")
    for rate_name in ("4x EDR", "NDR"):
        rate = parse_rate(rate_name)
        link = LinkModel.of(rate, cable_m=CABLE_M)
        lat = default_switch_model(rate, ethernet=False).latency_ns
        sim = star("ib", 2, link, lat)
        fl = sim.add_flow(Flow("h0", "h1", size=SIZE, frames=5000))
        sim.run(10**10)
        path = expect.path_latency_ns(SIZE, [link, link], [lat])
        want = expect.flow_rate_gbps(SIZE, 5000, link, path)
        line(f"{rate} ({link.gbps:g} Gb/s data, switch {lat} ns)",
             f"{fl.rate_gbps():.2f} Gb/s {fl.rate_gbps() / link.gbps:.2%}",
             f"{want:.2f} Gb/s {want / link.gbps:.2%}", f"drops {sim.drops}")


def incast() -> None:
    print("2:1 incast into one port, 1 KiB frames, 4x EDR / 100GbE, 3,000 frames a sender:")
    rate = parse_rate("4x EDR")
    ib = LinkModel.of(rate, cable_m=CABLE_M)
    sim = star("ib", 3, ib, 90, buffer=16 * 1024)
    flows = [sim.add_flow(Flow(f"h{i}", "h2", size=1024, frames=3000)) for i in range(2)]
    sim.run(10**10)
    share = flows[0].rate_gbps() / (flows[0].rate_gbps() + flows[1].rate_gbps())
    wait = sim.nodes["h0"].ports[1].counters.xmit_wait_ns
    line("IB: sender shares", f"{share:.1%} / {1 - share:.1%}", "50.0% / 50.0%",
         f"drops {sim.drops}; PortXmitWait h0 {wait / 1000:.1f} us")
    eth_link = LinkModel.of(rate, cable_m=CABLE_M, ethernet=True)
    for pfc in (False, True):
        cfg = EthConfig(buffer_bytes=64 * 1024, lossless=frozenset({3}) if pfc else frozenset(),
                        xoff_bytes=16 * 1024, xon_bytes=8 * 1024)
        sim = star("eth", 3, eth_link, 500, eth=cfg)
        flows = [sim.add_flow(Flow(f"h{i}", "h2", size=1024, sl=3, frames=3000)) for i in range(2)]
        sim.run(10**10)
        d = [f.delivered for f in flows]
        offered = sum(f.sent for f in flows)
        want = 0 if pfc else expect.incast_drops(2, 3000, 1024, cfg.buffer_bytes)
        line(f"RoCE {'with' if pfc else 'without'} PFC: delivered shares",
             f"{d[0] / sum(d):.1%} / {d[1] / sum(d):.1%}", "50.0% / 50.0%",
             f"drops {sim.drops} of {offered} (analytic {want}), pause frames {sim.pauses}")


def latency() -> None:
    print("Per-hop latency, unloaded, 4 KiB packet, 4x EDR, 2 m cables, line of switches:")
    rate = parse_rate("4x EDR")
    link = LinkModel.of(rate, cable_m=CABLE_M)
    sw = default_switch_model(rate, ethernet=False).latency_ns
    lats = {}
    for n in (1, 3):
        sim = Simulator("ib", lambda s, f: 2)
        for i in range(n):
            sim.add_switch(f"s{i}", latency_ns=sw)
        sim.add_host("a")
        sim.add_host("b")
        sim.cable("a", 1, "s0", 1, link)
        for i in range(n - 1):
            sim.cable(f"s{i}", 2, f"s{i + 1}", 1, link)
        sim.cable(f"s{n - 1}", 2, "b", 1, link)
        for k in range(51):
            sim.add_flow(Flow("a", "b", size=SIZE, frames=1, start_ns=k * 100_000))
        sim.run(10**9)
        lats[n] = statistics.median(x for f in sim.flows for x in f.latencies)
    per_hop = (lats[3] - lats[1]) / 2
    want = expect.hop_latency_ns(SIZE, link, sw)
    line("median per switch hop", f"{per_hop:.0f} ns", f"{want:.0f} ns",
         f"= switch {sw} + serialization {link.frame_ns(SIZE)} + propagation {link.propagation}")
    want3 = expect.path_latency_ns(SIZE, [link] * 4, [sw] * 3)
    line("end to end over 3 switches", f"{lats[3]:.0f} ns", f"{want3:.0f} ns", "store and forward")


def deadlock() -> None:
    print("Ring of 5 switches, 2 hosts each, all-to-all 2 KiB, 4 KiB per VL, 4x EDR:")
    for engine in ("minhop", "updn"):
        topo = generate("ring", switches=5, hosts_per_switch=2)
        sim, lids = fabric_sim(topo, engine, buffer_bytes=4096)
        hosts = sorted(lids)
        for s in hosts:
            for d in hosts:
                if s != d:
                    sim.add_flow(Flow(s, lids[d], size=2048, backlog=1))
        loops = sim.run(500_000, check_deadlock_ns=20_000, stall_ns=20_000)
        delivered = sum(f.delivered for f in sim.flows)
        expected = "credit loop" if engine == "minhop" else "no loop"
        model = f"{len(loops)} loop(s)" if loops else "no loop"
        line(f"{engine}: after {sim.now / 1000:.0f} us", model, expected, f"{delivered} frames delivered, drops {sim.drops}")
        for lp in loops:
            print(f"    {lp.describe()}")
    topo = generate("fat-tree", k=4)
    sim, lids = fabric_sim(topo, "ftree", buffer_bytes=4096)
    for s in lids:
        for d in lids:
            if s != d:
                sim.add_flow(Flow(s, lids[d], size=2048, backlog=1))
    loops = sim.run(60_000, check_deadlock_ns=20_000, stall_ns=20_000)
    line("ftree on a k=4 fat-tree, all-to-all, 60 us", f"{len(loops)} loop(s)" if loops else "no loop",
         "no loop", f"{sum(f.delivered for f in sim.flows)} frames delivered")


def main() -> None:
    print("Link physics: the model (ibemu/physics) driven by its reference event simulator, in")
    print("emulated time (the live datapath on the same model: benchmarks/bench_physics_live.py).")
    print(f"  {'figure':<44} {'model':>18}   {'analytic':>18}")
    for case in (one_flow, incast, latency, deadlock):
        t0 = time.perf_counter()
        case()
        print(f"  ({case.__name__}: {time.perf_counter() - t0:.1f} s of simulation on this machine)")


if __name__ == "__main__":
    main()
