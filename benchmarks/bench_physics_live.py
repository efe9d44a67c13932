#!/usr/bin/env python3
"""The link model on the live IB user datapath: one flow's rate and the per-hop latency, in
emulated time, against the model's figures (issue 19's first figures, on real frames).

A fabric is built for real (namespaces, veths, the agent host with the switches' forwarders
and ``fabric.linkplane`` in this process, on a clock dilated ``--dilation`` times), its LFTs
written straight into the switch agents (``ibemu.testing.static_routes``; no SM). A child
process in the hosts' namespaces sends valid RDMA WRITE frames (4 KiB payload, correct
ICRC/VCRC) from h0 to h1 on a raw socket and receives them at h1 with kernel receive stamps
(``SO_TIMESTAMPNS``); this process converts the stamps to emulated time.

- **rate**: h0 offers 5% more than the cable's line rate (the excess waits in the HCA's send
  queue the model keeps at the switch's ingress), for ``--seconds`` real seconds; the achieved
  rate is the frames' bytes on the wire (LRH .. VCRC and 2 bytes of framing) over the emulated
  time between the receptions of the middle 70% of them, against the data rate
  (``physics.link.data_gbps``: 4x EDR 100 Gb/s, 4x NDR 400). Target 97% .. 100.5%.
- **latency**: single frames, 20 ms of real time apart, over h0 - leaf0 - spine0 - leaf1 - h1
  (three switches), at ``--latency-dilation``; the median one-way latency (the sender's stamp
  just before its send to the receiver's kernel stamp) against the model's: the host cable's
  serialization, then per switch latency + serialization, and the propagation of four cables.
  The per-hop figure takes the host cable's serialization and propagation off and divides by 3;
  the same over one switch, and the difference of the two paths over 2: a switch hop without
  the fixed real costs at the path's ends (the first switch reads the host's frame when its
  loop gets to it, the receiver's stack), which the difference cancels. Target within 5%. The veth and the switch socket's reading add real time that a high
  dilation makes small in emulated time: that is why this part runs at a higher one.

- **incast** (``--incast``): h0 and h1 each offer 105% of the line rate to h2 through one
  switch, at twice the first dilation (twice the frames); each sender's share of what reached
  h2 (target 50 +- 3%), h2's cable's rate, the model's drops (IB: 0) and how long the
  senders' ports waited for credits.

- **head-of-line blocking** (``--hol``): ``testing.livephysics.hol_topology`` (two leaves,
  one spine; hosts at the first of ``--hol-rates``, leaf-spine cables at the second): the hot
  flow h0 -> h3 and h4 -> h3 share h3's port 2:1, the victim h1 -> h5 shares the hot flow's
  upstream ports only; with the victim on SL0 (the hot flow's VL0), then on SL1 (VL1, from the
  QoS keys of ``HOL_SCENARIO``): each flow's rate, PortXmitWait upstream, the model's
  expectation (``physics.sim`` on the same nodes).
- **deadlock** (``--deadlock``): all-to-all on a ring of 5 under updn, then minhop (and with
  ``--deadlock-fat-tree`` ftree on a k=4 fat-tree): what was delivered, whether it still flowed
  at the end, the credit loop the link plane detected (its ports and VLs, as the result's
  ``credit_loops``), the model's expectation.

Each run prints the link fidelity the agent host judged (``scenario.fidelity.judge_links``).
The 2 cores are shared with other work: the load average is printed.

Run: sudo .venv/bin/python benchmarks/bench_physics_live.py [--rates "4x EDR,4x NDR"]
     [--dilation 500,2000] [--seconds 4] [--latency-dilation 5000] [--skip-latency]
     [--hol [--hol-dilation 20000]] [--deadlock [--deadlock-fat-tree]] [--only]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD = 4096


# ------------------------------------------------------------------ the child: send and receive

def child(spec_path: str) -> None:
    from ibemu.kernel.packet import kernel_stamp, open_packet_socket, stamp_received

    spec = json.loads(Path(spec_path).read_text())
    tx = open_packet_socket(spec["tx_ns"], spec["tx_if"], 0x0003, buffer_bytes=4 << 20)
    tx.setblocking(False)
    rx = open_packet_socket(spec["rx_ns"], spec["rx_if"], spec.get("rx_proto", 0x88B5), buffer_bytes=64 << 20)
    stamp_received(rx)
    rx.settimeout(0.2)
    frames = [bytes.fromhex(f) for f in spec["frames"]]
    extra = []  # incast: more senders, each with its own frames, paced alike
    for x in spec.get("more", []):
        sk = open_packet_socket(x["ns"], x["if"], 0x0003, buffer_bytes=4 << 20)
        sk.setblocking(False)
        extra.append((sk, [bytes.fromhex(f) for f in x["frames"]]))
    got: list[tuple[int, int, int]] = []  # (kernel stamp, length, psn)
    stop = threading.Event()

    def receive() -> None:
        while not stop.is_set():
            try:
                data, anc, _, _ = rx.recvmsg(9216, 64)
            except TimeoutError:
                continue
            except OSError:
                break
            stamp = kernel_stamp(anc) or 0
            psn = int.from_bytes(data[14 + 8 + 9:14 + 8 + 12], "big") if len(data) > 34 else -1
            if spec.get("id_at"):  # incast: who sent it (IB: its SLID; RoCE: its source address)
                lo, hi = spec["id_at"]
                psn = int.from_bytes(data[lo:hi], "big") if len(data) >= hi else -1
            got.append((stamp, len(data), psn))

    th = threading.Thread(target=receive, daemon=True)
    th.start()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()
    sent: list[tuple[int, int]] = []  # latency mode: (monotonic stamp before the send, psn)
    failed = 0
    t0 = time.perf_counter()
    end = t0 + spec["seconds"]
    if spec["mode"] == "rate":
        per_ms = spec["offered"] / 1000.0
        owed, tick, i = 0.0, t0, 0
        n_sent = 0
        while time.perf_counter() < end:
            owed += per_ms
            while owed >= 1:
                try:
                    tx.send(frames[i % len(frames)])
                    n_sent += 1
                except OSError:
                    failed += 1
                for sk, fr in extra:
                    try:
                        sk.send(fr[i % len(fr)])
                        n_sent += 1
                    except OSError:
                        failed += 1
                i += 1
                owed -= 1
            tick += 0.001
            delay = tick - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
    else:
        n_sent = 0
        for i, f in enumerate(frames):
            if time.perf_counter() >= end:
                break
            t = time.monotonic_ns()
            try:
                tx.send(f)
                sent.append((t, i))
            except OSError:
                failed += 1
            time.sleep(spec["gap_s"])
    time.sleep(spec["drain_s"])
    stop.set()
    th.join(2)
    offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()
    sys.stdout.write(json.dumps({"got": got, "sent": sent, "sent_n": n_sent, "failed": failed, "offset": offset}) + "\n")
    sys.stdout.flush()


def run_child(spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    from ibemu.testing.livephysics import child_run

    return child_run([sys.executable, __file__, "--child"], spec, tmp / "spec.json")


# ------------------------------------------------------------------ a live fabric

def live_fabric(topo: Any, tmp: Path, *, engine: str | None = None, switch_model: Any = None):  # type: ignore[no-untyped-def]
    """Build ``topo`` on the user datapath (this process's clock), routes written in (static
    min-hop, or ``engine``'s as ibemu's SM computes them: ``testing.livephysics.routes``);
    ``switch_model``: the switches' latency and buffers (default: by the rate); yields
    (runtime, host, on_loop, lids)."""
    import contextlib

    import trio

    from ibemu import clock
    from ibemu.fabric.agents import make_agents
    from ibemu.fabric.runtime import FabricRuntime
    from ibemu.kernel import ownership
    from ibemu.testing.livephysics import program
    from ibemu.testing.static_routes import assign_lids, minhop_lfts

    @contextlib.contextmanager
    def cm():  # type: ignore[no-untyped-def]
        state = ownership.RunState(ownership.new_run_id(), scenario="bench-physics-live")
        rt = FabricRuntime(topo, make_agents=make_agents, datapath="user", state=state, run_dir=tmp,
                           mad_sockets=False, switch_model=switch_model)
        if engine is not None:
            from ibemu.testing.livephysics import routes
            lids, lfts = routes(topo, engine)
        else:
            lids = assign_lids(topo)
            lfts = minhop_lfts(topo, lids)
        box: dict[str, Any] = {}
        ready = threading.Event()

        async def main() -> None:
            stop = trio.Event()
            box["stop"], box["token"] = stop, trio.lowlevel.current_trio_token()
            async with rt.running() as host:
                box["host"] = host
                await trio.sleep(clock.emulated_s(0.5))  # every carrier seen: ports Init
                program(host, lids, lfts)
                if host.links is not None:  # the agents' QoS (eight VLs from the start) into the model now,
                    # not at the ticker's first report (50 ms of emulated time: minutes of real time here)
                    host.links.sync_qos({name: n.agent for name, n in host.nodes.items()})
                ready.set()
                await stop.wait()

        def thread_main() -> None:
            try:
                trio.run(main, clock=clock.trio_clock())
            except BaseException as exc:
                box["error"] = exc
            finally:
                ready.set()

        th = threading.Thread(target=thread_main, daemon=True)
        th.start()
        try:
            if not ready.wait(120) or "error" in box:
                raise SystemExit(f"fabric did not come up: {box.get('error')}")

            def on_loop(fn: Any, *a: Any) -> Any:
                return trio.from_thread.run_sync(fn, *a, trio_token=box["token"])

            yield rt, box["host"], on_loop, lids
        finally:
            if "stop" in box and "error" not in box:
                trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
            th.join(60)
            if "error" in box:
                import traceback
                traceback.print_exception(box["error"])

    return cm()


def frames_for(rt: Any, lids: dict[str, int], n: int, src: str = "h0", dst: str = "h1") -> list[str]:
    from ibemu.wire import fast

    pp = rt.plan.nodes[src].ports[1]
    eth = fast.ethernet_header(pp.peer_mac, pp.mac)
    tpl = fast.NativeTemplate(slid=lids[src], dlid=lids[dst], destqp=0x100, eth=eth)
    return [tpl.packet(0x0A, i, bytes(PAYLOAD), ext=fast.reth(0, 0, PAYLOAD)).hex() for i in range(n)]


def ends(rt: Any) -> dict[str, str]:
    a, b = rt.plan.nodes["h0"].ports[1], rt.plan.nodes["h1"].ports[1]
    return {"tx_ns": rt.plan.nodes["h0"].ns, "tx_if": a.ifname, "rx_ns": rt.plan.nodes["h1"].ns, "rx_if": b.ifname}


def fidelity_of(host: Any, on_loop: Any) -> dict[str, Any]:
    from ibemu import clock
    from ibemu.scenario.fidelity import judge_links, threshold

    if host.links is None:
        return {"valid": None, "worst_link": None, "worst_busy_pct": None, "worst_late_p99_us": None, "links": {}}
    recs = on_loop(lambda: host.links.report_links(final=True))
    return judge_links(recs, threshold_us=threshold(clock.dilation()).us)  # 2 ms of real time


# ------------------------------------------------------------------ the two figures

def measure_rate(rate_name: str, dilation: float, seconds: float, tmp: Path, switches: int = 1) -> dict[str, Any]:
    from ibemu import clock
    from ibemu.physics.link import LinkModel, data_gbps
    from ibemu.topo import generate
    from ibemu.topo.rates import parse_rate

    clock.configure(dilation)
    rate = parse_rate(rate_name)
    topo = (generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1) if switches == 3
            else generate("single-switch", hosts=2))
    topo.defaults = dataclasses.replace(topo.defaults, rate=rate)
    lm = LinkModel.of(rate)
    with live_fabric(topo, tmp) as (rt, host, on_loop, lids):
        frames = frames_for(rt, lids, 64)
        wire = len(bytes.fromhex(frames[0])) - 14
        line_fps_real = data_gbps(rate) * 1e9 / ((wire + lm.framing_bytes) * 8) / dilation
        on_loop(lambda: host.links.report_links())  # start the fidelity interval here
        out = run_child({**ends(rt), "frames": frames, "mode": "rate", "offered": 1.05 * line_fps_real,
                         "seconds": seconds, "drain_s": 1.0}, tmp)
        fid = fidelity_of(host, on_loop)
        unmatched = host.links.plane.unmatched if host.links else 0
        into_model = host.links.plane.frames_in if host.links else 0
    stamps = sorted(clock.to_emulated_ns(s - out["offset"]) for s, n, _ in out["got"] if n > 1000)
    lo, hi = int(len(stamps) * 0.2), int(len(stamps) * 0.9)
    window = stamps[lo:hi]
    gbps = (len(window) - 1) * (wire + lm.framing_bytes) * 8 / (window[-1] - window[0]) if len(window) > 2 else 0.0
    return {"rate": rate_name, "switches": switches, "dilation": dilation, "line_gbps": data_gbps(rate), "achieved_gbps": gbps,
            "pct": 100 * gbps / data_gbps(rate), "frames": len(stamps), "offered_fps_real": 1.05 * line_fps_real,
            "fidelity": fid, "unmatched": unmatched, "child_sent": out["sent_n"], "child_failed": out["failed"],
            "into_model": into_model}


def measure_incast(rate_name: str, dilation: float, seconds: float, tmp: Path) -> dict[str, Any]:
    """h0 and h1 each offer 105% of the line rate to h2 through one switch (2:1 incast)."""
    from ibemu import clock
    from ibemu.physics.link import LinkModel, data_gbps
    from ibemu.topo import generate
    from ibemu.topo.rates import parse_rate

    clock.configure(dilation)
    rate = parse_rate(rate_name)
    topo = generate("single-switch", hosts=3)
    topo.defaults = dataclasses.replace(topo.defaults, rate=rate)
    lm = LinkModel.of(rate)
    with live_fabric(topo, tmp) as (rt, host, on_loop, lids):
        f0, f1 = frames_for(rt, lids, 16, "h0", "h2"), frames_for(rt, lids, 16, "h1", "h2")
        wire = len(bytes.fromhex(f0[0])) - 14
        line_fps_real = data_gbps(rate) * 1e9 / ((wire + lm.framing_bytes) * 8) / dilation
        on_loop(lambda: host.links.report_links())
        b = rt.plan.nodes["h1"].ports[1]
        spec = {"tx_ns": rt.plan.nodes["h0"].ns, "tx_if": rt.plan.nodes["h0"].ports[1].ifname,
                "rx_ns": rt.plan.nodes["h2"].ns, "rx_if": rt.plan.nodes["h2"].ports[1].ifname, "id_at": [20, 22],
                "frames": f0, "more": [{"ns": rt.plan.nodes["h1"].ns, "if": b.ifname, "frames": f1}],
                "mode": "rate", "offered": 1.05 * line_fps_real, "seconds": seconds, "drain_s": 1.0}
        out = run_child(spec, tmp)
        fid = fidelity_of(host, on_loop)
        plane = host.links.plane
        waits = {n: plane.nodes[n].ports[1].counters.xmit_wait_ns for n in ("h0", "h1")}
        drops = plane.drops
    got = sorted((clock.to_emulated_ns(s - out["offset"]), lid) for s, n, lid in out["got"] if n > 1000)
    lo, hi = int(len(got) * 0.2), int(len(got) * 0.9)
    window = got[lo:hi]
    span = window[-1][0] - window[0][0]
    per = {src: sum(1 for _, lid in window if lid == lids[src]) for src in ("h0", "h1")}
    bits = (wire + lm.framing_bytes) * 8
    return {"rate": rate_name, "dilation": dilation, "line_gbps": data_gbps(rate),
            "total_pct": 100 * (len(window) - 1) * bits / span / data_gbps(rate),
            "share_pct": {k: 100 * v / max(1, len(window)) for k, v in per.items()},
            "model_drops": drops, "fidelity": fid, "host_xmit_wait_us": {k: v / 1000 for k, v in waits.items()},
            "sent": out["sent_n"]}


def measure_latency(dilation: float, n: int, tmp: Path, switches: int = 3) -> dict[str, Any]:
    from ibemu import clock
    from ibemu.physics.link import SWITCH_MODELS, LinkModel
    from ibemu.topo import generate

    clock.configure(dilation)
    topo = (generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1) if switches == 3
            else generate("single-switch", hosts=2))
    lm = LinkModel.of(topo.defaults.rate)
    sw = SWITCH_MODELS["ib-edr"]
    with live_fabric(topo, tmp) as (rt, host, on_loop, lids):
        frames = frames_for(rt, lids, n)
        wire = len(bytes.fromhex(frames[0])) - 14
        out = run_child({**ends(rt), "frames": frames, "mode": "latency", "gap_s": 0.02,
                         "seconds": n * 0.03, "drain_s": 0.5}, tmp)
        fid = fidelity_of(host, on_loop)
        unmatched = host.links.plane.unmatched if host.links else 0
    sent = {psn: clock.to_emulated_ns(t) for t, psn in out["sent"]}
    lat = [clock.to_emulated_ns(s - out["offset"]) - sent[p] for s, ln, p in out["got"] if p in sent and ln > 1000]
    ser = lm.frame_ns(wire)
    prop = lm.propagation
    model = ser + switches * (sw.latency_ns + ser) + (switches + 1) * prop
    med = statistics.median(lat) if lat else float("nan")
    per_hop = (med - ser - prop) / switches
    hop_model = sw.latency_ns + ser + prop
    return {"dilation": dilation, "switches": switches, "samples": len(lat), "median_ns": med, "model_ns": model,
            "p10_ns": sorted(lat)[len(lat) // 10] if lat else None, "p90_ns": sorted(lat)[len(lat) * 9 // 10] if lat else None,
            "per_hop_ns": per_hop, "hop_model_ns": hop_model, "err_pct": 100 * (per_hop - hop_model) / hop_model,
            "fidelity": fid, "unmatched": unmatched}



WRITE_LAT_WIRE = 8 + 12 + 16 + 4 + 2
"""An RDMA WRITE Only packet's bytes on an IB cable without its payload: LRH, BTH, RETH, ICRC, VCRC."""


def measure_write_lat(dilation: float, iterations: int, tmp: Path, size: int = 8) -> dict[str, Any]:
    """perftest's write_lat over three switches (h0 - leaf0 - spine0 - leaf1 - h1) with ibemu's
    RC transport and HCAs in this process, on the dilated clock: the median half round trip
    (perftest's t_typical) against the model's one-way sum for a WRITE of ``size`` bytes (the
    host cable's serialization, then per switch its latency and the next cable's
    serialization, and four cables' propagation). What the two HCAs' software adds (a write
    seen by polling, the answer posted) is ibemu's own CPU cost, shrunk N times in emulated
    time: the dilation keeps it small, not zero."""
    import trio

    from ibemu import clock
    from ibemu.hca.nic import HcaPort
    from ibemu.physics.link import SWITCH_MODELS, LinkModel
    from ibemu.topo import generate
    from ibemu.traffic.perftest import LatResult, PerfOptions, run_local

    clock.configure(dilation)
    topo = generate("leaf-spine", leaves=2, spines=1, hosts_per_leaf=1)
    lm = LinkModel.of(topo.defaults.rate)
    sw = SWITCH_MODELS["ib-edr"]
    with live_fabric(topo, tmp) as (rt, host, on_loop, lids):
        ports = {}
        for h in ("h0", "h1"):
            pp = rt.plan.nodes[h].ports[1]
            ports[h] = HcaPort.open(rt.plan.nodes[h].ns, pp.ifname, pp.peer_mac, lids[h], name=h)
        opts = PerfOptions(test="write_lat", size=size, iterations=iterations)

        async def main() -> Any:
            async with trio.open_nursery() as n:
                for port in ports.values():
                    await n.start(port.serve)
                res = await run_local(ports["h0"], ports["h1"], opts)
                n.cancel_scope.cancel()
            return res

        try:
            res = trio.run(main, clock=clock.trio_clock())
        finally:
            for port in ports.values():
                port.close()
        fid = fidelity_of(host, on_loop)
    assert isinstance(res, LatResult)
    st = res.stats_us()
    ser = lm.frame_ns(WRITE_LAT_WIRE + size)
    model = ser + 3 * (sw.latency_ns + ser) + 4 * lm.propagation
    typ = st["t_typical"] * 1000
    return {"kind": "write_lat", "dilation": dilation, "iterations": iterations, "size": size,
            "t_typical_ns": typ, "t_min_ns": st["t_min"] * 1000, "p99_ns": st["p99"] * 1000,
            "model_ns": model, "err_pct": 100 * (typ - model) / model, "fidelity": fid}


# ------------------------------------------------------------------ head-of-line blocking, credit loops

HOL_SCENARIO = """
topology: {generator: single-switch, hosts: 2}
fabric:
  datapath: user
  qos: {vls: 2, sl2vl: {1: 1}}
"""
"""The QoS keys of the HOL runs (taken through the scenario loader): SL1 rides VL1, the rest VL0."""


def measure_hol(host_rate: str, switch_rate: str, dilation: float, seconds: float, tmp: Path) -> list[dict[str, Any]]:
    """Congestion spreading (``testing.livephysics.HOL_FLOWS`` on ``hol_topology``): the hot
    flow h0 -> h3 and the local flow h4 -> h3 share h3's port 2:1, the victim h1 -> h5 shares
    only the hot flow's leaf0 -> spine -> leaf1 ports (which run at ``switch_rate``, twice the
    hosts'); each offers 105% of its host cable. Once with the victim on SL0 (VL0, with the hot
    flow), once on SL1 (VL1: ``fabric.qos`` maps it there), in one fabric with the scenario's QoS
    programmed through the agents' SMA. Per phase: each flow's rate at its receiver (kernel
    stamps, emulated time, the middle 60%), PortXmitWait on the upstream ports leaf0:4 and
    spine0:2 (the agents' PMA), the fidelity verdict, and the model's expectation
    (``simulate_hol``: the same nodes in ``physics.sim``)."""
    from ibemu import clock
    from ibemu.physics.link import LinkModel, default_switch_model
    from ibemu.scenario import loads_scenario
    from ibemu.sm.qos import SmQos
    from ibemu.testing.livephysics import (
        HOL_FLOWS,
        hol_flows,
        hol_topology,
        program_qos,
        run_traffic,
        simulate_hol,
        wire_bytes,
    )

    clock.configure(dilation)
    spec = loads_scenario(HOL_SCENARIO, "hol.yaml").fabric.qos
    assert spec is not None
    qos = SmQos.from_json(spec.sm_json())
    topo = hol_topology(host_rate, switch_rate)
    host_link = LinkModel.of(topo.defaults.rate)
    model = default_switch_model(topo.defaults.rate, ethernet=False)
    out: list[dict[str, Any]] = []
    with live_fabric(topo, tmp, engine="minhop") as (rt, host, on_loop, lids):
        links = host.links
        every = {name: n.agent for name, n in host.nodes.items()}
        on_loop(program_qos, host, qos)
        on_loop(links.sync_qos, every)  # (the ticker's, every 50 ms of emulated time)
        plan = rt.plan
        pma = {"leaf0:4": ("leaf0", 4), "spine0:2": ("spine0", 2)}

        def waits() -> dict[str, int]:
            on_loop(links.push_counters)
            return on_loop(lambda: {k: host.nodes[n].agent.counters(p).port_xmit_wait for k, (n, p) in pma.items()})

        for sl in (0, 1):
            flows = hol_flows(plan, lids, host_link, dilation, victim_sl=sl, n=64)
            on_loop(lambda: links.report_links())  # start the fidelity interval here
            before = waits()
            got = run_traffic(flows, [{"ns": plan.nodes[h].ns, "if": plan.nodes[h].ports[1].ifname}
                                      for h in ("h3", "h5")], seconds=seconds, drain_s=1.0, workdir=tmp)
            fid = fidelity_of(host, on_loop)
            after = waits()
            bits = (wire_bytes(flows[0]["frames"][0]) + host_link.framing_bytes) * 8
            rates = {}
            for name, (src, dst) in HOL_FLOWS.items():
                rx = got["got"][0 if dst == "h3" else 1]
                st = sorted(clock.to_emulated_ns(t - got["offset"]) for t, slid, _ in rx if slid == lids[src])
                w = st[len(st) // 5: len(st) * 4 // 5]
                rates[name] = 100 * (len(w) - 1) * bits / (w[-1] - w[0]) / host_link.gbps if len(w) > 2 else 0.0
            expect = simulate_hol(topo, victim_sl=sl, qos=qos, switch=model)
            tick_ns = 4 * LinkModel.of(topo.rate_of(topo.link_at("leaf0", 4))).byte_ns()  # PortXmitWait's tick
            out.append({"kind": "hol", "victim_sl": sl, "victim_vl": qos.sl_to_vl()[sl], "dilation": dilation,
                        "xmit_wait_us": {k: (after[k] - before[k]) * tick_ns / 1000 for k in pma},
                        "phase_us": (seconds + 1.0) * 1e6 / dilation,
                        "host_rate": host_rate, "switch_rate": switch_rate, "rates_pct": rates,
                        "model_pct": {k: 100 * v for k, v in expect.items()},
                        "xmit_wait": {k: after[k] - before[k] for k in pma}, "fidelity": fid,
                        "sent": got["sent"], "drops": links.plane.drops})
    return out


def print_hol(r: dict[str, Any]) -> None:
    f = r["fidelity"]
    rt, m = r["rates_pct"], r["model_pct"]
    where = "with the hot flow" if r["victim_vl"] == 0 else "apart"
    print(f"HOL, {r['host_rate']} hosts, {r['switch_rate']} leaf-spine, dilation {r['dilation']:g}, victim on SL{r['victim_sl']} "
          f"-> VL{r['victim_vl']} ({where}): victim {rt['victim']:.1f}% of its line (model {m['victim']:.1f}%), "
          f"hot {rt['hot']:.1f}% (model {m['hot']:.1f}%), local {rt['local']:.1f}% (model {m['local']:.1f}%); "
          f"PortXmitWait upstream leaf0:4 +{r['xmit_wait']['leaf0:4']:,}, spine0:2 +{r['xmit_wait']['spine0:2']:,} "
          f"ticks (= {r['xmit_wait_us']['leaf0:4']:.0f} / {r['xmit_wait_us']['spine0:2']:.0f} us waiting of the "
          f"phase's {r['phase_us']:.0f} us, drain included); model drops {r['drops']}; fidelity {'valid' if f['valid'] else 'INVALID'} (worst link "
          f"{f['worst_link']}: busy {f['worst_busy_pct']}%, late p99 {f['worst_late_p99_us']} us)")


def measure_deadlock(dilation: float, seconds: float, tmp: Path, *, offer: float = 0.4,
                     fat_tree: bool = False) -> list[dict[str, Any]]:
    """All-to-all on a ring of 5 switches with 2 hosts each (1x SDR cables, 4 KiB input buffer
    per VL, 2 KiB frames: the model's reference case of ``bench_physics.py`` at a rate the
    datapath carries), each host offering ``offer`` of its line rate (more than the ring
    carries under all-to-all, so the hosts' queues never run dry), routed by updn, then by
    minhop, each in a fresh fabric. After the traffic the link plane's credit-loop check
    (``LinkPlane.check_loops``: what the agent host's ticker runs every 50 ms of emulated time,
    called here because at this dilation that is 50 s of real time) logs what it finds in the
    fabric log; the result's ``credit_loops`` as ``ibemu run`` writes it comes from that log.
    Beside it, the model's expectation: the same fabric and traffic in ``physics.sim``.
    ``fat_tree``: also ftree on a k=4 fat-tree (16 hosts), the same traffic and buffers."""
    from ibemu import clock
    from ibemu.physics.link import LinkModel, default_switch_model
    from ibemu.physics.sim import Flow
    from ibemu.report.result import CreditLoopRecord
    from ibemu.scenario.runner import credit_loops
    from ibemu.testing.livephysics import native_frames, run_traffic, wire_bytes
    from ibemu.testing.physics import fabric_sim
    from ibemu.topo import generate
    from ibemu.topo.rates import parse_rate

    clock.configure(dilation)
    size = 2048
    out = []
    cases = [("ring", "updn"), ("ring", "minhop")] + ([("fat-tree", "ftree")] if fat_tree else [])
    for shape, engine in cases:
        topo = (generate("ring", switches=5, hosts_per_switch=2) if shape == "ring"
                else generate("fat-tree", k=4))
        topo.defaults = dataclasses.replace(topo.defaults, rate=parse_rate("1x SDR"))
        model = dataclasses.replace(default_switch_model(topo.defaults.rate, ethernet=False), buffer_bytes=4096)
        link = LinkModel.of(topo.defaults.rate)
        hosts = [n.name for n in topo.cas()]
        run_dir = tmp / f"{shape}-{engine}"
        run_dir.mkdir()
        with live_fabric(topo, run_dir, engine=engine, switch_model=model) as (rt, host, on_loop, lids):
            links = host.links
            flows = []
            for h in hosts:
                frames = native_frames(rt.plan, lids, h, [d for d in hosts if d != h], n=63, payload=size)
                fps = link.gbps * 1e9 / ((wire_bytes(frames[0]) + link.framing_bytes) * 8)
                flows.append({"ns": rt.plan.nodes[h].ns, "if": rt.plan.nodes[h].ports[1].ifname, "frames": frames,
                              "fps": offer * fps / dilation})
            on_loop(links.report_links)
            t0 = clock.now_ns()
            got = run_traffic(flows, [{"ns": rt.plan.nodes[h].ns, "if": rt.plan.nodes[h].ports[1].ifname}
                                      for h in hosts], seconds=seconds, drain_s=0.5, workdir=run_dir)
            fid = fidelity_of(host, on_loop)
            on_loop(links.check_loops)
        events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]
        loops = credit_loops(events, t0)
        stamps = sorted(clock.to_emulated_ns(t - got["offset"]) for rx in got["got"] for t, _, n in rx if n > size)
        stamps = [t - stamps[0] for t in stamps] if stamps else []  # from the first delivery
        span = int(seconds * 1e9 / dilation)  # the sending, in emulated ns
        last_quarter = sum(1 for t in stamps if span * 3 // 4 < t <= span)
        sim, slids = fabric_sim(topo, engine, buffer_bytes=4096)
        for s in slids:
            for d in slids:
                if s != d:
                    sim.add_flow(Flow(s, slids[d], size=size + 42, backlog=4))
        sim_loops = sim.run(span, check_deadlock_ns=100_000, stall_ns=100_000)
        out.append({"kind": "deadlock", "shape": shape, "hosts": len(hosts), "engine": engine, "dilation": dilation, "emulated_us": span / 1000,
                    "delivered": len(stamps), "last_quarter": last_quarter,
                    "last_delivery_us": stamps[-1] / 1000 if stamps else None, "credit_loops": loops,
                    "described": [CreditLoopRecord.from_dict(c).describe() for c in loops], "fidelity": fid,
                    "sent": sum(got["sent"]), "model_loops": [lp.describe() for lp in sim_loops],
                    "model_delivered": sum(f.delivered for f in sim.flows), "model_stopped_us": sim.now / 1000})
    return out


def print_deadlock(r: dict[str, Any]) -> None:
    f = r["fidelity"]
    found = "; ".join(r["described"]) or "no credit loop"
    model = "; ".join(r["model_loops"]) or "no loop"
    shape = "ring of 5 (2 hosts each)" if r["shape"] == "ring" else f"k=4 fat-tree ({r['hosts']} hosts)"
    print(f"deadlock, {shape}, all-to-all 2 KiB at 1x SDR, {r['engine']}, dilation {r['dilation']:g}, "
          f"{r['emulated_us']:.0f} us emulated: {r['delivered']} frames delivered, {r['last_quarter']} in the last "
          f"quarter of the sending (the last {r['last_delivery_us']:.0f} us after the first); detected: {found} (model: {model}, "
          f"{r['model_delivered']} delivered{', found at ' + format(r['model_stopped_us'], '.0f') + ' us' if r['model_loops'] else ''}); "
          f"fidelity {'valid' if f['valid'] else 'INVALID'} (worst link {f['worst_link']}: busy {f['worst_busy_pct']}%, "
          f"late p99 {f['worst_late_p99_us']} us)")
    if r["credit_loops"]:
        print(f"  the result's credit_loops: {json.dumps(r['credit_loops'])}")


# ------------------------------------------------------------------ RoCE: the same model, Ethernet

def roce_frames(fab: Any, src: str, dst: str, n: int) -> list[str]:
    """RoCEv2 RDMA WRITE frames of 4 KiB from ``src`` to ``dst`` (DSCP 26, ECT(0), ICRC right)."""
    from scapy.contrib.roce import BTH

    from ibemu.wire.roce import roce_packet

    hp = fab.host_port(src)
    mac = fab.plan.nodes[src].ports[1].mac
    reth = bytes(8) + (0x1234).to_bytes(4, "big") + PAYLOAD.to_bytes(4, "big")
    out = []
    for i in range(n):
        pkt = roce_packet(fab.addrs.host_ip(src), fab.addrs.host_ip(dst), BTH(opcode=0x0A, dqpn=0x100, psn=i),
                          payload=reth + bytes(PAYLOAD), sport=0xC000 + i % 64, tos=26 << 2 | 2,
                          src_mac=":".join(f"{b:02x}" for b in mac),
                          dst_mac=":".join(f"{b:02x}" for b in hp.gateway_mac))
        out.append(bytes(pkt).hex())
    return out


def measure_roce_incast(rate_name: str, dilation: float, seconds: float, tmp: Path, *, pfc_on: bool) -> dict[str, Any]:
    """The 2:1 incast on a RoCE fabric's user datapath (routers timed by the same link model):
    h0 and h1 each offer 105% of the line rate to h2 through one router; with PFC on the data's
    priority or without."""
    from ibemu import clock, lagmon
    from ibemu.fabric.roce_fabric import RoceRun
    from ibemu.kernel import ownership
    from ibemu.physics import expect
    from ibemu.physics.link import ETH_FRAMING_BYTES, data_gbps
    from ibemu.roce.physics import switch_model
    from ibemu.roce.queues import QueueConfig
    from ibemu.scenario.fidelity import fidelity, judge_links, threshold
    from ibemu.topo import generate
    from ibemu.topo.rates import parse_rate

    clock.configure(dilation)
    rate = parse_rate(rate_name)
    topo = generate("single-switch", hosts=3)
    topo.defaults = dataclasses.replace(topo.defaults, rate=rate)
    q = QueueConfig(pfc=frozenset({3}) if pfc_on else frozenset())
    lag = tmp / "lag.jsonl"
    os.environ[lagmon.ENV_LOG] = str(lag)  # the user datapath's lag and link fidelity go here
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-physics-live-roce")
    run = RoceRun.up(topo, state, queues=q)
    try:
        fab = run.fab
        f0, f1 = roce_frames(fab, "h0", "h2", 16), roce_frames(fab, "h1", "h2", 16)
        size = len(bytes.fromhex(f0[0])) + 4  # the model's size: with the FCS
        line_fps_real = data_gbps(rate) * 1e9 / ((size + ETH_FRAMING_BYTES) * 8) / dilation
        nodes = fab.plan.nodes
        spec = {"tx_ns": nodes["h0"].ns, "tx_if": nodes["h0"].ports[1].ifname, "rx_ns": nodes["h2"].ns,
                "rx_if": nodes["h2"].ports[1].ifname, "rx_proto": 0x0003, "id_at": [29, 30], "frames": f0,
                "more": [{"ns": nodes["h1"].ns, "if": nodes["h1"].ports[1].ifname, "frames": f1}],
                "mode": "rate", "offered": 1.05 * line_fps_real, "seconds": seconds, "drain_s": 1.5}
        t0 = clock.now_ns()
        out = run_child(spec, tmp)
    finally:
        run.down()
        os.environ.pop(lagmon.ENV_LOG, None)
    counters = run.counters
    recs = [json.loads(line) for line in lag.read_text().splitlines()] if lag.exists() else []
    fid = judge_links([r for r in recs if r.get("t_ns", 0) >= t0],  # as the IB rows: the links' verdict
                      threshold_us=threshold(dilation).us)
    procs = fidelity(recs, dilation=dilation, lo_ns=t0)["processes"]
    ids = {int(fab.addrs.host_ip(h).split(".")[-1]): h for h in ("h0", "h1")}
    got = sorted((clock.to_emulated_ns(s - out["offset"]), ids.get(src, "?")) for s, n, src in out["got"] if n > 1000)
    lo, hi = int(len(got) * 0.2), int(len(got) * 0.9)
    window = got[lo:hi]
    span = max(1, window[-1][0] - window[0][0]) if len(window) > 1 else 1
    per = {h: sum(1 for _, who in window if who == h) for h in ("h0", "h1")}
    tot = counters.get("totals", {})
    model = counters.get("model", {})
    sw = switch_model(q)
    arrived = out["sent_n"]
    return {"kind": "roce", "pfc": pfc_on, "rate": rate_name, "dilation": dilation, "line_gbps": data_gbps(rate),
            "frame_bytes": size, "buffer_bytes": sw.buffer_bytes, "sent": arrived, "received": len(got),
            "total_pct": 100 * (len(window) - 1) * (size + ETH_FRAMING_BYTES) * 8 / span / data_gbps(rate),
            "share_pct": {k: 100 * v / max(1, len(window)) for k, v in per.items()},
            "dropped": int(tot.get("dropped", 0)), "model_drops": int(model.get("drops", 0)),
            "expected_drops": 0 if pfc_on else expect.incast_drops(2, arrived // 2, size, sw.buffer_bytes),
            "pause_sent": int(tot.get("pause_sent", 0)), "pause_received": int(tot.get("pause_received", 0)),
            "paused_us": int(tot.get("paused_us", 0)), "hosts_paused_us": model.get("hosts_paused_us", {}),
            "fidelity": fid, "processes": procs}


def print_roce_incast(r: dict[str, Any]) -> None:
    f = r["fidelity"]
    sh = r["share_pct"]
    pfc_txt = "PFC on priority 3" if r["pfc"] else "no PFC (drop tail)"
    print(f"RoCE 2:1 incast, 4 KiB, {r['rate']} Ethernet, {pfc_txt}, at dilation {r['dilation']:g}: "
          f"h0 {sh['h0']:.1f}% / h1 {sh['h1']:.1f}% of what reached h2 (target 50 +- 3% each), h2's cable at "
          f"{r['total_pct']:.2f}% of its rate (model: 100%); dropped {r['dropped']} of {r['sent']} "
          f"(model's expectation {r['expected_drops']}: half the arrivals beyond a {r['buffer_bytes'] // 1024} KiB "
          f"buffer{'; PFC: 0' if r['pfc'] else ''}); the router sent {r['pause_sent']} pause frames (XOFF+XON), "
          f"the senders' ports stood paused {r['hosts_paused_us']} us (emulated); fidelity "
          f"{'valid' if f['valid'] else 'INVALID'} (worst link {f['worst_link']}: busy {f['worst_busy_pct']}%, "
          f"late p99 {f['worst_late_p99_us']} us{'; ' + str(f['behind']) if f['behind'] else ''})")


def measure_roce_rc(rate_name: str, dilation: float, iterations: int, *, pfc_on: bool) -> dict[str, Any]:
    """The same incast with ibemu's RC transport (RDMA WRITE of 64 KiB from h0 and from h1 to
    h2, one QP each, ``iterations`` messages, in this process on the dilated clock): drops make
    the receiver NAK out-of-sequence packets and the requester go back N (``retransmitted``)."""
    import trio

    from ibemu import clock
    from ibemu.fabric.roce_fabric import RoceRun
    from ibemu.kernel import ownership
    from ibemu.physics.link import ETH_FRAMING_BYTES, data_gbps
    from ibemu.roce.queues import QueueConfig
    from ibemu.topo import generate
    from ibemu.topo.rates import parse_rate
    from ibemu.traffic.perftest import PerfOptions, Side, bw_client, bw_server

    clock.configure(dilation)
    topo = generate("single-switch", hosts=3)
    topo.defaults = dataclasses.replace(topo.defaults, rate=parse_rate(rate_name))
    q = QueueConfig(pfc=frozenset({3}) if pfc_on else frozenset())
    state = ownership.RunState(ownership.new_run_id(), scenario="bench-physics-live-roce-rc")
    run = RoceRun.up(topo, state, queues=q)
    opts = PerfOptions(test="write_bw", size=65536, iterations=iterations, qps=1, tx_depth=64, timeout=8)
    results: list[Any] = []
    try:
        ports = {h: run.open_port(h) for h in ("h0", "h1", "h2")}

        async def main() -> None:
            async with trio.open_nursery() as n:
                for p in ports.values():
                    await n.start(p.serve)
                done = trio.Event()
                sides = []
                for src in ("h0", "h1"):
                    a, b = Side.create(ports[src], opts), Side.create(ports["h2"], opts)
                    a.connect(b.info())
                    b.connect(a.info())
                    sides.append(a)
                    n.start_soon(bw_server, b, done)

                async def drive(side: Side) -> None:
                    results.append(await bw_client(side))
                async with trio.open_nursery() as clients:
                    for sd in sides:
                        clients.start_soon(drive, sd)
                done.set()
                n.cancel_scope.cancel()

        trio.run(main, clock=clock.trio_clock())
    finally:
        for p in locals().get("ports", {}).values():
            p.close()
        run.down()
    tot = run.counters.get("totals", {})
    return {"kind": "roce-rc", "pfc": pfc_on, "dilation": dilation, "iterations": [r.iterations for r in results],
            "gbps": [round(r.bytes * 8 / r.seconds / 1e9, 2) for r in results],
            "retransmitted": sum(r.retransmitted for r in results), "dropped": int(tot.get("dropped", 0)),
            "pause_sent": int(tot.get("pause_sent", 0)),
            "payload_max_gbps": data_gbps(topo.defaults.rate) * 4096 / (4096 + 78 + 4 + ETH_FRAMING_BYTES)}


def print_roce_rc(r: dict[str, Any]) -> None:
    g = r["gbps"]
    share = [100 * x / max(sum(g), 1e-9) for x in g]
    print(f"RoCE 2:1 incast with the RC transport (64 KiB WRITEs, 1 QP each), {'PFC' if r['pfc'] else 'no PFC'}, "
          f"dilation {r['dilation']:g}: router dropped {r['dropped']}, packets the senders went back N for "
          f"{r['retransmitted']} (model: > 0 without PFC, 0 with), pause frames {r['pause_sent']}; each sender "
          f"{g[0]:.1f} / {g[1]:.1f} Gb/s of payload in emulated time ({share[0]:.1f}% / {share[1]:.1f}%; "
          f"together {sum(g):.1f}, the cable's payload rate at most {r['payload_max_gbps']:.1f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child")
    ap.add_argument("--rates", default="4x EDR,4x NDR")
    ap.add_argument("--dilation", default="500,2000", help="one per rate")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--latency-dilation", type=float, default=5000.0)
    ap.add_argument("--latency-frames", type=int, default=60)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-rate", action="store_true")
    ap.add_argument("--incast", action="store_true", help="also the 2:1 incast at the first rate and dilation")
    ap.add_argument("--rate-switches", type=int, choices=(1, 3), default=1,
                    help="the rate over one switch, or three (leaf, spine, leaf: credits between switches)")
    ap.add_argument("--roce-incast", action="store_true",
                    help="the 2:1 incast on the RoCE user datapath, with and without PFC")
    ap.add_argument("--roce-dilation", type=float, default=2000.0)
    ap.add_argument("--roce-only", action="store_true", help="only the RoCE rows")
    ap.add_argument("--roce-rc", type=int, default=0, metavar="N",
                    help="also the RoCE incast with the RC transport, N messages of 64 KiB per sender")
    ap.add_argument("--write-lat", type=int, default=0, metavar="N",
                    help="also perftest's write_lat (N iterations, 8 B) over 3 switches with the RC transport")
    ap.add_argument("--write-lat-dilation", type=float, default=20000.0)
    ap.add_argument("--hol", action="store_true",
                    help="also head-of-line blocking: a victim on the hot flow's VL, then on its own (QoS keys)")
    ap.add_argument("--hol-rates", default="4x EDR,4x HDR", help="the hosts' and the leaf-spine cables' rates")
    ap.add_argument("--hol-dilation", type=float, default=5000.0)
    ap.add_argument("--deadlock", action="store_true",
                    help="also the credit loop: all-to-all on a ring of 5, updn then minhop")
    ap.add_argument("--deadlock-dilation", type=float, default=1000.0)
    ap.add_argument("--deadlock-seconds", type=float, default=4.0)
    ap.add_argument("--deadlock-fat-tree", action="store_true", help="with --deadlock: also ftree on a k=4 fat-tree")
    ap.add_argument("--only", action="store_true", help="only the rows asked for with --hol / --deadlock")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return 0
    import logging
    logging.basicConfig(level=logging.WARNING)
    print(f"load average before: {os.getloadavg()}")
    results: list[dict[str, Any]] = []
    rates = [r.strip() for r in args.rates.split(",")]
    dils = [float(d) for d in args.dilation.split(",")]
    if len(dils) != len(rates):
        ap.error(f"--dilation: one factor per rate of --rates ({len(rates)}), not {len(dils)}")
    if args.hol:
        hr, sr = (x.strip() for x in args.hol_rates.split(","))
        with tempfile.TemporaryDirectory() as tmp:
            for r in measure_hol(hr, sr, args.hol_dilation, args.seconds, Path(tmp)):
                results.append(r)
                print_hol(r)
    if args.deadlock:
        with tempfile.TemporaryDirectory() as tmp:
            for r in measure_deadlock(args.deadlock_dilation, args.deadlock_seconds, Path(tmp),
                                      fat_tree=args.deadlock_fat_tree):
                results.append(r)
                print_deadlock(r)
    if args.only:
        args.skip_rate = args.skip_latency = True
    if args.roce_incast or args.roce_only:
        for pfc_on in (False, True):
            with tempfile.TemporaryDirectory() as tmp:
                r = measure_roce_incast(rates[0], args.roce_dilation, args.seconds, Path(tmp), pfc_on=pfc_on)
            results.append(r)
            print_roce_incast(r)
    if args.roce_rc:
        for pfc_on in (False, True):
            r = measure_roce_rc(rates[0], args.roce_dilation, args.roce_rc, pfc_on=pfc_on)
            results.append(r)
            print_roce_rc(r)
    if args.roce_only:
        args.skip_rate = args.skip_latency = True
    if not args.skip_rate:
        for rate, d in zip(rates, dils, strict=True):
            with tempfile.TemporaryDirectory() as tmp:
                r = measure_rate(rate, d, args.seconds, Path(tmp), args.rate_switches)
            results.append(r)
            f = r["fidelity"]
            print(f"one flow, 4 KiB, {rate}, {r['switches']} switch(es), at dilation {d:g}: {r['achieved_gbps']:.2f} Gb/s emulated = "
                  f"{r['pct']:.2f}% of {r['line_gbps']:g} (target 97..100.5%), {r['frames']} frames; "
                  f"fidelity {'valid' if f['valid'] else 'INVALID'}: worst link {f['worst_link']} "
                  f"(busy {f['worst_busy_pct']}%, late p99 {f['worst_late_p99_us']} us); sent {r['child_sent']} "
                  f"(failed {r['child_failed']}), into the model {r['into_model']}")
    if args.incast:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure_incast(rates[0], dils[0] * 2, args.seconds, Path(tmp))
        results.append(r)
        f = r["fidelity"]
        sh = r["share_pct"]
        print(f"2:1 incast, 4 KiB, {r['rate']} at dilation {r['dilation']:g}: h0 {sh['h0']:.1f}% / h1 {sh['h1']:.1f}% "
              f"of what reached h2 (target 50 +- 3% each), h2's cable at {r['total_pct']:.2f}% of its rate; "
              f"dropped by the model {r['model_drops']}, the senders' ports waited for credits "
              f"{r['host_xmit_wait_us']['h0']:.0f} / {r['host_xmit_wait_us']['h1']:.0f} us; fidelity "
              f"{'valid' if f['valid'] else 'INVALID'} (worst link {f['worst_link']}, {f['behind'] or 'none behind'})")
    if not args.skip_latency:
        lats = {}
        for switches in (1, 3):
            with tempfile.TemporaryDirectory() as tmp:
                lats[switches] = measure_latency(args.latency_dilation, args.latency_frames, Path(tmp), switches)
        r = lats[3]
        results.extend(lats.values())
        one = lats[1]
        print(f"latency, 4 KiB, 4x EDR, 1 switch at dilation {one['dilation']:g}: median {one['median_ns']:.0f} ns "
              f"(p10 {one['p10_ns']}, p90 {one['p90_ns']}) vs model {one['model_ns']} ns "
              f"({100 * (one['median_ns'] - one['model_ns']) / one['model_ns']:+.1f}%)")
        diff = (r["median_ns"] - one["median_ns"]) / 2
        print(f"per switch hop from the difference of the 3- and 1-switch paths (the host cables' fixed "
              f"costs cancel): {diff:.0f} ns vs model {r['hop_model_ns']} ns "
              f"({100 * (diff - r['hop_model_ns']) / r['hop_model_ns']:+.1f}%, target within 5%)")
        f = r["fidelity"]
        print(f"latency, 4 KiB, 4x EDR, 3 switches at dilation {r['dilation']:g}: median {r['median_ns']:.0f} ns "
              f"(p10 {r['p10_ns']}, p90 {r['p90_ns']}) vs model {r['model_ns']} ns; per hop {r['per_hop_ns']:.0f} ns "
              f"vs {r['hop_model_ns']} ns ({r['err_pct']:+.1f}%, target within 5%); {r['samples']} samples; "
              f"fidelity {'valid' if f['valid'] else 'INVALID'}; unmatched arrivals {r['unmatched']}")
        for link, st in f["links"].items():
            print(f"  {link}: {st}")
    if args.write_lat:
        with tempfile.TemporaryDirectory() as tmp:
            r = measure_write_lat(args.write_lat_dilation, args.write_lat, Path(tmp))
        results.append(r)
        f = r["fidelity"]
        print(f"write_lat, {r['size']} B, 4x EDR, 3 switches, RC, at dilation {r['dilation']:g}: t_typical "
              f"{r['t_typical_ns']:.0f} ns (t_min {r['t_min_ns']:.0f}, p99 {r['p99_ns']:.0f}) vs the model's sum "
              f"{r['model_ns']} ns ({r['err_pct']:+.1f}%, target within 10%); fidelity "
              f"{'valid' if f['valid'] else 'INVALID'} ({f['behind'] or 'none behind'}); the excess is "
              f"ibemu's own software, {(r['t_typical_ns'] - r['model_ns']) * r['dilation'] / 1e6:.2f} ms "
              f"real a half round trip, N times smaller in emulated time (not to scale)")
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        print(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
