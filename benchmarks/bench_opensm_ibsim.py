#!/usr/bin/env python3
"""The unmodified OpenSM on ibemu's live fat-tree and on ibsim, side by side in one run (root).

Both sides run the same OpenSM binary with the options of ibemu's launcher
(``ibemu.fabric.opensm.start``: ``-F /dev/null -d2 -s 0 -R ENGINE``, every file in a work dir;
``-d2`` flushes the log line by line, ``-s 0`` leaves traps as the only trigger of a sweep),
on the same k-ary fat-tree: ibemu's live fabric (namespaces, veth cables, the agent host, OpenSM
on h0's MAD socket, pinned as ``FabricRuntime`` places its SM), and the same topology exported
to ibsim's format (``ibemu.topo.ibnetdiscover.dump``), run by Debian's ``ibsim`` with OpenSM on
h0's port through ``libumad2sim.so`` (``IBSIM_SOCKNAME`` unique to the run).

Measured on each side:

- cold bring-up: OpenSM process start -> the log's own stamp of SUBNET UP (``--runs`` fresh
  fabrics / fresh ibsim processes, the two sides in turn so that both see the machine's load
  alike; the fabric's build and ibsim's start are not counted);
- ``--cuts`` edge-aggregation cables (different cables, the same on both sides, shared out
  among the runs) cut one at a time, each restored before the next: fault -> first trap 128
  in OpenSM's log, and the issue's figure, trap -> SUBNET UP, both from OpenSM's own log
  stamps (``ibemu.fabric.opensm_log``). ibemu cuts with the cable's interface down on the edge
  switch (``links.set_up``: both ports lose carrier, both switches trap); ibsim with its
  console's ``Unlink "S-<guid>"[port]``, which sets both ports Down and sends trap 128 from
  both switches to the SM at once (``unlink_port`` in ibsim's sim_cmd.c; a switch whose LFT
  route to the SM crossed the cable drops its trap, on both fabrics), and restores with
  ``ReLink`` (trap 128 again). So both sides measure the same thing: two traps 128 -> OpenSM's
  heavy sweep -> SUBNET UP.

The live fabric writes no per-node sysfs trees, as ``ibemu run`` and ``bench_sm.py`` have it.

On ibsim no SMP crosses a cable: a switch answers within the simulator's one process. On ibemu
every SMP crosses the emulated cables and is answered by the switches (their eBPF SMA, or the
switch agents of this same process), so every ibemu figure includes ibemu's own CPU cost.

``--twin-cpu`` places the twin: on the fabric's CPU (the agent host's: ibemu's default, where
ibsim runs beside OpenSM too), on OpenSM's own (``IBEMU_MADTWIN_CPU=sm``), or ``both``, in turn
like ``--twin both``.

``--twin both`` (the default when ``make native`` built it) runs ibemu's side twice per run,
with OpenSM's MAD-socket slot served by the C twin (``kernel.madtwin``, the default of a
fabric) and by the agent host's Python path (``IBEMU_MADTWIN=0``), the order alternating
between runs; ``on`` / ``off`` run one of them. The twin's counters (SMPs it sent, answered,
timed out, forwarded to the agent host, bad frames) are printed per fabric.

Run: sudo .venv/bin/python benchmarks/bench_opensm_ibsim.py [--k 8] [--cuts 4] [--runs 3]
     [--engine ftree] [--twin both|on|off] [--twin-cpu fabric|sm|both] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py

from ibemu import clock
from ibemu.fabric import opensm, opensm_log
from ibemu.fabric.umad2sim import umad2sim_path
from ibemu.kernel import cpus, madtwin
from ibemu.topo import Topology, generate
from ibemu.topo import ibnetdiscover as ib

TARGET_RATIO = 1.5
SM_HOST = "h0"


def cables(topo: Topology, k: int, n: int) -> list[tuple[str, int]]:
    """``n`` different edge-aggregation cables as (edge switch, its uplink port), spread over
    pods, edge switches and uplinks (the first: edge0_0's first uplink)."""
    half = k // 2
    out: list[tuple[str, int]] = []
    for i in range(n):
        pod, edge, up = i % k, (i + i // k) % half, (i + i // (k * half)) % half
        name, port = f"edge{pod}_{edge}", half + 1 + up
        peer = topo.peer(name, port)
        assert peer is not None and peer.node.startswith("agg"), (name, port, peer)
        out.append((name, port))
    return out


@dataclass
class Side:
    """One fabric's figures."""

    name: str
    bringup_s: list[float] = field(default_factory=list)
    cuts: list[dict[str, Any]] = field(default_factory=list)
    twin: list[dict[str, int]] = field(default_factory=list)
    """The C twin's counters per fabric (ibemu, twin on)."""
    run_starts: list[int] = field(default_factory=list)
    """Where each run's cuts start in ``cuts``."""


class LogWatch:
    """OpenSM's log read incrementally: new bytes only, parsed when a SUBNET UP arrives (on the
    ibemu side the fabric's agents share this process, and a poll must cost them little)."""

    def __init__(self, path: Path) -> None:
        self.path, self.text, self._offset = path, "", 0
        self.changed = time.monotonic()

    def _read(self) -> bool:
        """New bytes read; True when they hold a SUBNET UP."""
        if not self.path.exists():
            return False
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        if chunk:
            self._offset += len(chunk)
            self.text += chunk.decode(errors="replace")
            self.changed = time.monotonic()
        return b"SUBNET UP" in chunk

    def reroute_after(self, t_fault: int, alive: Callable[[], bool], timeout_s: float = 30) -> dict[str, Any]:
        """The sweep of OpenSM that answered the first trap after ``t_fault`` (monotonic ns),
        once its SUBNET UP is in the log (``opensm_log.reroute_answering``: an earlier change's
        repeated trap may have started it; it is then timed from the trap after the fault).
        Before, a sweep begun by such a repeat just before the fault was never matched and the
        run stopped after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._read():
                events = opensm_log.parse(self.text.splitlines())
                e = opensm_log.reroute_answering(events, t_fault)  # a repeated trap may have begun it
                if e is not None:
                    e["fallback"] = any(x["kind"] == "routing_fallback" and x["t_ns"] >= t_fault
                                        and x["t_ns"] <= e["t_subnet_up"] for x in events)
                    return e
            self._check(alive, deadline, "trap -> SUBNET UP")
            time.sleep(0.02)

    def settle(self, alive: Callable[[], bool], quiet_s: float = 1.5, timeout_s: float = 30) -> None:
        """Until the log has been quiet for ``quiet_s`` with no sweep pending (no trap since the
        last SUBNET UP): ibemu's switches repeat a trap that found no route to the SM (the far
        end's, when the cut cable carried it) about 1 s later, and its sweep must not overlap
        the next cut. ibsim sends each trap once; both sides wait alike."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._read()
            tail = self.text[self.text.rfind("SUBNET UP"):]
            if "Received Generic Notice" not in tail and time.monotonic() - self.changed >= quiet_s:
                return
            self._check(alive, deadline, "a quiet log")
            time.sleep(0.05)

    def _check(self, alive: Callable[[], bool], deadline: float, what: str) -> None:
        if not alive():
            raise RuntimeError(f"OpenSM exited while waiting for {what}:\n{self.text[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} in OpenSM's log in time:\n{self.text[-2000:]}")


def cut_row(cable: tuple[str, int], t_fault: int, rr: dict[str, Any]) -> dict[str, Any]:
    return {"cable": f"{cable[0]}:{cable[1]}", "fault_to_trap_ms": (rr["t_trap"] - t_fault) / 1e6,
            "trap_to_routed_ms": None if rr["t_routed"] is None else (rr["t_routed"] - rr["t_trap"]) / 1e6,
            "trap_to_subnet_up_ms": (rr["t_subnet_up"] - rr["t_trap"]) / 1e6,
            "engine": rr["engine"], "fallback": rr["fallback"], "merged": rr.get("merged", False)}


# ---------------------------------------------------------------- ibsim

def proc_alive(proc: subprocess.Popen[bytes]) -> Callable[[], bool]:
    return lambda: proc.poll() is None


@contextmanager
def ibsim(netfile: Path, work: Path) -> Iterator[tuple[subprocess.Popen[bytes], dict[str, str]]]:
    """``ibsim -s`` on ``netfile`` with its console on a pipe; yields it and the environment its
    clients need."""
    sock = f"ibemu-bench-{os.getpid()}-{time.monotonic_ns()}"
    out = work / "ibsim.out"
    with out.open("wb") as fh:
        proc = subprocess.Popen(["ibsim", "-s", "-N", "4096", "-S", "1024", "-P", "32768", str(netfile)],
                                stdin=subprocess.PIPE, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "IBSIM_SOCKNAME": sock}, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while b"Network simulator ready" not in out.read_bytes():
            if proc.poll() is not None:
                raise RuntimeError(f"ibsim exited ({proc.returncode}):\n{out.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"ibsim not ready after 30 s:\n{out.read_text()[-2000:]}")
            time.sleep(0.05)
        yield proc, {**os.environ, "IBSIM_SOCKNAME": sock, "LD_PRELOAD": str(umad2sim_path()),
                     "OSM_TMP_DIR": str(work), "OSM_CACHE_DIR": str(work)}
    finally:
        opensm.stop(proc)  # before its console closes: ibsim would spin on the closed pipe
        if proc.stdin is not None:
            with suppress(OSError):
                proc.stdin.close()


def console(proc: subprocess.Popen[bytes], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode() + b"\n")
    proc.stdin.flush()


def ibsim_start_opensm(env: dict[str, str], host: str, work: Path, engine: str) -> subprocess.Popen[bytes]:
    """OpenSM with the launcher's options (``ibemu.fabric.opensm.start``) on ibsim's ``host``."""
    argv = ["opensm", "-F", "/dev/null", "-f", str(work / "opensm.log"), "--dump_files_dir", str(work),
            "-d2", "-s", "0", "-R", engine]
    return subprocess.Popen(argv, cwd=work, env={**env, "SIM_HOST": host}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def run_ibsim(topo: Topology, cuts: list[tuple[str, int]], engine: str, work: Path, side: Side) -> None:
    """One fresh ibsim, OpenSM brought up on it, then ``cuts``."""
    net = work / "fabric.ibnd"
    ib.dump(topo, net)
    host = f"H-{topo.node(SM_HOST).guid:016x}"
    placement = cpus.placement()
    side.run_starts.append(len(side.cuts))
    with ibsim(net, work) as (sim, env):
        cpus.pin_process(sim.pid, placement.agents)  # where ibemu's agent host runs
        t0 = clock.now_ns()
        proc = ibsim_start_opensm(env, host, work, engine)
        cpus.pin_process(proc.pid, placement.sm)  # where FabricRuntime puts its SM
        alive = proc_alive(proc)
        try:
            side.bringup_s.append(opensm.wait_subnet_up(proc, work, 60, started_ns=t0))
            watch = LogWatch(work / "opensm.log")
            watch.settle(alive)  # a sweep the bring-up's own traps started, if any
            for cable in cuts:
                node = f"S-{topo.node(cable[0]).guid:016x}"
                t_fault = clock.now_ns()
                console(sim, f'Unlink "{node}"[{cable[1]}]')
                side.cuts.append(cut_row(cable, t_fault, watch.reroute_after(t_fault, alive)))
                t_restore = clock.now_ns()
                console(sim, f'ReLink "{node}"[{cable[1]}]')
                watch.reroute_after(t_restore, alive)
                watch.settle(alive)
        finally:
            opensm.stop(proc)


# ---------------------------------------------------------------- ibemu

class LiveFabric(harness.LiveFabric):
    """ibemu's live fat-tree with OpenSM started on it (``FabricRuntime(sm="opensm")``)."""

    def __init__(self, topo: Topology, engine: str, tmp: Path) -> None:
        super().__init__(topo, tmp, scenario="bench-opensm-ibsim", ready_s=300, sm="opensm",
                         sm_host=SM_HOST, sm_engine=engine)
        # as ``ibemu run`` and bench_sm.py have it: no per-node sysfs trees, which are rewritten
        # after every port change in an unpinned worker thread (2.6 s of CPU in 9 s of sweeps,
        # on the SM's CPU beside OpenSM, timed with perf sched)
        self.rt.sysfs = False

    def alive(self) -> bool:
        proc = self.rt._sm_proc
        return proc is not None and proc.poll() is None


def run_ibemu(topo: Topology, cuts: list[tuple[str, int]], engine: str, work: Path, side: Side,
              mode: Mode) -> float:
    """One fresh live fabric, OpenSM brought up on it, then ``cuts``; returns the fabric's build
    time in seconds. ``mode``: OpenSM's slot served by the C twin (on which CPU), else by the
    Python path."""
    twin = mode.twin
    os.environ[madtwin.ENV] = "1" if twin else "0"
    os.environ[madtwin.CPU_ENV] = mode.twin_cpu
    side.run_starts.append(len(side.cuts))
    t_build = time.monotonic()
    with LiveFabric(topo, engine, work) as fab:
        assert fab.rt.sm_up_s is not None and fab.rt.fabric is not None
        side.bringup_s.append(fab.rt.sm_up_s)
        build_s = time.monotonic() - t_build - fab.rt.sm_up_s
        watch = LogWatch(work / "opensm" / "opensm.log")
        watch.settle(fab.alive)  # a sweep the bring-up's own traps started, if any
        links = fab.rt.fabric.links
        for cable in cuts:
            ns, ifname = fab.rt.plan.nodes[cable[0]].ns, topo.ifname(*cable)
            t_fault = clock.now_ns()
            links.set_up(ns, ifname, False)
            side.cuts.append(cut_row(cable, t_fault, watch.reroute_after(t_fault, fab.alive)))
            t_restore = clock.now_ns()
            links.set_up(ns, ifname, True)
            watch.reroute_after(t_restore, fab.alive)
            watch.settle(fab.alive)
        counters = fab.rt.mad_ports[SM_HOST].twin_counters()
        if twin and not counters.get("sent"):
            raise RuntimeError("the C twin was asked for but served nothing")
        side.twin.append(counters)
    return build_s


# ---------------------------------------------------------------- report

def span(vals: list[float], digits: int) -> str:
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return f"{lo:.{digits}f}" if f"{lo:.{digits}f}" == f"{hi:.{digits}f}" else f"{lo:.{digits}f}-{hi:.{digits}f}"


def median(vals: list[float | None]) -> float | None:
    known = [v for v in vals if v is not None]
    return statistics.median(known) if known else None


def summary(side: Side) -> dict[str, Any]:
    trap_up = [c["trap_to_subnet_up_ms"] for c in side.cuts]
    return {"bringup_s": side.bringup_s, "bringup_median_s": statistics.median(side.bringup_s),
            "trap_to_subnet_up_ms": trap_up, "trap_to_subnet_up_median_ms": statistics.median(trap_up),
            "trap_to_routed_median_ms": median([c["trap_to_routed_ms"] for c in side.cuts]),
            "fault_to_trap_ms": [c["fault_to_trap_ms"] for c in side.cuts], "cuts": side.cuts,
            "per_run_median_ms": per_run_medians(side), "twin": side.twin}


def per_run_medians(side: Side) -> list[float]:
    """trap -> SUBNET UP, the median of each run's cuts."""
    ends = [*side.run_starts[1:], len(side.cuts)]
    return [statistics.median(c["trap_to_subnet_up_ms"] for c in side.cuts[a:b])
            for a, b in zip(side.run_starts, ends, strict=True) if b > a]


LABELS = {"ibemu": "ibemu, C twin", "ibemu-twin-sm": "ibemu, C twin on OpenSM's CPU",
          "ibemu-python": "ibemu, Python path", "ibsim": "ibsim"}


@dataclass(frozen=True)
class Mode:
    """How ibemu's side serves OpenSM's slot: the C twin (on the fabric's CPU or OpenSM's) or
    the agent host's Python path."""
    twin: bool
    twin_cpu: str = "fabric"

    @property
    def name(self) -> str:
        if not self.twin:
            return "ibemu-python"
        return "ibemu" if self.twin_cpu == "fabric" else "ibemu-twin-sm"


def modes_of(twin: str, twin_cpu: str) -> tuple[Mode, ...]:
    """The variants of ibemu's side ``--twin`` and ``--twin-cpu`` ask for, in the order of the
    first run (the next runs alternate it)."""
    places = ("fabric", "sm") if twin_cpu == "both" else (twin_cpu,)
    out = [Mode(True, cpu) for cpu in places] if twin in ("both", "on") else []
    if twin in ("both", "off"):
        out.append(Mode(False))
    return tuple(out)


def report(k: int, engine: str, sides: list[Side], ibsim_side: Side, load: tuple[float, float]) -> dict[str, Any]:
    s = {side.name: summary(side) for side in [*sides, ibsim_side]}
    base = s["ibsim"]
    ratios = {side.name: s[side.name]["trap_to_subnet_up_median_ms"] / base["trap_to_subnet_up_median_ms"]
              for side in sides}
    n_cuts, n_runs = len(ibsim_side.cuts), len(ibsim_side.bringup_s)
    print(f"\nOpenSM {opensm_version()} (-R {engine}) on a k={k} fat-tree: {n_runs} cold bring-ups and "
          f"{n_cuts} edge-aggregation cable cuts per fabric; load average {load[0]:.1f} at the start, "
          f"{load[1]:.1f} at the end ({os.cpu_count()} CPUs)")
    print("\n| fabric | bring-up s (range) | fault -> trap ms (range) | trap -> routed ms (median) "
          "| trap -> SUBNET UP ms: median (range) | per run medians | ratio to ibsim: trap -> SUBNET UP "
          "(per run) (bring-up) |")
    print("|---|---|---|---|---|---|---|")
    for name in [*(side.name for side in sides), "ibsim"]:
        f = s[name]
        runs = f["per_run_median_ms"]
        if name == "ibsim":
            ratio = "1"
        else:
            per = [a / b for a, b in zip(runs, base["per_run_median_ms"], strict=False)]
            ratio = (f"{ratios[name]:.2f}x ({span(per, 2)}x) "
                     f"({f['bringup_median_s'] / base['bringup_median_s']:.2f}x)")
        mark = "*" if name != "ibsim" else ""
        routed = "-" if f["trap_to_routed_median_ms"] is None else f"{f['trap_to_routed_median_ms']:.0f}"
        print(f"| {LABELS.get(name, name)}{mark} | {span(f['bringup_s'], 2)} | {span(f['fault_to_trap_ms'], 1)} | "
              f"{routed} | {f['trap_to_subnet_up_median_ms']:.0f} ({span(f['trap_to_subnet_up_ms'], 0)}) | "
              f"{', '.join(f'{v:.0f}' for v in runs)} | {ratio} |")
    for name, ratio in ratios.items():
        print(f"\ntarget ({LABELS.get(name, name)}): trap -> SUBNET UP within {TARGET_RATIO}x of ibsim's: "
              f"{'met' if ratio <= TARGET_RATIO else 'missed'} ({ratio:.2f}x)")
    for side in sides:
        if side.twin and any(side.twin):
            total = {key: sum(c.get(key, 0) for c in side.twin) for key in madtwin.COUNTERS
                     if key not in ("pending", "rtt_ns", "rtt_max_ns")}
            rtt = sum(c.get("rtt_ns", 0) for c in side.twin) / max(1, total["answered"]) / 1e3
            rtt_max = max(c.get("rtt_max_ns", 0) for c in side.twin) / 1e3
            print(f"C twin, {len(side.twin)} fabrics: " + ", ".join(f"{key} {v:,}" for key, v in total.items())
                  + f"; SMP round trip (send -> response read, real time) mean {rtt:.0f} us, max {rtt_max:.0f} us")
    print("* every ibemu figure includes ibemu's own CPU cost: OpenSM's SMPs cross the emulated cables "
          "and are answered by the switches (their eBPF SMA in the kernel, PortInfo Sets by the switch "
          "agents of this process); on ibsim a switch answers inside the simulator, no SMP crosses a cable.")
    print("bring-up: OpenSM process start -> SUBNET UP (its log's stamp); the fabric's build and "
          "ibsim's start are not counted. fault: the edge switch's interface down (ibemu, a netlink call "
          "from this process) / ibsim's console Unlink, which sends trap 128 from both switches; trap: the "
          "first trap 128 in OpenSM's log (a switch whose route to the SM crossed the cut cable cannot "
          "send its trap: for edge0_0's uplinks, h0's, OpenSM gets one trap on both fabrics); routed: its "
          "routing engine's \"tables configured\".")
    for side in [*sides, ibsim_side]:
        print(f"{LABELS.get(side.name, side.name)} per cut: " + "; ".join(
            f"{c['cable']} {c['trap_to_subnet_up_ms']:.0f} ms (routed "
            f"{'-' if c['trap_to_routed_ms'] is None else format(c['trap_to_routed_ms'], '.0f')}, "
            f"{c['engine']}{' after ' + engine + ' refused' if c['fallback'] else ''}"
            f"{', its sweep begun by an earlier trap' if c.get('merged') else ''})" for c in side.cuts))
    return {"k": k, "engine": engine, "opensm": opensm_version(), "loadavg_start_end": load,
            "target_ratio": TARGET_RATIO, "ratio_trap_to_subnet_up": ratios,
            "target_met": {name: r <= TARGET_RATIO for name, r in ratios.items()}, **s}


def opensm_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "opensm"], capture_output=True,
                             text=True, timeout=10, check=False).stdout
    except OSError:
        out = ""
    return out.strip() or "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=8, help="fat-tree arity (even)")
    ap.add_argument("--cuts", type=int, default=4, help="cables cut (and restored) one at a time per fabric")
    ap.add_argument("--runs", type=int, default=3,
                    help="fresh fabrics per side, ibsim and ibemu in turn; the cuts are shared out among them")
    ap.add_argument("--engine", default="ftree", help="OpenSM's routing engine (-R)")
    ap.add_argument("--twin", choices=("both", "on", "off"), default="both" if madtwin.available() else "off",
                    help="ibemu's side with OpenSM's slot on the C twin (on), on the Python path (off), or both "
                         "(default when the twin is built: both)")
    ap.add_argument("--twin-cpu", choices=("fabric", "sm", "both"), default="fabric",
                    help="the C twin on the fabric's CPU (the agent host's, ibemu's default, where ibsim runs "
                         "too), on OpenSM's (IBEMU_MADTWIN_CPU=sm), or both in turn")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--keep", type=Path, help="keep OpenSM's logs and ibsim's output in this (new) directory")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("root is needed (ibemu's fabric lives in network namespaces)", file=sys.stderr)
        return 2
    missing = [what for what, ok in (("opensm", opensm.opensm_available()), ("ibsim", shutil.which("ibsim") is not None),
                                     ("libumad2sim.so", umad2sim_path() is not None)) if not ok]
    if missing:
        print(f"missing: {', '.join(missing)} (scripts/setup.sh installs them)", file=sys.stderr)
        return 2
    if args.k < 2 or args.k % 2 or args.cuts < 1 or args.runs < 1:
        ap.error("--k must be even (>= 2), --cuts and --runs >= 1")
    if args.twin != "off" and not madtwin.available():
        ap.error(f"--twin {args.twin}: {madtwin.BINARY} is not built (make native)")

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # the same clean-up as Ctrl-C

    signal.signal(signal.SIGTERM, on_term)
    topo = generate("fat-tree", k=args.k)
    cut = cables(topo, args.k, args.cuts)
    try:
        # both sides with the CPUs out of halt, as ibemu's fabric keeps them while it runs
        # (``cpus.awake``): ibsim's figures would otherwise carry the wake-ups ibemu's no longer do
        with cpus.awake() as awake, tempfile.TemporaryDirectory(prefix="bench-opensm-ibsim-") as d:
            print("CPUs kept out of halt for both sides (PM QoS 0 us)" if awake
                  else "CPUs may halt between events (no PM QoS request)", file=sys.stderr, flush=True)
            tmp = Path(d) if args.keep is None else args.keep
            tmp.mkdir(parents=True, exist_ok=True)
            print(f"k={args.k}: cables {', '.join(f'{n}:{p}' for n, p in cut)}", file=sys.stderr, flush=True)
            ibsim_side = Side("ibsim")
            modes = modes_of(args.twin, args.twin_cpu)
            sides = {mode: Side(mode.name) for mode in modes}
            load0 = os.getloadavg()[0]
            for run in range(args.runs):  # interleaved: every fabric sees the machine's load alike
                mine = cut[run::args.runs]
                work = tmp / f"ibsim-{run}"
                work.mkdir()
                run_ibsim(topo, mine, args.engine, work, ibsim_side)
                for mode in (modes if run % 2 == 0 else modes[::-1]):
                    side = sides[mode]
                    work = tmp / f"{side.name}-{run}"
                    work.mkdir()
                    build_s = run_ibemu(topo, mine, args.engine, work, side, mode)
                    print(f"  run {run + 1}/{args.runs}: bring-up ibsim {ibsim_side.bringup_s[-1]:.3f} s, "
                          f"{LABELS[side.name]} {side.bringup_s[-1]:.3f} s (its fabric built in {build_s:.1f} s), "
                          f"trap -> SUBNET UP median ibsim {per_run_medians(ibsim_side)[-1]:.0f} ms, "
                          f"{LABELS[side.name]} {per_run_medians(side)[-1]:.0f} ms; {len(mine)} "
                          f"cut{'' if len(mine) == 1 else 's'} each", file=sys.stderr, flush=True)
            os.environ.pop(madtwin.ENV, None)
            os.environ.pop(madtwin.CPU_ENV, None)
            out = report(args.k, args.engine, list(sides.values()), ibsim_side, (load0, os.getloadavg()[0]))
    except KeyboardInterrupt:
        print("interrupted: every process and namespace this run started is gone", file=sys.stderr)
        return 130
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
