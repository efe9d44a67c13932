#!/usr/bin/env python3
"""Local failover in the switches against SM-only recovery, on the same live fabric (issue 20).

Kernel datapath (default): a k-ary fat-tree (``--k``, default 8) with agents, MAD sockets
and the kernel SMA, ibemu's SM on h0 with ``ftree_ar`` (LFTs plus alternate ports per LID,
written with the AlternatePorts vendor attribute) or ``ftree`` (LFTs only), both engines in
one invocation, ``--runs`` fresh fabrics each. Probe streams run from a child process of
their own (``--probe-child``: its own GIL, at the fabric's priority): per flow an RDMA WRITE
frame every ``--probe-us`` us (PSN = sequence number), received on raw sockets at the
destination hosts with kernel receive stamps. 300 ms into the streams the fault:

- ``--fault cable``: edge0_0's up-port that carries the first remote host is cut at the
  edge's end. Flows ``up``: edge0_0's hosts to remote hosts routed out through that port (the
  edge has alternates); ``down``: remote hosts to edge0_0's hosts routed in through the
  cable (the aggregation switch above has no alternate: fault notices, or the SM);
- ``--fault spine``: the core switch on h0's path to the last pod is powered off
  (``AgentHost.power``: every port down, its agent silent), under flows crossing it.

Per flow (``analyse``): its blackout, from the frames it lost (the longest run of frames
lost that were sent from 1 ms before the fault on: from the send of the last frame that
arrived before the run to the send of the first that arrived after it, an upper bound by up
to one probe interval; a flow that lost nothing: 0), and when it resumed (that frame's
arrival, from the fault); when the agent host's carrier thread saw the flow's port go down
(``kernel.carrier``) and when a bystander (the probe child, watching the same namespace's link
notifications) was told, so that the kernel's share of the carrier path shows. Per run the
steps of the carrier path (fault -> notification read -> port map written -> the agent host's
loop notified -> trap 128 sent -> trap received by the SM) and the SM's reroute. The fault's
stamp is the cut as the injector makes it (``AgentHost.set_ports``: the loss of signal told to
the carrier thread; the kernel is asked to close the interfaces after).

``--stall-ms N`` (with ``--stall-s S``, default 3): from the fault on, this process (the agent
host's: its agents answer every SMP of the SM's MAD socket) is held N ms at a time, 5 ms
apart, for S s (``testing.gilstall``): the SM's answers come late, as on a loaded machine. Per run then whether the SM reported a partition after the
fault and whether it rerouted within 30 s (a run without a reroute is counted, not an error).

Every figure is ibemu's own time on this machine, real time at dilation 1, not a switch
ASIC's: the kernel closing a veth (an RCU grace period per port), the carrier thread waking
and taking the GIL, the agents' Python relaying each notice.

With ``--datapath user --dilation N`` the same near cut on the IB user datapath (the
switches forward in the agent host, every cable timed by the link model) at dilation N, and
the figure is in emulated time: a probe stream h1 -> h15 of RDMA WRITE frames, one every
``--spacing-us`` emulated microseconds (default 1; N times that in real time), received on a
raw socket at h15 with kernel stamps put on the emulated clock. ``blackout`` is the silence at
the cut (emulated us): from the arrival before the first frame sent after the cut that arrived
to that frame, less the stream's spacing; ``longest silence`` the longest anywhere after the
cut (it includes the datapath's own stalls: an upper bound); ``first after cut`` when that
first frame arrived; ``frames lost`` the stream's frames that never arrived. Both engines are ibemu's SM:
``ftree_ar`` (the edge's forwarder fails over on the carrier loss) and ``ftree`` (the stream
waits for the SM's reroute). Deviations: the fabric comes up, and the SM brings it up, at
dilation 1; the clock is dilated (``clock.configure(N, epoch=now)``: the emulated clock goes
on from that instant, N times slower) once the subnet is up and carries a first stream, and
the SM stays on the real clock (under a clock dilated from the start its first sweep had
not finished after two minutes at dilation 2000; on the real clock against a fabric dilated
from the start, its own port's answers timed out). Its stamps are put on the emulated clock
(``clock.to_emulated_ns``), so ``cut -> SM programmed`` is emulated; the SM's lag is not
part of the run's fidelity (it is not on the run's clock). The agent host's loop runs on the
real clock (``harness.LiveFabric``, as in the other benchmarks), so its lag monitor measures
real lateness, which is divided by the factor before the run's threshold applies
(``judge_user``: ``scenario.fidelity.threshold``, 2 ms of real time, relaxed up to 5% of the
blackout at the cut; a blackout of 0 gets the real-time rule); the links are judged as
``scenario.fidelity`` does, over the stream (the lag records that overlap it: the stream starts
a second after the clock is dilated, so none holds the bring-up's lag). No sysfs trees. Only
runs marked valid count in the figures, the others are listed; a run whose fabric came up
unfit (under load some of the SM's SMPs time out: ports left unactivated, groups unwritten)
is tried afresh, up to 3 times. The factor must be large: the agent host's Python handling
of the carrier loss holds its loop for 0.1-0.2 s of real time on this shared machine, which
the frames behind it wait for; at dilation 2000 that alone was a 55 us blackout with nothing
lost. To scale: the blackout with
local failover is the agent host's reaction to a carrier loss divided by N (a switch ASIC
reacts in hardware: ibemu's figure is an upper bound); SM-only is the SM's real CPU time
divided by N too, so it is N times shorter than the same SM on a real fabric would take: not
to scale (the kernel datapath's figures above are the real-time ones).

Run: sudo .venv/bin/python benchmarks/bench_local_failover.py [--k 8] [--runs 3] [--fault cable|spine]
     sudo .venv/bin/python benchmarks/bench_local_failover.py --k 8 --fault cable --stall-ms 450
     sudo .venv/bin/python benchmarks/bench_local_failover.py --datapath user --dilation 20000 [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from harness import LiveFabric

from ibemu import clock, lagmon
from ibemu.fabric.probe import send_and_count
from ibemu.kernel import cpus, rtnl
from ibemu.kernel.linkevents import open_link_monitor, read_events
from ibemu.kernel.packet import kernel_stamp, open_packet_socket, stamp_received
from ibemu.scenario.fidelity import (
    DEFAULT_REAL_THRESHOLD_US,
    judge_links,
    lag_text,
    merge,
    merge_links,
    threshold,
)
from ibemu.testing.gilstall import GilStall
from ibemu.topo import generate
from ibemu.wire import fast

REPO = Path(__file__).resolve().parents[1]
PROBE_S = 1.0
"""How long the probe streams run (real time)."""
PROBE_FAULT_S = 0.3
"""When the fault comes, after the probe streams started."""


def records(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines log as far as it is written (a line being written is left for later)."""
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


class Run:
    """One fresh fabric and ibemu's SM with one engine."""

    def __init__(self, fab: LiveFabric, tmp: Path, engine: str) -> None:
        self.fab, self.tmp, self.engine = fab, tmp, engine
        self.events = tmp / f"sm-{engine}.jsonl"
        self.sm = subprocess.Popen(
            [sys.executable, "-m", "ibemu.sm", "--ns", fab.ns("h0"), "--events", str(self.events),
             "--sweep-interval", "2", "--engine", engine],
            cwd=REPO, env={**{k: v for k, v in os.environ.items() if k != lagmon.ENV_LOG}, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"sm-{engine}.stderr", "wb"))  # noqa: SIM115

    def close(self) -> None:
        if self.sm.poll() is None:
            self.sm.terminate()
            self.sm.wait(10)

    def sm_events(self, kind: str) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        return [r for r in records(self.events) if r.get("kind") == kind]

    def wait_sm(self, kind: str, count: int = 1, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.sm_events(kind)
            if len(got) >= count:
                return got
            if self.sm.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {kind} from the SM ({self.engine}): "
                                   f"{(self.tmp / f'sm-{self.engine}.stderr').read_text()[-2000:]}")
            time.sleep(0.01)

    def fabric_events(self, kind: str, t_min: int, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        path = self.tmp / "events.jsonl"  # the agent host's log (flushed every 50 ms)
        deadline = time.monotonic() + timeout_s
        while True:
            recs = [r for r in records(path) if r.get("kind") == kind and r.get("t_ns", 0) >= t_min]
            if recs or time.monotonic() > deadline:
                return recs
            time.sleep(0.05)

    def lid(self, host: str) -> int:
        rt = self.fab.rt
        return int(trio.from_thread.run_sync(lambda: rt.host.nodes[host].agent.lid(1),  # type: ignore[union-attr]
                                             trio_token=self.fab.token))

    def blast(self, n: int, src: str = "h1", dst: str = "h15") -> int:
        return send_and_count(self.fab.rt.plan, src, dst, self.lid(src), self.lid(dst), n, size=200)

    def last_cable(self, src: str, dst: str) -> tuple[str, int]:
        """The edge switch's end of the last cable the kernel LFTs take from ``src`` to ``dst``."""
        topo, fabric = self.fab.topo, self.fab.rt.fabric
        assert fabric is not None
        dlid = self.lid(dst)
        far = topo.peer(src, 1)
        assert far is not None
        node, prev = far.node, ("", 0)
        while True:
            port = fabric.lfts[node].read(dlid)  # type: ignore[union-attr]
            nxt = topo.peer(node, port)
            assert nxt is not None
            if nxt.node == dst:
                end = topo.peer(*prev)
                assert end is not None
                return end.node, end.port
            prev, node = (node, port), nxt.node


class NotReady(RuntimeError):
    """The fabric did not come up fit for the measurement (under load, some of the SM's SMPs
    timed out: ports left unactivated, groups not written); the run is tried afresh."""


Pair = tuple[str, str]


def path_of(run: Run, lids: dict[str, int], src: str, dst: str) -> list[tuple[str, int]]:
    """(switch, egress port) of every hop the kernel LFTs take from ``src`` to ``dst``."""
    topo, fabric = run.fab.topo, run.fab.rt.fabric
    assert fabric is not None
    first = topo.peer(src, 1)
    assert first is not None
    node, hops = first.node, []
    for _ in range(12):
        port = fabric.lfts[node].read(lids[dst])  # type: ignore[union-attr]
        nxt = topo.peer(node, port) if port else None
        if nxt is None:
            return []
        hops.append((node, port))
        if nxt.node == dst:
            return hops
        node = nxt.node
    return []


def pick_flows(run: Run, lids: dict[str, int], fault: str, n: int) -> tuple[dict[str, list[Pair]], Any]:
    """The probe flows across the fault and the fault's target: ``cable``: (edge0_0, the
    up-port carrying the first remote host), flows ``up`` (edge0_0's hosts out through it)
    and ``down`` (into them through it); ``spine``: the core on h0's path to the first host
    of the last pod, flows crossing it (``all``)."""
    topo = run.fab.topo
    hosts = sorted((c.name for c in topo.cas()), key=lambda h: int(h[1:]))
    edge_of = {h: topo.peer(h, 1).node for h in hosts}  # type: ignore[union-attr]
    pod = {h: edge_of[h].split("_")[0] for h in hosts}
    local = [h for h in hosts if edge_of[h] == "edge0_0"]
    remote = [h for h in hosts if pod[h] != pod[local[0]]]
    if fault == "cable":
        port = path_of(run, lids, local[0], remote[-1])[0][1]
        far = topo.peer("edge0_0", port)
        assert far is not None
        up = [(s, d) for i, d in enumerate(remote) for s in [local[i % len(local)]]
              if ("edge0_0", port) in path_of(run, lids, s, d)]
        down = [(s, d) for i, s in enumerate(remote) for d in [local[i % len(local)]]
                if (far.node, far.port) in path_of(run, lids, s, d)]
        return {"up": spread(up, n), "down": spread(down, n)}, ("edge0_0", port)
    spine = next(node for node, _ in path_of(run, lids, local[0], remote[-1]) if node.startswith("core"))
    cross = [(s, d) for s in hosts[::3] for d in hosts[1::5] if pod[s] != pod[d]
             and spine in {node for node, _ in path_of(run, lids, s, d)}]
    return {"all": spread(cross, n)}, spine


def spread(pairs: list[Pair], n: int) -> list[Pair]:
    """Up to ``n`` of ``pairs``, as many different sources and destinations as there are."""
    out: list[Pair] = []
    srcs: set[str] = set()
    dsts: set[str] = set()
    for strict in (True, False):
        for s, d in pairs:
            if len(out) < n and (s, d) not in out and (not strict or (s not in srcs and d not in dsts)):
                out.append((s, d))
                srcs.add(s)
                dsts.add(d)
    return out


def one(engine: str, tmp: Path, k: int, fault: str, flows_n: int, spacing_us: float,
        loss_of_signal: bool = True, stall: GilStall | None = None) -> dict[str, Any]:
    """One fresh k-ary fat-tree, ibemu's SM with ``engine``, probe streams across ``fault``;
    ``loss_of_signal``: the cut told to the carrier thread at once (``AgentHost.set_ports``),
    else by the kernel's notifications only; ``stall``: started with the fault."""
    topo = generate("fat-tree", k=k)
    with LiveFabric(topo, tmp, scenario="bench-local-failover") as fab:
        run = Run(fab, tmp, engine)
        try:
            try:
                run.wait_sm("subnet_up", timeout_s=180)
            except RuntimeError as exc:
                raise NotReady(str(exc)[:300]) from None
            host = fab.rt.host
            assert fab.rt.fabric is not None and host is not None
            host.loss_of_signal = loss_of_signal
            lids = trio.from_thread.run_sync(
                lambda: {c.name: host.nodes[c.name].agent.lid(1) for c in topo.cas()},  # type: ignore[attr-defined]
                trio_token=fab.token)
            if engine.endswith("_ar"):  # the SM writes the alternates after the LFTs
                run.wait_sm("groups_programmed", timeout_s=120)
            time.sleep(0.5)
            groups, target = pick_flows(run, lids, fault, flows_n)
            flows = [pair for g in groups.values() for pair in g]
            if not flows:
                raise RuntimeError("no flow crosses the fault")
            for s, d in flows:
                if run.blast(50, s, d) != 50:
                    raise NotReady(f"the fabric does not carry {s} -> {d} before the fault")
            n_before = len(run.sm_events("reroute"))

            def inject() -> int:
                if fault == "cable":
                    sw, port = target
                    t = host.set_ports(sw, [port], False)
                else:
                    t = int(host.power(target, False))
                if stall is not None:
                    stall.start()
                return t

            # the port of the fault each flow meets first: the edge's up-port, or the spine's
            # port facing the aggregation switch that sends the flow into it
            ports = []
            for s, d in flows:
                hops = path_of(run, lids, s, d)
                if fault == "cable":
                    ports.append(target)
                else:
                    i = next(i for i, (node, _) in enumerate(hops) if node == target)
                    far = topo.peer(*hops[i - 1])
                    assert far is not None
                    ports.append((far.node, far.port))
            # each flow's switches before the fault (the notices move its LID on some of them)
            on_path = {pair: {node for node, _ in path_of(run, lids, *pair)} for pair in flows}
            res, t_fault = probe_flows(fab, lids, flows, spacing_us, inject, ports)
            try:
                reroutes = run.wait_sm("reroute", count=n_before + 1, timeout_s=30)[n_before:]
            except RuntimeError:
                if stall is None or run.sm.poll() is not None:
                    raise
                reroutes = []  # counted (``rerouted``)
            # when the carrier thread saw each flow's port go down (its end's notification, sent
            # once the port is closed; a switch's ports close one after the other, an RCU grace
            # period each)
            closed = {(t.node, t.port): t.seen for t in list(host.carrier_timings) if not t.up and t.seen >= t_fault}
            for f, port in zip(res, ports, strict=True):
                if port in closed and f["resume_ms"] is not None:
                    f["port_down_ms"] = (closed[port] - t_fault) / 1e6
                    f["resume_after_port_ms"] = max(0.0, f["resume_ms"] - f["port_down_ms"]) if f["lost"] else 0.0
            out: dict[str, Any] = {"groups": {g: [flows.index(p) for p in pairs] for g, pairs in groups.items()},
                                   "flows": res, "spacing_us": spacing_us, "rerouted": bool(reroutes),
                                   "sm_partitions": sum(1 for r in run.sm_events("partition") if r["t_ns"] >= t_fault),
                                   }
            for key, i, field in (("cut_to_sm_trap_ms", 0, "t_trap"), ("cut_to_sm_routed_ms", 0, "t_routed"),
                                  ("cut_to_sm_programmed_ms", -1, "t_programmed")):
                if reroutes and reroutes[i].get(field):  # a reroute a sweep found has no trap
                    out[key] = (reroutes[i][field] - t_fault) / 1e6
            timings = [t for t in list(host.carrier_timings) if not t.up and t.seen >= t_fault]
            if timings:
                out["cut_to_carrier_seen_ms"] = (min(t.seen for t in timings) - t_fault) / 1e6
                out["cut_to_last_carrier_seen_ms"] = (max(t.seen for t in timings) - t_fault) / 1e6
                written = [t for t in timings if t.written]
                if written:
                    out["cut_to_map_written_ms"] = (min(t.written for t in written) - t_fault) / 1e6
                    out["cut_to_last_map_written_ms"] = (max(t.written for t in written) - t_fault) / 1e6
                    own = [t.written - t.seen for t in written if t.written >= t.seen]  # not the early ones
                    if own:
                        out["seen_to_written_ms"] = statistics.median(own) / 1e6
                out["cut_to_agent_notified_ms"] = (min(t.notified for t in timings) - t_fault) / 1e6
            traps = run.fabric_events("trap_sent", t_fault)
            traps = [r for r in traps if r.get("trap_number") == 128 and not r.get("repeat")]
            if traps:
                out["cut_to_trap_sent_ms"] = (min(r["t_ns"] for r in traps) - t_fault) / 1e6
            moves = run.fabric_events("local_failover", t_fault, timeout_s=0.3 if engine == "ftree" else 2.0)
            by_notice = sorted(r["t_ns"] for r in moves if r.get("via") == "notice")
            if by_notice:
                out["cut_to_first_notice_move_ms"] = (by_notice[0] - t_fault) / 1e6
                out["cut_to_last_notice_move_ms"] = (by_notice[-1] - t_fault) / 1e6
                # moves the kernel made on a notice (``kernel.notice``), of all moves on one
                out["notice_moves_in_kernel"] = sum(1 for r in moves if r.get("via") == "notice" and r.get("kernel"))
                out["notice_moves"] = len(by_notice)
                for pair, f in zip(flows, res, strict=True):  # a flow's last move on a notice: by
                    ts = [r["t_ns"] for r in moves if r.get("via") == "notice"  # then it is off the
                          and r.get("node") in on_path[pair] and lids[pair[1]] in r.get("moved_lids", ())]
                    if ts:  # cut at the switch level, whatever the cut veth still delivers
                        f["notice_moved_ms"] = (max(ts) - t_fault) / 1e6
            sent = run.fabric_events("fault_notice_sent", t_fault, timeout_s=0.0)
            if sent:  # the switches at the cut announcing (the first notices of the fault)
                out["cut_to_first_notice_sent_ms"] = (min(r["t_ns"] for r in sent) - t_fault) / 1e6
            return out
        finally:
            run.close()


def probe_flows(fab: LiveFabric, lids: dict[str, int], flows: list[Pair], spacing_us: float,
                inject: Callable[[], int], ports: list[tuple[str, int]]) -> tuple[list[dict[str, Any]], int]:
    """Probe streams on ``flows`` from a child process (``--probe-child``: its own GIL), the
    fault ``inject()``-ed 300 ms into them; per flow its blackout and resume (``analyse``),
    and when the child, watching the namespace of the flow's port (``ports``: (switch, port)),
    was told the port lost carrier (``told_ms``: the kernel's part of the way to the agent
    host, seen from a process that shares nothing with it); and the fault's stamp."""
    plan = fab.rt.plan
    watch = sorted(set(ports))
    index = {sw: rtnl.ifindexes(plan.nodes[sw].ns, [plan.nodes[sw].ports[p].ifname for s2, p in watch if s2 == sw])
             for sw in {sw for sw, _ in watch}}
    spec: dict[str, Any] = {"spacing_us": spacing_us, "duration_s": PROBE_S,
            "watch": [[plan.nodes[sw].ns, index[sw][plan.nodes[sw].ports[p].ifname]] for sw, p in watch], "flows": [
        {"src_ns": plan.nodes[s].ns, "src_if": plan.nodes[s].ports[1].ifname,
         "eth": fast.ethernet_header(plan.nodes[s].ports[1].peer_mac, plan.nodes[s].ports[1].mac).hex(),
         "slid": lids[s], "dlid": lids[d], "dst_ns": plan.nodes[d].ns, "dst_if": plan.nodes[d].ports[1].ifname}
        for s, d in flows]}
    child = subprocess.Popen([sys.executable, __file__, "--probe-child"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(spec).encode() + b"\n")
        child.stdin.flush()
        if child.stdout.readline().strip() != b"ready":
            raise RuntimeError("the probe child did not start")
        time.sleep(PROBE_FAULT_S)
        t_fault = inject()
        data = json.loads(child.stdout.read())
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    sent_t = data["sent_t"]
    interval_us = (sent_t[-1] - sent_t[0]) / max(1, len(sent_t) - 1) / 1e3
    told = {tuple(w): t for w, t in zip(spec["watch"], data["told"], strict=True)}
    out = []
    for f, port in zip(data["flows"], ports, strict=True):
        t = told.get((plan.nodes[port[0]].ns, index[port[0]][plan.nodes[port[0]].ports[port[1]].ifname]))
        out.append({**analyse(f, sent_t, t_fault), "interval_us": interval_us,
                    "told_ms": None if not t else (t - t_fault) / 1e6})
    return out, t_fault


def analyse(flow: dict[str, Any], sent_t: list[int], t_fault: int) -> dict[str, Any]:
    """One flow across the fault, by the frames it lost (so that the probe's own stalls, which
    lose nothing, are not counted): per run of consecutive frames lost that were sent from
    1 ms before the fault on, its window from the send of the last frame that arrived before
    it to the send of the first that arrived after it (an upper bound of the blackout, by up
    to one probe interval); ``blackout_ms`` the longest window, ``resume_ms`` the arrival
    that ended it, from the fault. No frame lost: the blackout was over before the first send
    after the fault (that frame arrived), so its bound is that send's time from the fault,
    and ``resume_ms`` that frame's arrival; 0 would claim what the probes cannot see (a probe
    child that stalls across the fault loses nothing and proves little). ``blackout_low_ms``: that run's
    lower bound, from the send of its first frame lost to the send of its last (0 for one
    frame): the blackout lies between the two, and the gap is up to two probe intervals
    (wider where the probe child fell behind its pacing). ``lost``: frames lost in all;
    nothing arrived after the fault: None (no figure)."""
    got = dict(zip(flow["seqs"], flow["arrivals"], strict=True))
    n = len(sent_t)
    lost = n - len(got)
    if not any(t > t_fault for t in got.values()):
        return {"blackout_ms": None, "blackout_low_ms": None, "resume_ms": None, "lost": lost}
    best = (0, t_fault, 0)
    after = next((i for i in range(n) if sent_t[i] >= t_fault), n)
    if after < n and after in got:  # no blackout outlasted this send
        best = (sent_t[after] - t_fault, got[after], 0)
    seq = next((i for i in range(n) if sent_t[i] >= t_fault - 1_000_000), n)
    while seq < n:
        if seq in got:
            seq += 1
            continue
        first = seq
        while seq < n and seq not in got:
            seq += 1
        if seq == n:  # lost up to the end: silent since
            best = max(best, (sent_t[-1] - sent_t[max(0, first - 1)], sent_t[-1], sent_t[-1] - sent_t[first]))
            break
        window = sent_t[seq] - sent_t[max(0, first - 1)]
        if window > best[0]:
            best = (window, got[seq], sent_t[seq - 1] - sent_t[first])
    return {"blackout_ms": best[0] / 1e6, "blackout_low_ms": best[2] / 1e6,
            "resume_ms": max(0, best[1] - t_fault) / 1e6, "lost": lost}


def probe_child() -> None:
    """``--probe-child``: the probe streams (a JSON spec on stdin): every ``spacing_us`` one RDMA
    WRITE frame per flow (PSN = its sequence number, destination QP = 0x200 + the flow), for
    ``duration_s``; received on raw sockets at the destinations with kernel stamps. Prints
    ``ready`` when the sockets are open, then, at the end, per flow the arrivals (monotonic
    ns), their PSNs and the frames sent."""
    spec = json.loads(sys.stdin.readline())
    flows = spec["flows"]
    # SCHED_OTHER, as the fabric's processes: at SCHED_FIFO this child (~0.9 of a CPU in `ps`: the kernel
    # carries each probe frame through the switches inside its send) starved the agent host's
    # thread whenever the scheduler put it on that thread's pinned CPU: the carrier change and
    # its trap waited up to 0.64 s. Its own stalls widen no window: a window is counted from
    # frames lost, not from frames late.
    tx: dict[tuple[str, str], Any] = {}
    rx: dict[tuple[str, str], Any] = {}
    try:
        for f in flows:
            if (f["src_ns"], f["src_if"]) not in tx:
                tx[(f["src_ns"], f["src_if"])] = open_packet_socket(f["src_ns"], f["src_if"], 0x0003)
            if (f["dst_ns"], f["dst_if"]) not in rx:
                sock = open_packet_socket(f["dst_ns"], f["dst_if"], 0x88B5, buffer_bytes=8 << 20)
                stamp_received(sock)
                rx[(f["dst_ns"], f["dst_if"])] = sock
        tpls = [fast.NativeTemplate(slid=f["slid"], dlid=f["dlid"], destqp=0x200 + i, eth=bytes.fromhex(f["eth"]))
                for i, f in enumerate(flows)]
        socks = [tx[(f["src_ns"], f["src_if"])] for f in flows]
        arrivals: list[list[int]] = [[] for _ in flows]
        seqs: list[list[int]] = [[] for _ in flows]
        payload, ext = bytes(64), fast.reth(0, 0, 64)
        offset = clock.realtime_offset_ns()
        readers = list(rx.values())
        watch = [(ns, ifindex, open_link_monitor(ns)) for ns, ifindex in spec["watch"]]
        told = [0] * len(watch)
        monitors = [m for _, _, m in watch]

        def look() -> None:  # the watched ports' carrier loss, when this process hears of it
            for j, (_ns, ifindex, mon) in enumerate(watch):
                for ev in read_events(mon):
                    if ev.ifindex == ifindex and not ev.carrier and not told[j]:
                        told[j] = time.monotonic_ns()

        def drain() -> None:
            look()
            for sock in readers:
                while True:
                    try:
                        data, anc, _, _ = sock.recvmsg(2048, 64)
                    except BlockingIOError:
                        break
                    t = kernel_stamp(anc)
                    if t is None or len(data) < 14 + 20:
                        continue
                    p = fast.peek(data, 14)
                    i = p.destqp - 0x200
                    if 0 <= i < len(flows) and p.slid == flows[i]["slid"]:
                        arrivals[i].append(t - offset)
                        seqs[i].append(p.psn)

        print("ready", flush=True)
        step = int(spec["spacing_us"] * 1000)
        t0 = time.monotonic_ns()
        n = int(spec["duration_s"] * 1e9) // step
        sent_t: list[int] = []
        for seq in range(n):
            due = t0 + seq * step
            drain()  # every round, also when late (a receive buffer that fills loses frames)
            while time.monotonic_ns() < due:
                wait = (due - time.monotonic_ns()) / 1e9
                if wait > 0:
                    select.select(readers + monitors, [], [], wait)
                drain()
            sent_t.append(time.monotonic_ns())
            for i, tpl in enumerate(tpls):
                with contextlib.suppress(OSError):  # a host cable down: lost like the rest
                    socks[i].send(tpl.packet(0x0A, seq & 0xFFFFFF, payload, ext=ext))
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            drain()
            time.sleep(0.005)
        for _ns, _i, mon in watch:
            mon.close()
        json.dump({"sent_t": sent_t, "told": told, "flows": [{"arrivals": a, "seqs": s} for a, s in zip(arrivals, seqs, strict=True)]},
                  sys.stdout)
        sys.stdout.flush()
    finally:
        for sock in (*tx.values(), *rx.values()):
            sock.close()


def probe_stream(fab: LiveFabric, src_lid: int, dst_lid: int, n: int, spacing_us: float,
                 cut_at: int, cut: Any) -> tuple[list[tuple[int, int]], int]:
    """``n`` RDMA WRITE frames h1 -> h15, one every ``spacing_us`` emulated us, ``cut()`` called
    before frame ``cut_at``; (PSN, emulated arrival ns) of each frame received, and the
    emulated ns of the cut."""
    plan = fab.rt.plan
    sp, dp = plan.nodes["h1"], plan.nodes["h15"]
    tx = open_packet_socket(sp.ns, sp.ports[1].ifname, 0x0003)
    rx = open_packet_socket(dp.ns, dp.ports[1].ifname, 0x88B5, buffer_bytes=8 << 20)
    stamp_received(rx)
    tpl = fast.NativeTemplate(slid=src_lid, dlid=dst_lid, destqp=0x100,
                              eth=fast.ethernet_header(sp.ports[1].peer_mac, sp.ports[1].mac))
    got: list[tuple[int, int]] = []
    offset = clock.realtime_offset_ns()

    def drain() -> None:
        while True:
            try:
                data, anc, _, _ = rx.recvmsg(9216, 64)
            except BlockingIOError:
                return
            t = kernel_stamp(anc)
            if t is not None and len(data) > 100:
                got.append((fast.peek(data, 14).psn, clock.realtime_to_emulated_ns(t, offset)))

    t_cut = 0
    step = spacing_us * 1000  # emulated ns
    t0 = clock.now_ns()
    try:
        for i in range(n):
            due = t0 + i * step
            while clock.now_ns() < due:
                drain()
                time.sleep(max(0.0, min(0.002, (due - clock.now_ns()) * clock.dilation() / 1e9)))
            if i == cut_at:
                t_cut = clock.now_ns()
                cut()
            tx.send(tpl.packet(0x0A, i, bytes(256), ext=fast.reth(0, 0, 256)))
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            drain()
            time.sleep(0.01)
    finally:
        tx.close()
        rx.close()
    return got, t_cut


def judge_user(recs: list[dict[str, Any]], dilation: float, lo: int, hi: int,
               blackout_us: float | None = None) -> dict[str, Any]:
    """The run's fidelity over the stream: the links as ``scenario.fidelity`` judges them, and
    the agent host's loop lag, which its monitor measured on the real clock here (this loop is
    not on the emulated one), put on the emulated clock (divided by the factor) before the
    threshold is applied: ``scenario.fidelity.threshold`` (2 ms of real time, bounded by the
    run's figure, the blackout at the cut, when it is one)."""
    figure = ("blackout_us", blackout_us) if blackout_us else None
    # with no figure (a blackout of 0) the real-time rule, not 2 ms emulated: a run whose agent
    # host was 90 ms behind (4.5 us emulated at N = 20,000) was marked valid so
    th = threshold(dilation, real_us=DEFAULT_REAL_THRESHOLD_US, figure=figure)
    links = judge_links(merge_links(recs, lo, hi), threshold_us=th.us)
    procs = merge(recs, lo, hi)
    host = procs.get("agent-host")
    lag_us = host.quantile_us(0.99) / dilation if host is not None and host.samples else None
    valid = links["valid"] and lag_us is not None and lag_us < th.us
    note = (f"agent host p99 lag {'unknown' if lag_us is None else lag_text(lag_us, dilation)} "
            f"(threshold {lag_text(th.us, dilation)}: {th.basis}); "
            + ("every link kept to the model" if links["valid"] else
               "; ".join(f"link {n} fell behind: {why}" for n, why in sorted(links["behind"].items()))))
    return {"valid": valid, "note": note, "lag_us": lag_us, "threshold_us": th.us}


def one_user(engine: str, tmp: Path, dilation: float, spacing_us: float, frames: int) -> dict[str, Any]:
    """The near cut on the user datapath at ``dilation`` (module docstring); emulated figures."""
    topo = generate("fat-tree", k=4)
    lag = tmp / "lag.jsonl"
    os.environ[lagmon.ENV_LOG] = str(lag)
    try:
        live = LiveFabric(topo, tmp, scenario="bench-local-failover-user", datapath="user")
        # as ``ibemu run`` has it: no per-node sysfs trees, whose refresh (a netlink dump per host,
        # twice a second) once held the agent host's loop 101 ms in a stream (timed by hand)
        live.rt.sysfs = False
        with live as fab:
            run = Run(fab, tmp, engine)
            try:
                run.wait_sm("subnet_up", timeout_s=120)
                assert fab.rt.fabric is not None
                dlid = run.lid("h15")

                def edge(fn: Any) -> Any:
                    return trio.from_thread.run_sync(lambda: fn(fab.rt.host.nodes["edge0_0"].agent),  # type: ignore[union-attr]
                                                     trio_token=fab.token)

                deadline = time.monotonic() + 90
                while engine.endswith("_ar") and not edge(lambda a: a.alternates_of(dlid)):
                    if time.monotonic() > deadline:  # the SM writes the alternates after the LFTs
                        raise NotReady("the SM wrote no alternates for h15 at edge0_0")
                    time.sleep(0.05)
                for _ in range(10):  # the SM's last passes (groups, FailoverConfig) may still be under way
                    got_n = run.blast(100)
                    if got_n == 100:
                        break
                    time.sleep(0.5)
                else:
                    raise NotReady(f"the fabric does not carry the stream before the cut ({got_n} of 100)")
                port = edge(lambda a: a.lft.lookup(dlid))
                if port not in (3, 4):  # an up-port of the edge (h15 is in another pod)
                    raise NotReady(f"edge0_0 routes h15 by port {port}")
                fabric = fab.rt.fabric
                # from here on the run's clock is dilated; the emulated clock goes on from this
                # instant (epoch = now: both clocks agree there), so the model's past stays put
                clock.configure(dilation, time.monotonic_ns())
                # the lag monitor reports an interval a second (real): the one the stream starts
                # in then holds none of the bring-up's lag at dilation 1 (which it did after 0.2 s)
                time.sleep(lagmon.REPORT_S + 0.2)
                t_start = clock.now_ns()
                got, t_cut = probe_stream(fab, run.lid("h1"), dlid, frames, spacing_us, frames // 4,
                                          lambda: fabric.links.set_up(fab.ns("edge0_0"), topo.ifname("edge0_0", port), False))
                t_end = clock.now_ns()
                rr = run.wait_sm("reroute", timeout_s=60)[0]
                trio.from_thread.run_sync(lambda: fab.rt.host.links.report_links(final=True),  # type: ignore[union-attr]
                                          trio_token=fab.token)
                recs = [json.loads(x) for x in lag.read_text().splitlines()] if lag.exists() else []
                programmed = clock.to_emulated_ns(rr["t_programmed"])
                reroutes = [(clock.to_emulated_ns(r["t_programmed"]) - t_cut) / 1000 for r in run.sm_events("reroute")]
            finally:
                run.close()
                clock.configure(1)
    finally:
        os.environ.pop(lagmon.ENV_LOG, None)
    arrivals = sorted(t for _, t in got)
    after = [t for t in arrivals if t >= t_cut]
    before = [t for t in arrivals if t < t_cut]
    gaps = [b - a for a, b in zip(([before[-1]] if before else []) + after, after, strict=False)]
    longest = max(0.0, (max(gaps, default=0) - spacing_us * 1000) / 1000)
    # at the cut: the first frame sent after the cut that arrived, against the arrival before it
    cut_at = frames // 4
    first = min((t for p, t in got if p >= cut_at), default=None)
    prior = max((t for t in arrivals if first is not None and t < first), default=None)
    at_cut = None if first is None or prior is None else max(0.0, (first - prior - spacing_us * 1000) / 1000)
    fid = judge_user(recs, dilation, t_start, t_end, at_cut)
    return {"blackout_us": at_cut, "longest_silence_us": longest,
            "first_after_cut_us": None if first is None else (first - t_cut) / 1000,
            "reroutes_programmed_us": reroutes,
            "frames_lost": float(frames - len({p for p, _ in got})),
            "cut_to_sm_programmed_us": (programmed - t_cut) / 1000,
            "valid": fid["valid"], "note": fid["note"], "host_lag_us": fid["lag_us"],
            "threshold_us": fid["threshold_us"]}


def main_user(args: argparse.Namespace) -> None:
    rows: dict[str, list[dict[str, Any]]] = {"ftree_ar": [], "ftree": []}
    for i in range(args.runs):
        for engine in rows:
            r = fresh_attempts(f"run {i + 1} {engine}", "bench-lfo-user-",
                               lambda tmp, engine=engine: one_user(engine, tmp, args.dilation, args.spacing_us,
                                                                   args.frames))
            rows[engine].append(r)
            print(f"  run {i + 1} {engine}: {r}", file=sys.stderr, flush=True)
    print(f"Cable cut (the sender's edge uplink) under a probe stream h1 -> h15 (k=4 fat-tree, IB user datapath, "
          f"dilation {args.dilation:g}, a frame every {args.spacing_us:g} us emulated, {args.frames} frames; "
          f"load average {os.getloadavg()[0]:.1f}): min / median / max over the runs the fidelity monitor marked valid")
    print(f"  {'figure (emulated)':<28} {'ftree_ar (local failover)':>28} {'ftree (SM only)':>28}")
    for k in ("blackout_us", "longest_silence_us", "first_after_cut_us", "cut_to_sm_programmed_us", "frames_lost"):
        cells = []
        for engine in rows:
            vals = [r[k] for r in rows[engine] if r["valid"] and r[k] is not None]
            fmt = "{:.0f}" if k == "frames_lost" else "{:.1f}"
            cells.append("-" if not vals else " / ".join(fmt.format(v) for v in
                                                         (min(vals), statistics.median(vals), max(vals))))
        print(f"  {k:<28} {cells[0]:>28} {cells[1]:>28}")
    for engine in rows:
        bad = [r for r in rows[engine] if not r["valid"]]
        print(f"  {engine}: {len(rows[engine]) - len(bad)} of {len(rows[engine])} runs valid"
              + "".join(f"\n    invalid: {r['note']}" for r in bad))
    print("  (to scale: the local failover blackout, an upper bound of a switch's; not to scale: the SM's "
          "reroute, whose real CPU time dilation divides by N)")


def fresh_attempts(label: str, prefix: str, measure: Callable[[Path], dict[str, Any]], tries: int = 3) -> dict[str, Any]:
    """``measure`` on a fresh fabric in a temporary directory, again (up to ``tries`` times) when
    the fabric did not come up fit for the measurement (``NotReady``)."""
    for attempt in range(tries):
        try:
            with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
                return measure(Path(tmp))
        except NotReady as exc:
            print(f"  {label}: not ready ({exc}), attempt {attempt + 1} of {tries}", file=sys.stderr, flush=True)
    raise SystemExit(f"{label}: the fabric never came up fit for the measurement")


def main() -> None:
    if sys.argv[1:] == ["--probe-child"]:
        probe_child()
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh fabrics per engine (default 3)")
    ap.add_argument("--k", type=int, default=8, help="kernel datapath: the fat-tree's k (default 8)")
    ap.add_argument("--fault", choices=("cable", "spine"), default="cable",
                    help="kernel datapath: an edge-aggregation cable cut, or a spine switch dying")
    ap.add_argument("--flows", type=int, default=8, help="kernel datapath: probe flows per direction (default 8)")
    ap.add_argument("--probe-us", type=float, default=250.0,
                    help="kernel datapath: a probe frame per flow every this many us (default 250)")
    ap.add_argument("--datapath", choices=("kernel", "user"), default="kernel")
    ap.add_argument("--loss-of-signal", choices=("on", "off"), default="on",
                    help="kernel datapath: the injector tells the carrier thread of the cut at once (on, "
                         "default), or the kernel's link notifications alone tell (off)")
    ap.add_argument("--dilation", type=float, default=0.0, help="user datapath: the dilation factor (required)")
    ap.add_argument("--spacing-us", type=float, default=1.0, help="user datapath: the probe stream's spacing (emulated us)")
    ap.add_argument("--frames", type=int, default=400, help="user datapath: the probe stream's frames")
    ap.add_argument("--stall-ms", type=float, default=0.0,
                    help="kernel datapath: from the fault on, hold this process (the agents) this long at a time "
                         "(late answers to the SM; module docstring)")
    ap.add_argument("--stall-s", type=float, default=3.0, help="kernel datapath: for this long (default 3)")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs >= 1")
    if args.datapath == "user":
        if args.dilation < 1 or args.spacing_us <= 0 or args.frames < 8:
            ap.error("--datapath user needs --dilation N >= 1, --spacing-us > 0, --frames >= 8")
        main_user(args)
        return
    if args.dilation:
        ap.error("--dilation applies to --datapath user")
    if args.k < 4 or args.k % 2 or args.flows < 1 or args.probe_us < 20:
        ap.error("--k: an even number >= 4; --flows >= 1; --probe-us >= 20")
    if args.stall_ms < 0 or args.stall_s <= 0:
        ap.error("--stall-ms >= 0, --stall-s > 0")
    stall = GilStall(args.stall_ms / 1e3, args.stall_s) if args.stall_ms else None
    load0 = uptime()
    rows: dict[str, list[dict[str, Any]]] = {"ftree_ar": [], "ftree": []}
    for i in range(args.runs):
        for engine in rows:
            r = fresh_attempts(f"run {i + 1} {engine}", "bench-lfo-",
                               lambda tmp, engine=engine: one(engine, tmp, args.k, args.fault, args.flows,
                                                              args.probe_us, args.loss_of_signal == "on", stall))
            rows[engine].append(r)
            brief = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items() if k not in ("flows", "groups")}
            print(f"  run {i + 1} {engine}: {brief}", file=sys.stderr, flush=True)
    report(rows, args, load0, uptime())


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def mmm(vals: list[float], fmt: str = "{:.2f}") -> str:
    return "-" if not vals else " / ".join(fmt.format(v) for v in (min(vals), statistics.median(vals), max(vals)))


def report(rows: dict[str, list[dict[str, Any]]], args: argparse.Namespace, load0: str, load1: str) -> None:
    what = ("one edge-aggregation cable cut at the edge's end (edge0_0's up-port)" if args.fault == "cable"
            else "a spine (core) switch dying (switch_down: every port down, its agent silent)")
    print(f"{what}, k={args.k} fat-tree, kernel datapath, probe streams from a child process (a frame per flow "
          f"every {args.probe_us:g} us), {args.runs} fresh fabrics per engine; min / median / max; ibemu's own "
          f"real time at dilation 1; loss of signal "
          + ("told by the injector at the cut" if args.loss_of_signal == "on"
             else "left to the kernel's link notifications"))
    print(f"  load before: {load0}")
    print(f"  load after:  {load1}")
    idle = os.environ.get(cpus.IDLE_ENV) == "1" or cpus.idle_latency_us() is None
    print("  CPUs " + ("may halt between events" if idle else
                       "kept out of halt while each fabric ran (PM QoS 0 us, kernel.cpus.awake)"))
    if args.stall_ms:
        print(f"  this process held {args.stall_ms:g} ms at a time for {args.stall_s:g} s from the fault (--stall-ms)")
        for engine, runs in rows.items():
            print(f"  {engine}: the SM reported a partition after the fault in {sum(1 for r in runs if r['sm_partitions'])}"
                  f" of {len(runs)} runs; no reroute within 30 s in {sum(1 for r in runs if not r['rerouted'])}")
    groups = list(rows["ftree_ar"][0]["groups"]) if rows["ftree_ar"] else []
    labels = {"up": "flows out through the cable (the edge's alternates)",
              "down": "flows in through the cable (fault notices)", "all": "flows across the spine"}
    print(f"  {'figure':<34} {'ftree_ar (local failover)':>30} {'ftree (SM only)':>30}")
    for g in groups:
        print(f"  {labels.get(g, g)}, per flow over all runs:")
        for key, name in (("blackout_ms", "blackout (ms)"), ("blackout_low_ms", "blackout, lower bound (ms)"),
                          ("resume_ms", "resume after fault (ms)"),
                          ("told_ms", "fault -> a bystander told (ms)"),
                          ("port_down_ms", "fault -> carrier thread saw (ms)"),
                          ("notice_moved_ms", "fault -> its LID moved (notices)"),
                          ("resume_after_port_ms", "resume after thread saw (ms)")):
            cells = []
            for engine in rows:
                vals = [r["flows"][j][key] for r in rows[engine] for j in r["groups"].get(g, [])
                        if r["flows"][j].get(key) is not None]
                cells.append(mmm(vals))
            if cells != ["-", "-"]:
                print(f"    {name:<32} {cells[0]:>30} {cells[1]:>30}")
        cells = []
        for engine in rows:
            flows = [r["flows"][j] for r in rows[engine] for j in r["groups"].get(g, [])]
            ok = sum(1 for f in flows if f["resume_ms"] is not None and f["resume_ms"] <= 2.0)
            lost = sum(f["lost"] for f in flows)
            never = sum(1 for f in flows if f["blackout_ms"] is None)
            ok_port = sum(1 for f in flows if f.get("resume_after_port_ms") is not None and f["resume_after_port_ms"] <= 2.0)
            cells.append(f"{ok}/{len(flows)} ({ok_port} after port) <=2ms, {lost} lost" + (f", {never} silent" if never else ""))
        print(f"    {'resumed within 2 ms; frames lost':<32} {cells[0]:>30} {cells[1]:>30}")
        cells = [mmm([r["flows"][j]["interval_us"] for r in rows[engine] for j in r["groups"].get(g, [])], "{:.0f}")
                 for engine in rows]
        print(f"    {'probe interval achieved (us)':<32} {cells[0]:>30} {cells[1]:>30}")
        cells = [mmm([statistics.median([r["flows"][j]["blackout_ms"] for j in r["groups"].get(g, [])
                                         if r["flows"][j]["blackout_ms"] is not None] or [float("nan")])
                      for r in rows[engine]]) for engine in rows]
        print(f"    {'median blackout of a run (ms)':<32} {cells[0]:>30} {cells[1]:>30}")
    keys = ("cut_to_carrier_seen_ms", "cut_to_map_written_ms", "seen_to_written_ms", "cut_to_last_carrier_seen_ms",
            "cut_to_last_map_written_ms", "cut_to_agent_notified_ms", "cut_to_trap_sent_ms", "cut_to_sm_trap_ms",
            "cut_to_first_notice_sent_ms", "cut_to_first_notice_move_ms", "cut_to_last_notice_move_ms",
            "notice_moves", "notice_moves_in_kernel", "cut_to_sm_routed_ms", "cut_to_sm_programmed_ms")
    print("  steps, per run (fault = the cut, AgentHost.set_ports' stamp):")
    for k in keys:
        cells = [mmm([r[k] for r in rows[engine] if k in r], "{:.3f}") for engine in rows]
        if cells != ["-", "-"]:
            print(f"    {k:<32} {cells[0]:>30} {cells[1]:>30}")


if __name__ == "__main__":
    main()
