#!/usr/bin/env python3
"""How often the built-in default scenario keeps up with its clock on this machine.

Runs ``scenarios/default.yaml`` (``ibemu run``'s main job) ``--runs`` times at each
``--dilation`` and prints, per factor, how many runs the fidelity monitor judged valid and
each process's p99 lag (min .. max over the runs, in emulated ms) against the threshold.
Every run is a whole run: build, SM, 16 s of traffic (times the factor in real time),
two cable faults, teardown (~25 s at dilation 1).

Run: sudo .venv/bin/python benchmarks/bench_default_fidelity.py [--runs 3] [--dilation 1 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from ibemu import clock
from ibemu.kernel.timerfd import run_trio
from ibemu.scenario import load_builtin
from ibemu.scenario.fidelity import lag_text
from ibemu.scenario.runner import ScenarioRun


def one(dilation: float, out: Path) -> dict[str, Any]:
    scen = load_builtin()
    clock.configure(dilation)  # as `ibemu run --dilation N` does
    result: dict[str, Any] = run_trio(ScenarioRun(scen, out).run)
    return dict(result["fidelity"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per factor (default 3)")
    ap.add_argument("--dilation", type=float, nargs="+", default=[1.0], help="factors (default 1)")
    args = ap.parse_args()
    if args.runs < 1 or any(n < 1 for n in args.dilation):
        ap.error("--runs >= 1, every --dilation >= 1")
    print(f"Default scenario, {args.runs} runs per factor: runs judged valid, and each process's p99 lag "
          "(emulated ms, min .. max over the runs)")
    for n in args.dilation:
        fids = []
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="bench-default-") as tmp:
                fids.append(one(n, Path(tmp)))
            print(f"  dilation {n:g} run {i + 1}: valid={fids[-1]['valid']}", file=sys.stderr, flush=True)
        valid = sum(1 for f in fids if f["valid"])
        procs = sorted({p for f in fids for p in f["processes"]})
        lags = ", ".join(
            f"{p} {min(f['processes'][p]['p99_us'] for f in fids if p in f['processes']) / 1e3:.2f}"
            f"..{max(f['processes'][p]['p99_us'] for f in fids if p in f['processes']) / 1e3:.2f}"
            for p in procs)
        th = fids[0]["threshold_us"]
        print(f"  dilation {n:g}: valid {valid} of {len(fids)} (threshold {lag_text(th, n)}); "
              f"p99 lag: {lags}")


if __name__ == "__main__":
    main()
