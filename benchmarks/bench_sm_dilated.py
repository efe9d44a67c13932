#!/usr/bin/env python3
"""ibemu's SM bringing a fabric up under time dilation: real and emulated time to SUBNET UP.

Each run is ``ibemu run`` of a fabric with no traffic (by default the GPU cluster's:
``gpu-rails``, 4 servers, 2 rails, 1 spine, 4x NDR, user datapath, ibemu's SM with
``ftree_ar``; or ``--scenario FILE``, whose ``time.dilation`` is replaced), at each
``--dilation``; the run lasts ``--real-s`` seconds of real time once the SM is up. From the
SM's event log (``RUN/ibemu/events.jsonl``) and the fabric's (``RUN/events.jsonl``) it prints:
the SM's start to SUBNET UP in emulated time and in real time (x N), the cold sweeps it took,
its SMPs unanswered (``failed``), timed out and fallen back (LID-routed, then directed route),
the switches whose LinearFDBTop was written (``lft_top``: a switch with top 0 routes
nothing) and the answers dropped on the way (``smp_discard``), with the load average before
and after. A run that does not finish within ``--timeout`` real seconds is stopped (SIGINT,
as Ctrl-C: it tears its fabric down) and reported from what its logs hold.

``--root DIR`` runs another checkout (its ``ibemu`` on PYTHONPATH, as ``python -m
ibemu.cli.main``), to compare before and after a change with this script.

Run: sudo .venv/bin/python benchmarks/bench_sm_dilated.py [--dilation 100 20000] [--runs 1]
     [--scenario FILE] [--root DIR] [--timeout 180]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT = """
name: bench-sm-dilated
topology: {{generator: gpu-rails, servers: 4, rails: 2, spines: 1}}
defaults: {{rate: 4x NDR, cable_m: 2}}
fabric: {{kind: ib, datapath: user}}
sm: {{impl: ibemu, engine: {engine}}}
duration_s: {duration:.9f}
time: {{dilation: {n}}}
"""


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line cut short by a stopped run
            out.append(json.loads(line))
    return out


def scenario_text(args: argparse.Namespace, n: int) -> str:
    if args.scenario is None:
        return DEFAULT.format(engine=args.engine, duration=args.real_s / n, n=n)
    text = args.scenario.read_text()
    text, k = re.subn(r"dilation:\s*[0-9.]+", f"dilation: {n}", text)
    if not k:
        raise SystemExit(f"{args.scenario}: no time.dilation to replace")
    return text


def one(args: argparse.Namespace, n: int, tmp: Path) -> dict[str, Any]:
    scen = tmp / f"s{n}.yaml"
    scen.write_text(scenario_text(args, n))
    out = tmp / f"out{n}-{time.monotonic_ns()}"
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ibemu.cli.main", "run", str(scen), "--out", str(out),
                             "--no-plots"], cwd=args.root, env={**os.environ, "PYTHONPATH": str(args.root)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = False
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        stopped = True
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    wall = time.monotonic() - t0
    sm = events(out / "run" / "ibemu" / "events.jsonl")
    fabric = events(out / "run" / "events.jsonl")
    start = next((r["t_ns"] for r in sm if r["kind"] == "sm_start"), None)
    up = next((r["t_ns"] for r in sm if r["kind"] == "subnet_up"), None)
    smps: dict[str, int] = {}
    for r in sm:
        if r["kind"] == "sweep_end":
            for k, v in r.get("smps", {}).items():
                smps[k] = smps.get(k, 0) + v
    m = re.search(r"\[\s*([\d.]+)s\] sm\s", err)
    return {
        "n": n, "load": (load0, os.getloadavg()[0]), "wall_s": wall, "stopped": stopped,
        "up_emulated_s": None if start is None or up is None else (up - start) / 1e9,
        "run_sm_phase_s": float(m.group(1)) if m else None,
        "cold_sweeps": sum(1 for r in sm if r["kind"] == "sweep_start" and r["reason"] == "cold"),
        "failed": smps.get("failed", 0), "timeouts": smps.get("timeouts", 0),
        "fell_back": smps.get("fell_back", 0),
        "tops": len({r["node"] for r in fabric if r["kind"] == "lft_top" and r.get("top", 0) > 0}),
        "switches": len({r["node"] for r in fabric if r["kind"] == "lid_assigned" and "port" not in r}),
        "discards": sum(1 for r in fabric if r["kind"] == "smp_discard"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dilation", type=int, nargs="+", default=[100, 20_000])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--engine", default="ftree_ar")
    ap.add_argument("--scenario", type=Path, help="a scenario file instead of the built-in fabric")
    ap.add_argument("--real-s", type=float, default=1.0, help="the built-in scenario's duration, real seconds")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--timeout", type=float, default=180.0, help="real seconds before a run is stopped")
    args = ap.parse_args()
    args.root = args.root.resolve()
    print(f"checkout {args.root}; scenario {args.scenario or 'gpu-rails 4x2, 4x NDR, user datapath'}, "
          f"engine {args.engine if args.scenario is None else '(the file)'}")
    print("    N  load        SUBNET UP: emulated      x N = real   run's sm phase  cold sweeps  "
          "failed  timeouts  fell back  tops/switches  discards  run s")
    with tempfile.TemporaryDirectory(prefix="bench-sm-dilated-") as tmp:
        for _ in range(args.runs):
            for n in args.dilation:
                r = one(args, n, Path(tmp))
                up = r["up_emulated_s"]
                up_s = "never" if up is None else f"{up * 1e6:,.1f} us"
                real_s = "-" if up is None else f"{up * n:,.2f} s"
                phase = "-" if r["run_sm_phase_s"] is None else f"{r['run_sm_phase_s']:.2f} s"
                stop = " (stopped)" if r["stopped"] else ""
                print(f"{n:>6,}  {r['load'][0]:4.1f}-{r['load'][1]:4.1f}  {up_s:>20}  {real_s:>12}  {phase:>14}  "
                      f"{r['cold_sweeps']:>11}  {r['failed']:>6}  {r['timeouts']:>8}  {r['fell_back']:>9}  "
                      f"{r['tops']:>6}/{r['switches']:<6}  {r['discards']:>8}  {r['wall_s']:5.1f}{stop}", flush=True)


if __name__ == "__main__":
    main()
