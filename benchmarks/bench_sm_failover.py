#!/usr/bin/env python3
"""SM takeover on a live fabric: how long from the master's death to a standby that is master
and has swept the subnet, for ibemu's SM and OpenSM in each role (root).

Each run is one scenario run (``ibemu run``'s code) on a fresh fabric: the master SM on h0
(priority 5), a standby on the last host (priority 1), a stream of 2,000 msg/s between two
hosts on different leaves; at 1 s the master's process is killed (``sm_down``), at 3 s it is
started again (``sm_up``: it finds the new master and stands by), at 4.5 s a leaf-spine cable
on the stream's path is cut (the new master must reroute it). Printed per pairing (master ->
standby), as ranges over the runs, in ms since the kill:

- ``silent``: the standby's first poll the master did not answer (ibemu's standby only:
  OpenSM does not log its polls at its default level);
- ``noticed``: the standby gave up on the master (ibemu's standby only);
- ``master``: it entered the MASTER state;
- ``swept``: its takeover sweep ended (OpenSM: its SUBNET UP);

beside them the configured polling (``poll_interval_ms`` x ``poll_retries``): the takeover is
mostly that wait, by design; what the emulator adds is the sweep after it. Also: the stream's
blackout across the kill (the switches keep their tables: none expected), what the restarted
(ibemu) master ends as (standby; master after a HANDOVER), and the cut's trap -> programmed
through the new master.

Run: sudo .venv/bin/python benchmarks/bench_sm_failover.py [--runs 3] [--poll-ms 200] [--retries 3]
     [--pairs ibemu:ibemu ibemu:opensm opensm:ibemu]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from ibemu.events import read_events
from ibemu.fabric import opensm
from ibemu.scenario.loader import loads_scenario
from ibemu.scenario.runner import ScenarioRun

SCENARIO = """
name: bench-sm-failover
topology: {{generator: leaf-spine, leaves: 2, spines: 2, hosts_per_leaf: 2}}
sm:
  impl: {master}
  host: h0
  priority: 5
  poll_interval_ms: {poll_ms}
  poll_retries: {retries}
  standby: {{host: h3, priority: 1, impl: {standby}}}
traffic:
  - {{name: s12, kind: stream, from: h1, to: h2, rate_pps: 2000}}
faults:
  - {{at_s: 1, action: sm_down}}
  - {{at_s: 3, action: sm_up}}
  - {{at_s: 4.5, action: link_down, link: "leaf1:3-spine0:2"}}
duration_s: 6
"""
PHASES = ("sm_silent", "sm_noticed", "sm_master", "sm_swept")


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


async def run_once(text: str, out: Path) -> tuple[ScenarioRun, dict[str, Any]]:
    scen = loads_scenario(text, "bench-sm-failover.yaml", out)
    run = ScenarioRun(scen, out / "out")
    return run, await run.run()


def summarize(run: ScenarioRun, result: dict[str, Any], master: str) -> dict[str, Any]:
    down, _up, cut = result["faults"]
    states = [(e.get("new"), e.get("reason")) for e in read_events(run.run_dir / master / "events.jsonl")
              if e.get("kind") == "sm_state"]
    end = states[-1] if master == "ibemu" and states else None  # the restarted master's last state
    flow = down["flows"][0] if down["flows"] else {}
    return {"phases": {p: down["phases_ms"].get(p) for p in PHASES},
            "blackout_ms": flow.get("blackout_ms"), "lost": flow.get("lost"),
            "restarted": None if end is None else "standby" if end[0] == "standby" else f"{end[0]} ({end[1]})",
            "cut_programmed": cut["phases_ms"].get("programmed"), "cut_trap": cut["phases_ms"].get("trap"),
            "valid": (result.get("fidelity") or {}).get("valid")}


def span(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    lo, hi = min(got), max(got)
    return f"{lo:,.0f}" if round(lo) == round(hi) else f"{lo:,.0f}-{hi:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--poll-ms", type=int, default=200, help="sm.poll_interval_ms")
    ap.add_argument("--retries", type=int, default=3, help="sm.poll_retries")
    ap.add_argument("--pairs", nargs="+", default=["ibemu:ibemu", "ibemu:opensm", "opensm:ibemu"],
                    help="master:standby")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    pairs = [tuple(p.split(":", 1)) for p in args.pairs]
    if any("opensm" in p for p in pairs) and not opensm.opensm_available():
        print("opensm is not installed (scripts/setup.sh installs it)", file=sys.stderr)
        return 2
    loads = [load()]
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sm-failover-") as tmp:
        for master, standby in pairs:
            got = []
            for i in range(args.runs):
                text = SCENARIO.format(master=master, standby=standby, poll_ms=args.poll_ms, retries=args.retries)
                run, result = trio.run(run_once, text, Path(tmp) / f"{master}-{standby}-{i}")
                got.append(summarize(run, result, master))
                print(f"{master} -> {standby} run {i + 1}: {got[-1]['phases']} (load {load()})",
                      file=sys.stderr, flush=True)
            rows.append((f"{master} -> {standby}", got))
            loads.append(load())
    lo, hi = (args.retries - 2) * args.poll_ms, args.retries * args.poll_ms + min(200, args.poll_ms)
    print(f"\nSM takeover, {args.runs} runs per pairing, poll {args.poll_ms} ms x {args.retries} retries "
          f"(by configuration a standby gives up {lo}-{hi} ms after the kill: its last failed poll goes out "
          f"{(args.retries - 1) * args.poll_ms} ms after the first that the master missed, which went out "
          f"within one interval of the kill, and waits up to its timeout); load average (1/5/15 min) over the "
          f"runs: {', '.join(loads)}\n")
    print("| master -> standby | silent | noticed | master | swept | configured polling | stream blackout at the "
          "kill ms (lost) | restarted master ends as | cut after takeover: trap / programmed ms | runs valid |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, got in rows:
        ph = {p: span([g["phases"][p] for g in got]) for p in PHASES}
        blackout = f"{span([g['blackout_ms'] for g in got])} ({sum(g['lost'] or 0 for g in got)})"
        ends = [g["restarted"] for g in got if g["restarted"]]
        stood = ", ".join(f"{e} x{ends.count(e)}" for e in sorted(set(ends))) or "-"
        cut = f"{span([g['cut_trap'] for g in got])} / {span([g['cut_programmed'] for g in got])}"
        valid = f"{sum(1 for g in got if g['valid'])}/{len(got)}"
        print(f"| {name} | {ph['sm_silent']} | {ph['sm_noticed']} | {ph['sm_master']} | {ph['sm_swept']} | "
              f"{args.poll_ms} ms x {args.retries} | {blackout} | {stood} | {cut} | {valid} |")
    print("\nms since the master was killed. silent: the standby's first unanswered poll; noticed: it gave up "
          "(both ibemu's standby only); master: it entered MASTER; swept: its takeover sweep ended "
          "(OpenSM: SUBNET UP). The figures are mostly the configured polling; swept - master is the "
          "emulated fabric's sweep. Stream blackout: the longest gap across the kill (the LFTs stay).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
