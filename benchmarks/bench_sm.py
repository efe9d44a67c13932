#!/usr/bin/env python3
"""ibemu's SM vs the real OpenSM on live fabrics (root): cold bring-up and reroute phases.

For each k: a fresh live fat-tree per run (same topology, agents, MAD sockets), then
``python -m ibemu.sm`` (one run per --windows value) and OpenSM (``-R minhop``) on h0, each
timed from process start to "SUBNET UP" (every port Active, every LFT acked). ibemu's own
sweep time (first SMP to SUBNET UP) is reported too, with the LFT entries the kernel did not
have yet at SUBNET UP and how long it took to get them (the agent host's ``lft_backlog``;
none since the LFT is a BPF map written when the SMA accepts a block), and the CPU the agent
host's thread (this process's fabric loop: the agents, their sends, the kernel SMA's images,
the event log) used from the SM's start to SUBNET UP. Then, on k=max,
``--cuts`` edge-aggregation cables are cut one at a time (and restored) under ibemu's SM, as
its fault injector cuts (``AgentHost.set_ports``: the carrier thread is told of the loss of
signal at both ends at the cut, before the interface is set down, not at the kernel's
notification), once
the kernel has every entry of the bring-up: trap received (``fault_to_trap_at_port_ms``: by
the kernel at the SM's port, ``sm.directport``'s stamp, before the SM process woke up and took
it; ``fault_to_trap_ms``: by the SM) -> rediscovered -> routed -> last LFT block acked (target <= 10 ms on k=8, <= 50 ms on k=16), and when the kernel forwarded on the
last new entry (``trap_to_kernel_ms``, the fabric's last ``lft_programmed``; ``trap_to_tc_ms``
while the LFT was tc filters written when the agents fell idle), and how long after the SM's
last ack that was (``kernel_after_ack_ms``; negative: before the ack reached the SM), and the
SM process's CPU from the trap to its last ack (``trap_to_programmed_cpu_ms``, the reroute's
``cpu_ms``: what other jobs on the machine do not inflate). With the
kernel SMA (``ibemu.kernel.sma``) the LFT Sets are answered in the kernel, which writes the
forwarding map before the GetResp leaves: no ``lft_programmed`` event, so
``trap_to_kernel_ms`` is the ack's time (an upper bound) and ``kernel_after_ack_ms`` 0;
IBEMU_KERNEL_SMA=0 measures the Python SMA on the same script. The
SM runs on a CPU of its own, as ``ibemu run`` places it (``ibemu.kernel.cpus``). The ibemu
package imported (and the SM process's) is the one on PYTHONPATH, so the same script
measures another checkout. ``--sm-port umad own`` runs each measurement with the SM's SMPs
through the agent host's MAD socket and then on the SM's own packet socket (``sm.directport``,
what ``ibemu run`` uses), side by side. The fabric writes no per-node sysfs trees, as
``ibemu run`` has it (``--sysfs``: it does, rewriting them after every port state change in a
worker thread). ``IBEMU_SM_STEER=0`` in the environment measures the SM without steering its
cable's far end (see ``python -m ibemu.sm``).
Run: sudo .venv/bin/python benchmarks/bench_sm.py [--k 4 8] [--windows 32 128] [--cuts 8]
     [--runs 3] [--engine ftree|minhop|updn] [--no-opensm] [--sm-port umad own] [--sysfs]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py

import ibemu
from ibemu.fabric import opensm
from ibemu.kernel import cpus
from ibemu.sm.transport import DEFAULT_MAX_IN_FLIGHT
from ibemu.topo import generate

REPO = Path(ibemu.__file__).resolve().parents[1]
"""The checkout whose ibemu runs the fabric: the SM process gets the same one."""


class LiveFabric(harness.LiveFabric):
    """A live fat-tree of ``k`` (the kernel datapath unless ``datapath`` says otherwise)."""

    datapath = "kernel"
    sysfs = False

    def __init__(self, k: int, tmp: Path) -> None:
        # the kernel frees the last fabric's namespaces (and, after an SM ran, its hundreds of
        # thousands of tc filters) in the background, holding the RTNL lock: a k=16 build right
        # after a k=16 run waits for that (see README)
        super().__init__(generate("fat-tree", k=k), tmp, scenario=f"bench-sm-k{k}",
                         ready_s=900 if k >= 16 else 120, datapath=self.datapath)
        # as ``ibemu run`` has it unless asked: the per-node sysfs trees are rewritten in a
        # worker thread after every port state change, on the CPUs the SM runs on
        self.rt.sysfs = self.sysfs


class Tail:
    """Reads a JSON-lines file incrementally (the fabric shares this process: no re-parsing)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.records = path, 0, []  # type: ignore[var-annotated]
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
            self.offset += len(chunk)
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            self.records += [json.loads(x) for x in lines if x.strip()]
        return self.records


_tails: dict[Path, Tail] = {}


def wait_for(path: Path, wanted: Callable[[dict[str, Any]], bool], what: str,
             proc: subprocess.Popen[bytes], timeout_s: float, *, new_only: bool = False) -> dict[str, Any]:
    """The first record of the SM's log that ``wanted`` accepts, as soon as it is there
    (``new_only``: among those not yet read). Each record is looked at once: this process
    is the fabric's too, and rescanning the whole log (10^4 records after a k=8 bring-up)
    every 5 ms took the agents' CPU in the middle of the reroutes being measured."""
    tail = _tails.setdefault(path, Tail(path))
    seen = len(tail.records) if new_only else 0
    deadline = time.monotonic() + timeout_s
    while True:
        records = tail.poll()
        for r in records[seen:]:
            if wanted(r):
                return r
        seen = len(records)
        if proc.poll() is not None:
            raise RuntimeError(f"ibemu SM exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} in {timeout_s} s")
        time.sleep(0.005)


def wait_kind(path: Path, kind: str, proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    return wait_for(path, lambda r: r["kind"] == kind, kind, proc, timeout_s)


def wait_trap_reroute(path: Path, t_fault: int, proc: subprocess.Popen[bytes], timeout_s: float) -> dict[str, Any]:
    """The first ``reroute`` that a trap after ``t_fault`` started (a light sweep's, with no
    trap, or an earlier one, does not count)."""
    return wait_for(path, lambda r: r["kind"] == "reroute" and isinstance(r.get("t_trap"), int)
                    and r["t_trap"] >= t_fault, "reroute after the fault", proc, timeout_s, new_only=True)


def wait_tc(fab: LiveFabric, timeout_s: float = 600) -> float:
    """Seconds until the kernel has every LFT entry the SMAs accepted (with tc filters, a k=16
    bring-up wrote ~500,000 after its SUBNET UP): a cut before then would be rerouted through
    agents that still forward in software, and its writes would queue behind the bring-up's."""
    t0 = time.monotonic()
    host = fab.rt.host
    assert host is not None
    quiet, t_quiet = 0, t0
    while quiet < 3:  # three looks in a row with nothing left; the time is the first of them
        now = time.monotonic()
        if host.lft_backlog == 0:
            t_quiet = now if quiet == 0 else t_quiet
            quiet += 1
        else:
            quiet = 0
        if now - t0 > timeout_s:
            raise RuntimeError(f"the kernel still {host.lft_backlog} LFT entries behind after {timeout_s} s")
        time.sleep(0.05)
    return t_quiet - t0


def start_sm(fab: LiveFabric, events: Path, window: int, engine: str, port: str = "own") -> subprocess.Popen[bytes]:
    """``port`` "own": the SM's own packet socket on its HCA's cable (as ``ibemu run`` starts
    it); "umad": every SMP through the MAD socket of the agent host."""
    argv = [sys.executable, "-m", "ibemu.sm", "--ns", fab.ns("h0"), "--events", str(events),
            "--engine", engine, "--max-in-flight", str(window), "--sweep-interval", "30",
            *(fab.rt.sm_direct_args() if port == "own" else [])]
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpus.pin_process(proc.pid, fab.rt.placement.sm)  # as FabricRuntime places its own SM
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def thread_cpu_s(tid: int) -> float:
    """CPU seconds thread ``tid`` of this process has run so far (``schedstat``: ns, kernel
    time in its system calls included)."""
    with open(f"/proc/self/task/{tid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``), start-up
    (imports) included."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sweep_phases(events: Path) -> str:
    """The cold sweep's steps, ms from the SM's start: where a bring-up spends its time."""
    marks = ("sweep_start", "discovered", "lids_assigned", "routes_computed", "lft_programmed",
             "ports_active", "subnet_up")
    seen: dict[str, int] = {}
    t0 = None
    with open(events) as f:
        for line in f:
            rec = json.loads(line)
            t0 = rec["t_ns"] if t0 is None else t0
            if rec.get("kind") in marks and rec["kind"] not in seen:
                seen[rec["kind"]] = rec["t_ns"]
            if rec.get("kind") == "subnet_up":
                break
    return ", ".join(f"{k} {(seen[k] - (t0 or 0)) / 1e6:.0f}" for k in marks if k in seen)


def ibemu_cold(k: int, window: int, engine: str, tmp: Path, port: str) -> dict[str, float]:
    with LiveFabric(k, tmp) as fab:
        events = tmp / f"sm-k{k}-w{window}-{time.monotonic_ns()}.jsonl"  # a window may be given twice
        agents = fab.agents_tid
        t0 = time.monotonic_ns()
        agents_cpu0 = thread_cpu_s(agents)
        proc = start_sm(fab, events, window, engine, port)
        try:
            up = wait_kind(events, "subnet_up", proc, 900)
            sm_cpu_s = cpu_seconds(proc.pid)
            agents_cpu_s = thread_cpu_s(agents) - agents_cpu0
            assert fab.rt.host is not None
            backlog = fab.rt.host.lft_backlog  # seen within ~5 ms of SUBNET UP
            wall = (up["t_ns"] - t0) / 1e9
            settle_s = wait_tc(fab)
            end = wait_kind(events, "sweep_end", proc, 10)
            sent = float(end["smps"].get("sent", 0))
            return {"wall_s": wall, "sweep_s": float(up["seconds"]), "smps": sent,
                    "retries": float(end["smps"].get("retries", 0)), "backlog": float(backlog),
                    "settle_s": settle_s, "lft_ops": float(fab.rt.host.lft_ops),
                    "sm_cpu_s": sm_cpu_s, "agents_cpu_s": agents_cpu_s, "phases": sweep_phases(events)}
        finally:
            stop(proc)


def opensm_cold(k: int, tmp: Path) -> float:
    with LiveFabric(k, tmp) as fab:
        work = tmp / f"opensm-k{k}"
        proc = opensm.start(fab.ns("h0"), work)
        cpus.pin_process(proc.pid, fab.rt.placement.sm)
        try:
            return opensm.wait_subnet_up(proc, work, timeout_s=120)
        finally:
            opensm.stop(proc)


def reroutes(k: int, cuts: int, engine: str, window: int, tmp: Path, port: str) -> list[dict[str, Any]]:
    """Cut (then restore) ``cuts`` edge-aggregation cables, one at a time, under ibemu's SM."""
    out: list[dict[str, Any]] = []
    half = k // 2
    with LiveFabric(k, tmp) as fab:
        events = tmp / f"sm-reroute-k{k}-{port}.jsonl"
        proc = start_sm(fab, events, window, engine, port)
        try:
            wait_kind(events, "subnet_up", proc, 600)
            settle_s = wait_tc(fab)
            print(f"  the kernel had every LFT entry {settle_s:.1f} s after SUBNET UP (the cuts start then)")
            held = cpus.idle_latency_us()
            print("  CPUs kept out of halt while the fabric runs (PM QoS 0 us, kernel.cpus.awake)" if held == 0
                  else f"  CPUs may halt between events (PM QoS latency {held} us; IBEMU_CPU_IDLE=1?)")
            assert fab.rt.fabric is not None
            host = fab.rt.host
            assert host is not None
            cpu0 = cpu_seconds(proc.pid)
            for i in range(cuts):
                pod, edge, up = 1 + i % (k - 1), i % half, i % half
                name, port = f"edge{pod}_{edge}", half + 1 + up
                # cut as ibemu's fault injector cuts (loss of signal told at the cut); stamped
                # as the request leaves
                t_fault = host.set_ports(name, [port], False)
                rr = wait_trap_reroute(events, t_fault, proc, 30)
                acks = [r["t_ns"] for r in _tails[events].records
                        if r["kind"] == "lft_block_acked" and rr["t_planned"] <= r["t_ns"] <= rr["t_programmed"]]
                time.sleep(0.2)
                # the fabric's side: when the kernel had the last of the new entries (the SM's
                # ack means the switch's SMA accepted the block)
                fabric_log = _tails.setdefault(tmp / "events.jsonl", Tail(tmp / "events.jsonl"))
                records = fabric_log.poll()
                applied = [r["t_ns"] for r in records if r["kind"] == "lft_programmed" and r["t_ns"] >= t_fault]
                lost = [r for r in records if r["kind"] == "carrier" and not r.get("up") and r["t_ns"] >= t_fault]
                near = min((r["t_ns"] for r in lost if r.get("node") == name), default=t_fault)
                far = min((r["t_ns"] for r in lost if r.get("node") != name), default=t_fault)
                sent = min((r["t_ns"] for r in records if r["kind"] == "trap_sent" and r["t_ns"] >= t_fault),
                           default=t_fault)
                # the first trap at the SM's port (the kernel's stamp, own port only), before the
                # SM process woke and took it
                at_port = min((r["t_port_ns"] for r in _tails[events].records
                               if r["kind"] == "trap" and r.get("t_port_ns", 0) >= t_fault), default=None)
                out.append({"cable": f"{name}:{half + 1 + up}",
                            "detect_near_ms": (near - t_fault) / 1e6, "detect_far_ms": (far - t_fault) / 1e6,
                            "fault_to_trap_sent_ms": (sent - t_fault) / 1e6,
                            "fault_to_trap_at_port_ms": (at_port - t_fault) / 1e6 if at_port else None,
                            "fault_to_trap_ms": (rr["t_trap"] - t_fault) / 1e6,
                            "trap_to_rediscovered_ms": (rr["t_rediscovered"] - rr["t_trap"]) / 1e6,
                            "rediscovered_to_routed_ms": (rr["t_routed"] - rr["t_rediscovered"]) / 1e6,
                            "routed_to_programmed_ms": (rr["t_programmed"] - rr["t_routed"]) / 1e6,
                            "trap_to_programmed_ms": (rr["t_programmed"] - rr["t_trap"]) / 1e6,
                            # the SM process's CPU over that (what other jobs on the machine
                            # do not inflate, as they do the wall time)
                            "trap_to_programmed_cpu_ms": rr.get("cpu_ms"),
                            "planned_to_first_ack_ms": (min(acks, default=rr["t_programmed"]) - rr["t_planned"]) / 1e6,
                            "first_to_last_ack_ms": (rr["t_programmed"] - min(acks, default=rr["t_programmed"])) / 1e6,

                            "trap_to_kernel_ms": (max(applied, default=rr["t_programmed"]) - rr["t_trap"]) / 1e6,
                            "kernel_after_ack_ms": (max(applied, default=rr["t_programmed"]) - rr["t_programmed"]) / 1e6,
                            "blocks": rr["blocks"]})
                t_restore = host.set_ports(name, [port], True)
                wait_trap_reroute(events, t_restore, proc, 30)
                time.sleep(0.3)
            # this process's CPU, not the machine's load: every cut and restore is a reroute
            print(f"  SM process CPU over the cuts: {(cpu_seconds(proc.pid) - cpu0) * 1e3 / (2 * cuts):.1f} ms "
                  f"per reroute ({2 * cuts} reroutes; idle and trap handling included)")
        finally:
            stop(proc)
            for line in events.read_text().splitlines()[::-1]:
                if '"sm_stop"' in line:
                    stop_rec = json.loads(line)
                    smps = stop_rec.get("smps", {})
                    port_stats = stop_rec.get("port") or {}
                    if port_stats:
                        print("  SM port: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(port_stats.items())))
                    print(f"  SM transport: {smps.get('sent', 0)} SMPs sent, "
                          f"{smps.get('lid_routed_sets', 0)} LFT Sets LID-routed "
                          f"({smps.get('lid_routed_fallback', 0)} fell back to directed route)")
                    break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--windows", type=int, nargs="+", default=[32, DEFAULT_MAX_IN_FLIGHT])
    ap.add_argument("--engine", default="ftree")
    ap.add_argument("--cuts", type=int, default=8)
    ap.add_argument("--runs", type=int, default=1, help="cold bring-ups per k and window")
    ap.add_argument("--reroute-window", type=int, default=DEFAULT_MAX_IN_FLIGHT)
    ap.add_argument("--no-opensm", action="store_true")
    ap.add_argument("--datapath", default="kernel", choices=["kernel", "user"])
    ap.add_argument("--sm-port", nargs="+", default=["umad", "own"], choices=["umad", "own"],
                    help="the SM's SMPs through the MAD socket (umad) or its own packet socket (own)")
    ap.add_argument("--sysfs", action="store_true",
                    help="keep the per-node sysfs trees (off by default, as in ``ibemu run``)")
    ap.add_argument("--keep", metavar="DIR", help="keep the event logs in DIR (default: a temporary directory)")
    args = ap.parse_args()
    LiveFabric.datapath = args.datapath
    LiveFabric.sysfs = args.sysfs
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp = Path(args.keep)
            tmp.mkdir(parents=True, exist_ok=True)
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-sm-")))
        for k in args.k:
            print(f"== fat-tree k={k}, {args.datapath} datapath: cold bring-up (process start -> SUBNET UP)")
            for port, w in ((p, w) for p in args.sm_port for w in args.windows):
                runs = []
                for _ in range(args.runs):
                    r = ibemu_cold(k, w, args.engine, tmp, port)
                    runs.append(r)
                    print(f"ibemu SM ({port:4s}) max_in_flight={w:4d}: {r['wall_s']:.3f} s "
                          f"(sweep {r['sweep_s']:.3f} s, {r['smps']:.0f} SMPs, {r['retries']:.0f} retries); "
                          f"at SUBNET UP {r['backlog']:.0f} LFT entries not yet in the kernel, "
                          f"all in {r['settle_s']:.2f} s ({r['lft_ops']:.0f} kernel writes)")
                    print(f"    SM process CPU {r['sm_cpu_s']:.2f} s to SUBNET UP, imports included "
                          f"({r['sm_cpu_s'] / max(r['smps'], 1) * 1e6:.0f} us per SMP sent); "
                          f"the agent host's thread {r['agents_cpu_s'] * 1e3:.0f} ms of CPU meanwhile; "
                          f"sweep steps (ms from SM start): {r['phases']}")
                if len(runs) > 1:
                    for key in ("wall_s", "sweep_s", "settle_s", "agents_cpu_s"):
                        vals = [x[key] for x in runs]
                        print(f"  median {key}: {statistics.median(vals):.3f} (range {min(vals):.3f}-{max(vals):.3f})")
            if not args.no_opensm and opensm.opensm_available():
                print(f"OpenSM 3.3 (-R minhop)       : {opensm_cold(k, tmp):.3f} s")
        for port in args.sm_port if args.cuts else ():
            k = max(args.k)
            print(f"== fat-tree k={k}: reroute of one edge-aggregation cable ({args.engine}, SM port: {port})")
            rows = reroutes(k, args.cuts, args.engine, args.reroute_window, tmp, port)
            for row in rows:
                print("  " + ", ".join(f"{key} {v:.2f}" if isinstance(v, float) else f"{key} {v}"
                                       for key, v in row.items()))
            for key in ("detect_near_ms", "detect_far_ms", "fault_to_trap_sent_ms", "fault_to_trap_at_port_ms",
                        "fault_to_trap_ms", "trap_to_rediscovered_ms", "rediscovered_to_routed_ms",
                        "routed_to_programmed_ms", "planned_to_first_ack_ms", "first_to_last_ack_ms",
                        "trap_to_programmed_ms", "trap_to_programmed_cpu_ms", "trap_to_kernel_ms",
                        "kernel_after_ack_ms"):
                vals = [float(r[key]) for r in rows if r.get(key) is not None]
                if not vals:
                    continue
                print(f"median {key}: {statistics.median(vals):.2f} (range {min(vals):.2f} to {max(vals):.2f})")


if __name__ == "__main__":
    main()
