#!/usr/bin/env python3
"""InfiniBand vs RoCEv2 side by side: ``ibemu compare`` on the two comparison scenarios.

- ``scenarios/compare-allreduce.yaml``: k=4 fat-tree, 16-rank ring allreduce of 1 MiB and a
  1,000 msg/s RC probe, an edge uplink cut at 4 s and restored at 8 s; IB (ibemu's SM, ftree)
  against lossless RoCE (ECMP routers, the fabric manager);
- ``scenarios/compare-lossy-ethernet.yaml``: the same allreduce, IB against RoCE whose every
  cable drops ``loss_pct`` of its frames each way; and, to tell the cost of the loss from the
  cost of RoCE itself on this machine, the same RoCE run with lossless cables (and any extra
  ``--loss`` levels);
- ``scenarios/compare-incast-ecn.yaml``: a 6-to-1 incast, IB against RoCE with ECN marking
  (1 Gb/s virtual queues, 64 KiB), CNPs and DCQCN, and the same RoCE run without ECN.

Prints each comparison's table, then one summary: the allreduce's time per iteration and bus
bandwidth on each fabric and the efficiency RoCE keeps (its busbw over IB's).

Run: sudo .venv/bin/python benchmarks/bench_ib_vs_roce.py [--duration S] [--loss 0.2 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from ibemu.cli.compare_cmd import variants
from ibemu.report.compare import compare, render
from ibemu.scenario import load_scenario
from ibemu.scenario.runner import ScenarioRun
from ibemu.scenario.schema import Scenario

ROOT = Path(__file__).resolve().parents[1] / "scenarios"


def run(scen: Scenario, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = trio.run(ScenarioRun(scen, out).run)
    print(f"  {scen.name} as {scen.fabric.kind} (loss {scen.fabric.loss_pct:g}%): "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return result


def ring(result: dict[str, Any]) -> dict[str, Any]:
    return next(t for t in result["traffic"] if t["kind"] == "allreduce")["extra"]


def print_incast(ib: dict[str, Any], ecn: dict[str, Any], plain: dict[str, Any]) -> None:
    print("\n6-to-1 incast into h0 (aggregate delivered Gb/s; RoCE congestion control counters)")
    print(f"  {'run':<30} {'Gb/s':>6} {'CE marked':>10} {'CNPs sent':>10} {'CNPs recv':>10} {'paced':>10}")
    for label, r in (("IB", ib), ("RoCE, ECN + DCQCN", ecn), ("RoCE, no ECN", plain)):
        t = r["traffic"][0]
        x = t["extra"]
        print(f"  {label:<30} {t['gbps']:6.3f} {x.get('ce_received', 0):10,} {x.get('cnp_sent', 0):10,} "
              f"{x.get('cnp_received', 0):10,} {x.get('tx_paced', 0):10,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=12.0, help="seconds of traffic per run")
    ap.add_argument("--loss", type=float, nargs="*", default=[], help="extra RoCE loss levels (percent)")
    args = ap.parse_args()
    summary: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    incast: tuple[dict[str, Any], ...] = ()
    with tempfile.TemporaryDirectory(prefix="bench-ib-roce-") as tmp:
        out = Path(tmp)
        for name in ("compare-allreduce", "compare-lossy-ethernet", "compare-incast-ecn"):
            scen = load_scenario(ROOT / f"{name}.yaml")
            v = variants(scen, args.duration)
            ib = run(v["ib"], out / name / "ib")
            roce = run(v["roce"], out / name / "roce")
            imp = {"loss_pct": v["roce"].fabric.loss_pct, "delay_us": v["roce"].fabric.delay_us}
            print(render(compare(ib, roce, imp)))
            if name == "compare-incast-ecn":
                plain = dataclasses.replace(v["roce"], fabric=dataclasses.replace(
                    v["roce"].fabric, ecn_mark_kb=0.0, ecn_line_gbps=0.0))
                incast = (ib, roce, run(plain, out / name / "roce-no-ecn"))
                continue
            summary.append((f"{name} (loss {imp['loss_pct']:g}%)", ib, roce))
            if name == "compare-lossy-ethernet":
                for loss in sorted({0.0, *args.loss} - {imp["loss_pct"]}):
                    other = dataclasses.replace(v["roce"], fabric=dataclasses.replace(v["roce"].fabric,
                                                                                       loss_pct=loss))
                    summary.append((f"{name} (loss {loss:g}%)", ib, run(other, out / name / f"roce-{loss:g}")))
    print("Ring allreduce, 16 ranks x 1 MiB (time per iteration, mean of the iterations run)")
    print(f"  {'run':<42} {'IB ms':>8} {'RoCE ms':>8} {'IB busbw':>9} {'RoCE busbw':>10} "
          f"{'efficiency':>10} {'RoCE resent':>11} {'wrong':>5}")
    for label, ib, roce in summary:
        a, b = ring(ib), ring(roce)
        eff = b["busbw_gbs"] / a["busbw_gbs"] if a.get("busbw_gbs") else float("nan")
        print(f"  {label:<42} {a['time_us'] / 1e3:8.1f} {b['time_us'] / 1e3:8.1f} {a['busbw_gbs']:9.4f} "
              f"{b['busbw_gbs']:10.4f} {eff * 100:9.1f}% {b.get('retransmitted', 0):11,} "
              f"{a['wrong'] + b['wrong']:5d}")
    if incast:
        print_incast(*incast)


if __name__ == "__main__":
    main()

