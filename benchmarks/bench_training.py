#!/usr/bin/env python3
"""Training steps on the emulated fabric against the step-time model (``ibemu.traffic.training``).

One data-parallel job on GPU servers wired rail-optimized (``gpu-rails``: ``--servers`` servers
of 8 H100s, ``--rails`` 4x NDR ports each), on the user datapath's link model at dilation
``--dilation``, for each fabric (IB with credits, RoCE with PFC) and allreduce algorithm
(hierarchical, ring). A step is a 1/``--scale`` model of the real one: compute time and gradient
bytes both divided, so the fabric part stays bandwidth-bound where the scale leaves enough bytes
per rail. Prints, per run: the fidelity verdict, the steps measured, the step and its fabric
part measured (emulated time, to scale: link rates and delays, transport timers) beside the
model's for the same scaled step, the rails' bus bandwidth against a rail's line rate, the
communication share and the scaling efficiency, measured and modelled, and the full-size
projection (the model's compute and NVLink with the measured fabric time x scale) beside the
model's full-size step and time to train.

The model's network latency per ring step is NCCL's (9.6 us, ``tuning.cc``); pass
``--net-latency-us`` to give the model the emulated fabric's instead. The NVLink phases are the
model's (they do not cross the fabric), so where they dominate the measured step follows the
model by construction: the figure that tests the fabric is ``fabric us``.

With ``--pool [POLICY ...]``: ``scenarios/gpu-pool.yaml`` (three jobs on eight servers, two
leaves) under each placement policy, and every job alone on the servers it got, on the first of
``--fabrics`` (ib, roce with PFC, roce-lossy); prints each
job's step and fabric time in the pool and alone, and the slowdown (pool / alone).

Run: sudo .venv/bin/python benchmarks/bench_training.py [--dilation N] [--scale S] [--fabrics ib roce]
     sudo .venv/bin/python benchmarks/bench_training.py --pool [topology packed spread]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ibemu import clock
from ibemu.kernel.timerfd import run_trio
from ibemu.scenario import loads_scenario
from ibemu.scenario.runner import ScenarioRun
from ibemu.scenario.schema import Scenario

POOL = Path(__file__).resolve().parents[1] / "scenarios" / "gpu-pool.yaml"

SCENARIO = """
name: bench-training-{label}
topology: {{generator: gpu-rails, servers: {servers}, rails: {rails}, spines: 1}}
defaults: {{rate: 4x NDR, cable_m: 2}}
fabric: {fabric}
{sm}gpus: {{model: H100, per_server: 8, rails: {rails}{net}}}
time: {{dilation: {dilation}}}
traffic:
  - {{name: job, kind: training, hosts: all, model: {model}, tokens_per_step: {tokens}, algorithm: {algorithm},
     overlap: {overlap}, scale: {scale}}}
duration_s: {duration}
"""
FABRICS = {"ib": "{kind: ib, datapath: user}", "roce": "{kind: roce, datapath: user, pfc: true}",
           "roce-lossy": "{kind: roce, datapath: user}"}


def run_one(label: str, fabric: str, algorithm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    net = f", net_latency_us: {args.net_latency_us:g}" if args.net_latency_us is not None else ""
    sm = "sm: {impl: ibemu, engine: updn}\n" if fabric == "ib" else ""  # RoCE: a fabric manager, no SM
    text = SCENARIO.format(label=label, servers=args.servers, rails=args.rails, fabric=FABRICS[fabric], sm=sm, net=net,
                           dilation=args.dilation, model=args.model, tokens=f"{args.tokens:.6e}",
                           algorithm=algorithm, overlap=args.overlap, scale=f"{args.scale:.6e}",
                           duration=args.duration)
    scen = loads_scenario(text, f"<{label}>")
    t0 = time.perf_counter()
    clock.configure(scen.time.dilation)  # as `ibemu run` does: every process of the run on this clock
    result: dict[str, Any] = run_trio(ScenarioRun(scen, out / label).run)
    print(f"  {label}: {time.perf_counter() - t0:.0f} s of real time", file=sys.stderr, flush=True)
    return result


def worker_lag(fidelity: dict[str, Any]) -> float:
    """The traffic workers' worst p99 lag behind the clock (emulated us): ibemu's own CPU, which a
    step's times carry; the verdict's 2 ms bound is far above the tens of us measured here."""
    return max((p["p99_us"] for name, p in fidelity.get("processes", {}).items() if name.startswith("traffic")),
               default=0.0)


def run_scenario(label: str, scen: Scenario, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    clock.configure(scen.time.dilation)
    result: dict[str, Any] = run_trio(ScenarioRun(scen, out / label).run)
    print(f"  {label}: {time.perf_counter() - t0:.0f} s of real time", file=sys.stderr, flush=True)
    return result


def pool(args: argparse.Namespace) -> None:
    """``scenarios/gpu-pool.yaml`` under each placement, and each job alone on the same servers."""
    rows: list[tuple[str, str, tuple[str, ...], dict[str, Any], dict[str, Any], bool, float, float]] = []
    alone: dict[tuple[str, tuple[str, ...]], tuple[dict[str, Any], bool, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        for policy in args.pool:
            text = POOL.read_text().replace("placement: topology", f"placement: {policy}")
            text = text.replace("dilation: 20000", f"dilation: {args.dilation}")
            if args.fabrics[0] != "ib":  # RoCE: routers and a fabric manager, no SM
                text = text.replace("fabric: {kind: ib, datapath: user}", f"fabric: {FABRICS[args.fabrics[0]]}")
                text = text.replace("sm: {impl: ibemu, engine: updn}\n", "")
            scen = loads_scenario(text, f"<pool-{policy}>")
            res = run_scenario(f"pool-{policy}", scen, Path(tmp))
            valid = bool(res["fidelity"]["valid"])
            for t, out in zip(scen.traffic, res["traffic"], strict=True):
                key = (t.name, t.hosts)
                if key not in alone:
                    one = dataclasses.replace(scen, traffic=(t,))
                    r1 = run_scenario(f"alone-{t.name}-{'-'.join(t.hosts)}", one, Path(tmp))
                    alone[key] = (r1["traffic"][0], bool(r1["fidelity"]["valid"]) and not r1["traffic"][0].get("error"),
                                  worker_lag(r1["fidelity"]))
                a, a_ok, a_lag = alone[key]
                rows.append((policy, t.name, t.hosts, out, a, valid and a_ok and not out.get("error"),
                             worker_lag(res["fidelity"]), a_lag))
    load = os.getloadavg()
    print(f"GPU pool ({POOL.name}, fabric {args.fabrics[0]}): 3 jobs on 8 H100 servers, 2 leaves of 4, one spine; "
          f"dilation {args.dilation:,}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("  emulated time, to scale; slowdown = the job's step (fabric part) in the pool over alone on the same servers;")
    print("  lag: the traffic workers' worst p99 lag behind the clock (emulated us; the pool run's, alone's);")
    print("  resent: the job's retransmitted packets in the pool; dropped, pauses: RoCE routers' (the whole pool run)")
    print(f"  {'placement':<9} {'job':<3} {'servers':<24} {'leaves':>6} {'step us':>8} {'alone':>8} {'slowdown':>8} "
          f"{'fabric us':>9} {'alone':>8} {'slowdown':>8} {'verdict':<8} {'lag us':>6} {'alone':>6} {'resent':>6} "
          f"{'dropped':>7} {'pauses':>6}")
    for policy, name, hosts, out, a, ok, lag, a_lag in rows:
        x, y = out.get("extra", {}), a.get("extra", {})
        if "step_s" not in x or "step_s" not in y:
            print(f"  {policy:<9} {name:<3} {','.join(hosts):<24} no step measured {out.get('error') or ''}")
            continue
        leaves = len({int(h.split("_")[0][1:]) // 4 for h in hosts})
        print(f"  {policy:<9} {name:<3} {','.join(h.split('_')[0] for h in hosts):<24} {leaves:6d} "
              f"{x['step_s'] * 1e6:8.1f} {y['step_s'] * 1e6:8.1f} {x['step_s'] / y['step_s']:7.2f}x "
              f"{x['fabric_s'] * 1e6:9.1f} {y['fabric_s'] * 1e6:8.1f} {x['fabric_s'] / y['fabric_s']:7.2f}x "
              f"{'valid' if ok else 'INVALID':<8} {lag:6.1f} {a_lag:6.1f} {x.get('retransmitted', 0):6,} "
              f"{x.get('router_dropped', 0):7,} {x.get('router_pause_sent', 0):6,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dilation", type=int, default=20000, help="time dilation (default 20000)")
    ap.add_argument("--duration", type=float, default=0.0006, help="emulated seconds of training (default 0.6 ms)")
    ap.add_argument("--servers", type=int, default=4, help="GPU servers (default 4)")
    ap.add_argument("--rails", type=int, default=2, help="4x NDR rails per server (default 2)")
    ap.add_argument("--model", default="llama2-7b", help="model preset (default llama2-7b)")
    ap.add_argument("--tokens", type=float, default=2.5e5, help="tokens per step (default 250k)")
    ap.add_argument("--overlap", type=float, default=0.0, help="overlap (default 0: every byte exposed)")
    ap.add_argument("--scale", type=float, default=1e4, help="scale-down of the step (default 1e4)")
    ap.add_argument("--net-latency-us", type=float, default=None, help="the model's network step latency")
    ap.add_argument("--fabrics", nargs="+", choices=list(FABRICS), default=["ib", "roce"])
    ap.add_argument("--algorithms", nargs="+", choices=["hierarchical", "ring"], default=["hierarchical", "ring"])
    ap.add_argument("--pool", nargs="*", choices=["topology", "packed", "spread"], default=None,
                    help="run scenarios/gpu-pool.yaml under these placements (none given: all three) instead")
    args = ap.parse_args()
    if args.pool is not None:
        args.pool = args.pool or ["topology", "packed", "spread"]
        pool(args)
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-training-") as tmp:
        for fabric in args.fabrics:
            for alg in args.algorithms:
                label = f"{fabric}-{alg}"
                result = run_one(label, fabric, alg, args, Path(tmp))
                job = next(t for t in result["traffic"] if t["kind"] == "training")
                rows.append((label, result["fidelity"], job))
    load = os.getloadavg()
    x0 = rows[0][2]["extra"]
    print(f"Training: {args.model}, {args.tokens:,.0f} tokens/step, {x0['gpus']} H100 on {args.servers} servers x "
          f"{args.rails} rails of 4x NDR (gpu-rails), overlap {args.overlap:g}, scale 1/{args.scale:g}, "
          f"dilation {args.dilation:,}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("  emulated time, to scale (link rates, delays, transport timers); us of the scaled step; lag: the traffic")
    print("  worker's p99 lag behind the clock (emulated us: ibemu's own CPU, which the measured step carries)")
    print(f"  {'run':<18} {'fidelity':<8} {'steps':>5} {'step us':>8} {'model':>8} {'fabric us':>9} {'model':>8} "
          f"{'busbw/rail':>10} {'comm':>6} {'model':>6} {'effic.':>6} {'model':>6} {'proj. step s':>12} "
          f"{'model s':>8} {'proj. days':>10} {'model':>8} {'lag us':>6}")
    for label, fid, job in rows:
        x = job["extra"]
        valid = bool(fid["valid"]) and not job.get("error")
        if "step_s" not in x:
            print(f"  {label:<18} {'valid' if valid else 'INVALID':<8} no step completed {job.get('error') or ''}")
            continue
        model_comm = 1 - x["compute_s"] / x["model_scaled_step_s"]
        print(f"  {label:<18} {'valid' if valid else 'INVALID':<8} {x['steps']:5d} {x['step_s'] * 1e6:8.1f} "
              f"{x['model_scaled_step_s'] * 1e6:8.1f} {x['fabric_s'] * 1e6:9.1f} {x['model_scaled_fabric_s'] * 1e6:8.1f} "
              f"{x['fabric_busbw_gbs']:5.1f}/{x['rail_gbs']:<4g} {x['comm_share'] * 100:5.1f}% {model_comm * 100:5.1f}% "
              f"{x['efficiency'] * 100:5.1f}% {(1 - model_comm) * 100:5.1f}% {x['projected_step_s']:12.3f} "
              f"{x['model_step_s']:8.3f} {x['projected_time_to_train_days']:10.1f} {x['model_time_to_train_days']:8.1f} "
              f"{worker_lag(fid):6.1f}")
        if not valid:
            print(f"    INVALID: {job.get('error') or fid['note']}")


if __name__ == "__main__":
    main()
