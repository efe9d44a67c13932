#!/usr/bin/env python3
"""The RoCE user datapath (``fabric: {kind: roce, datapath: user}``) on a live k=4 fat-tree.

- forwarding rate: four hosts blast RoCEv2 frames (1 KiB, 64 QPs' UDP source ports each) at
  hosts of other pods for 2 s, no line rate: router hops forwarded per second, all routers
  together (one process forwards for all 20), and what the routers dropped or lost;
- one flow at a line rate: one RC QP of 64 KiB WRITEs h0 -> h15 (five routers) at 0.05, 0.1
  and 0.2 Gb/s, without and with PFC: the throughput it gets against the rate configured
  (the hosts have no rate: the first router's queue holds the sender to it, by drops and
  go-back-N, or by pausing it);
- incast with PFC on and off: ``scenarios/roce-pfc-hol.yaml`` (three senders into h0 at
  0.1 Gb/s, a victim h6 -> h1 sharing the cables into edge0_0) run twice through the scenario
  runner: the victim's and the incast's throughput, the routers' pause frames, the time their
  queues were paused, drops, and the hosts' pauses;
- delay accuracy: write_lat h0 -> h1 (one router, two cables each way) with delay_us 0, 250,
  1000 and 4000: the half round trip it adds against the two cables' delay.

Run: sudo .venv/bin/python benchmarks/bench_roce_user.py [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from ibemu.fabric.roce_fabric import RoceRun
from ibemu.kernel import ownership
from ibemu.roce.queues import QueueConfig
from ibemu.scenario import load_scenario
from ibemu.scenario.runner import ScenarioRun
from ibemu.topo import generate
from ibemu.traffic.perftest import LatResult, PerfOptions, run_local
from ibemu.wire import fast

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench_roce_user")


def up(queues: QueueConfig) -> RoceRun:
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-roce-user")
    state.save()
    return RoceRun.up(generate("fat-tree", k=4), state, queues=queues)



def fresh_counters(run: RoceRun, after_ns: int) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        c = run.live_counters()
        if c.get("t_ns", 0) > after_ns:
            return c
        time.sleep(0.05)
    return run.live_counters()


# ------------------------------------------------------------------ forwarding rate

def forwarding_rate(seconds: float) -> dict[str, float]:
    run = up(QueueConfig())
    try:
        pairs = [("h0", "h15"), ("h4", "h11"), ("h8", "h3"), ("h12", "h7")]
        senders = []
        for src, dst in pairs:
            port = run.open_port(src)
            lid = run.fab.host_port(dst).lid
            frames = [port.codec.encapsulate(fast.NativeTemplate(slid=port.hca.lid, dlid=lid, destqp=0x100 + q)
                                             .packet(0x04, 1, bytes(1024))) for q in range(64)]
            senders.append((port, [f for f in frames if f is not None]))
        before = fresh_counters(run, time.monotonic_ns())["totals"]
        t0 = time.monotonic()
        sent = 0
        while time.monotonic() - t0 < seconds:
            for port, frames in senders:
                for f in frames[:16]:
                    try:
                        port.sock.send(f)
                        sent += 1
                    except OSError:
                        pass
                frames.append(frames.pop(0))
            time.sleep(0.0005)  # let the sockets drain: the forwarder's rate, not the queues'
        elapsed = time.monotonic() - t0
        time.sleep(0.3)
        after = fresh_counters(run, time.monotonic_ns())["totals"]
        for port, _ in senders:
            port.close()
        d = {k: after.get(k, 0) - before.get(k, 0) for k in ("forwarded", "rx_frames", "dropped", "tx_errors")}
        return {"sent_per_s": sent / elapsed, "hops_per_s": d["forwarded"] / elapsed,
                "e2e_per_s": d["forwarded"] / 5 / elapsed, "sent": sent, "dropped": d["dropped"],
                "tx_errors": d["tx_errors"]}
    finally:
        run.down()


# ------------------------------------------------------------------ one flow at a line rate

def _write_bw(run: RoceRun, src: str, dst: str, opts: PerfOptions) -> Any:
    a, b = run.open_port(src), run.open_port(dst)

    async def main() -> Any:
        async with trio.open_nursery() as n:
            await n.start(a.serve)
            await n.start(b.serve)
            with trio.fail_after(120):
                r = await run_local(a, b, opts)
            n.cancel_scope.cancel()
            return r

    try:
        return trio.run(main)
    finally:
        a.close()
        b.close()


def line_rate(gbps: float, iters: int, pfc: bool) -> dict[str, float]:
    run = up(QueueConfig(line_gbps=gbps, buffer_kb=512, pfc=frozenset({3}) if pfc else frozenset()))
    try:
        r = _write_bw(run, "h0", "h15", PerfOptions(test="write_bw", size=65536, iterations=iters, qps=1,
                                                     timeout=16))
        c = fresh_counters(run, time.monotonic_ns())["totals"]
        return {"gbps": r.gbps, "retx": r.retransmitted, "dropped": c.get("dropped", 0),
                "pauses": c.get("pause_sent", 0)}
    finally:
        run.down()


# ------------------------------------------------------------------ incast, PFC on / off

def incast(pfc: bool, seconds: float, out: Path) -> dict[str, Any]:
    scen = load_scenario(ROOT / "scenarios" / "roce-pfc-hol.yaml")
    scen = dataclasses.replace(scen, faults=(), duration_s=seconds,
                               fabric=dataclasses.replace(scen.fabric, pfc=(3,) if pfc else ()))
    result = trio.run(ScenarioRun(scen, out / ("pfc-on" if pfc else "pfc-off"), progress=lambda *_: None).run)
    flows = {t["name"]: t for t in result["traffic"]}
    ex = flows["incast"]["extra"]
    return {"victim_gbps": flows["victim"]["gbps"], "incast_gbps": flows["incast"]["gbps"],
            "pause_sent": ex.get("router_pause_sent", 0), "pause_received": ex.get("router_pause_received", 0),
            "paused_ms": ex.get("router_paused_us", 0) / 1000, "dropped": ex.get("router_dropped", 0),
            "host_pauses": ex.get("pfc_pause_received", 0) + flows["victim"]["extra"].get("pfc_pause_received", 0)}


# ------------------------------------------------------------------ delay accuracy

def half_rtt_us(run: RoceRun, iters: int) -> float:
    a, b = run.open_port("h0"), run.open_port("h1")

    async def main() -> LatResult:
        async with trio.open_nursery() as n:
            await n.start(a.serve)
            await n.start(b.serve)
            with trio.fail_after(60):
                r = await run_local(a, b, PerfOptions(test="write_lat", size=64, iterations=iters))
            n.cancel_scope.cancel()
        assert isinstance(r, LatResult)
        return r

    try:
        return statistics.median(trio.run(main).samples_ns) / 1000
    finally:
        a.close()
        b.close()


def delay(delays: list[float], iters: int) -> list[tuple[float, float]]:
    out = []
    for d in delays:
        run = up(QueueConfig(delay_us=d))
        try:
            out.append((d, half_rtt_us(run, iters)))
        finally:
            run.down()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-roce-user-") as tmp:
        ownership.STATE_DIR = Path(tmp) / "state"
        print("RoCE user datapath, k=4 fat-tree (20 routers in one process)")
        f = forwarding_rate(1.0 if args.quick else 2.0)
        print(f"forwarding: {f['hops_per_s']:,.0f} router hops/s aggregate ({f['e2e_per_s']:,.0f} frames/s end to end "
              f"over 5 routers); offered {f['sent_per_s']:,.0f} frames/s, dropped {f['dropped']}, "
              f"send errors {f['tx_errors']}")
        print("one flow h0 -> h15, 1 QP, 64 KiB WRITE, 512 KiB port buffers:")
        print("  PFC  line Gb/s   got Gb/s   retransmitted   router drops   pause frames")
        for on in (False, True):
            for gbps in (0.05, 0.1, 0.2):
                r = line_rate(gbps, 60 if args.quick else 150, on)
                print(f"  {'on ' if on else 'off'}  {gbps:9.2f}   {r['gbps']:8.3f}   {r['retx']:13,d}   "
                      f"{r['dropped']:12,d}   {r['pauses']:12,d}")
        hol = load_scenario(ROOT / "scenarios" / "roce-pfc-hol.yaml")
        print(f"incast h4,h8,h12 -> h0 + victim h6 -> h1, {hol.traffic[0].qps} QPs each, {hol.fabric.line_gbps:g} Gb/s "
              "(scenarios/roce-pfc-hol.yaml); paused: ms summed over router ports")
        print("  PFC   victim Gb/s  incast Gb/s  pauses sent/recv (routers)  paused ms  host pauses  drops")
        for on in (False, True):
            r = incast(on, 4.0 if args.quick else 6.0, Path(tmp))
            print(f"  {'on ' if on else 'off'}   {r['victim_gbps']:11.3f}  {r['incast_gbps']:11.3f}  "
                  f"{r['pause_sent']:>12,d} / {r['pause_received']:<12,d}  {r['paused_ms']:9.0f}  "
                  f"{r['host_pauses']:11,d}  {r['dropped']:6,d}")
        print("delay (h0 -> edge0_0 -> h1, two cables each way), write_lat 64 B, median half round trip:")
        rows = delay([0.0, 250.0, 1000.0, 4000.0], 50 if args.quick else 200)
        base = rows[0][1]
        print("  delay_us   configured added us   measured added us   half RTT us")
        for d, lat in rows:
            print(f"  {d:8.0f}   {2 * d:19.0f}   {lat - base:17.0f}   {lat:11.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
