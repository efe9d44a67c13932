#!/usr/bin/env python3
"""Training steps on the emulated fabric against the step-time model (``ibemu.traffic.training``).

One data-parallel job on GPU servers wired rail-optimized (``gpu-rails``: ``--servers`` servers
of 8 H100s, ``--rails`` 4x NDR ports each), on the user datapath's link model at dilation
``--dilation``, for each fabric (IB with credits, RoCE with PFC) and allreduce algorithm
(hierarchical, ring, tree). A step is a 1/``--scale`` model of the real one: compute time and gradient
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

With ``--pipeline P [P ...]``: one job per stage count (``--tensor T``, ``--microbatches m``,
default 4P) on the first of ``--fabrics`` with the first of ``--algorithms``; prints the step
and its pipeline part (until the first stage's last backward pass) measured beside the model's
scaled ones, the model's bubble share, the pipeline's idle share (beyond its compute and TP
work: bubble and exposed transfers) measured and modelled, each stage's DP fabric time, the
bytes the pipeline moved a step and the wrong elements (0: every microbatch and sum exact).

With ``--failure``: ``scenarios/training-under-failure.yaml`` (a job on four servers of a
leaf-spine fabric; a leaf uplink down, back, then a spine down) twice a run, with local failover
(``ftree_ar``, ``fabric.local_failover``: the switches move destinations to their alternates by
themselves) and with SM-only recovery (``ftree``); prints per fault the job's step before it,
the stalled step, the gap between finished steps around the fault, the steps after it and how
many were slowed, the SM's reroute and the first local failover (ms after the fault), side by
side. Under dilation every process's CPU time is divided by the factor: the local failover is
an upper bound of hardware's, the SM's reroute is not to scale (its real 20-40 ms of CPU
become tenths of a ms), and the output says so. Each fault row says how far the step under way
had got (``into``) and whether that was in its compute (no frame of the job on the fabric) or
its communication.

The file runs at 1x SDR and dilation 100. ``--failure --ndr`` runs it at the rates and dilation
of the training tables instead: 4x NDR cables, dilation 20,000, the job at scale 1/10,000 (a
step of ~0.14 ms emulated, 2.8 s real: 86 us of compute and first NVLink phase, ~50 us of
fabric), every fault time and the duration divided by 40 (faults at 1, 2 and 3 ms, 4 ms in all:
6-7 steps before the first fault, 6-9 after each; ~85 s of real time a run, two variants in 3
minutes), and the job's RC
local ACK timeout 4.096 us x 2^7 = 0.52 ms (``rc_timeout: 7``, ~4 steps) instead of 67 ms: a
tail loss waits one timeout, and 67 ms would be ~500 steps, 22 minutes of real time; 0.52 ms
stays far above the fabric's round trip and the traffic worker's lag (a few us at p99) so that
only a lost frame fires it, and seven retries (3.7 ms) outlast ibemu's SM's reroute at this
dilation (a few us of emulated time), not a real SM's (20-40 ms: the QPs would give up first).
``--sm-delay-ms`` works with ``--ndr`` too (0.5 ms: 10 s of real time a fault); ``--save FILE``
keeps every run's result. ``--draw-faults SEED`` moves each fault of each run later by its own
draw from U(0, the model's scaled step), the same times for both variants of a run: with the
file's times a fault falls in the same part of a step every run (the cut in the compute), with
drawn ones anywhere; a last table gives the stalls by fault and by where it fell.

Every run prints its worst p99 lag (any process's, emulated us, and x dilation: real ms) so
that its figures can be judged again against another bound.

Run: sudo .venv/bin/python benchmarks/bench_training.py [--dilation N] [--scale S] [--fabrics ib roce]
        [--algorithms hierarchical ring tree]
     sudo .venv/bin/python benchmarks/bench_training.py --pool [topology packed spread]
     sudo .venv/bin/python benchmarks/bench_training.py --pipeline 1 2 4 [--tensor T] [--microbatches m]
     sudo .venv/bin/python benchmarks/bench_training.py --failure [--ndr] [--runs N] [--draw-faults SEED] [--save FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import statistics
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
FAILURE = Path(__file__).resolve().parents[1] / "scenarios" / "training-under-failure.yaml"

SCENARIO = """
name: bench-training-{label}
topology: {{generator: gpu-rails, servers: {servers}, rails: {rails}, spines: 1}}
defaults: {{rate: 4x NDR, cable_m: 2}}
fabric: {fabric}
{sm}gpus: {{model: H100, per_server: 8, rails: {rails}{net}}}
time: {{dilation: {dilation}}}
traffic:
  - {{name: job, kind: training, hosts: all, model: {model}, tokens_per_step: {tokens}, algorithm: {algorithm},
     overlap: {overlap}, scale: {scale}{extra}}}
duration_s: {duration}
"""
FABRICS = {"ib": "{kind: ib, datapath: user}", "roce": "{kind: roce, datapath: user, pfc: true}",
           "roce-lossy": "{kind: roce, datapath: user}",
           "roce-ecn": "{kind: roce, datapath: user, ecn_mark_kb: 16}"}
"""IB with credits; RoCEv2 with PFC (lossless), without (drop tail), and without PFC but with ECN
marking beyond 16 KiB queued and DCQCN at the hosts. ``--buffer-kb`` sets the RoCE routers' port
buffers (default 1 MiB)."""


def fabric_text(name: str, buffer_kb: float | None) -> str:
    text = FABRICS[name]
    if buffer_kb is not None and name.startswith("roce"):
        text = text[:-1] + f", buffer_kb: {buffer_kb:g}}}"
    return text


def run_one(label: str, fabric: str, algorithm: str, args: argparse.Namespace, out: Path,
            extra: str = "") -> dict[str, Any]:
    net = f", net_latency_us: {args.net_latency_us:g}" if args.net_latency_us is not None else ""
    sm = "sm: {impl: ibemu, engine: updn}\n" if fabric == "ib" else ""  # RoCE: a fabric manager, no SM
    text = SCENARIO.format(label=label, servers=args.servers, rails=args.rails, fabric=fabric_text(fabric, args.buffer_kb),
                           sm=sm, net=net,
                           dilation=args.dilation, model=args.model, tokens=f"{args.tokens:.6e}",
                           algorithm=algorithm, overlap=args.overlap, scale=f"{args.scale:.6e}",
                           duration=args.duration, extra=extra)
    scen = loads_scenario(text, f"<{label}>")
    t0 = time.perf_counter()
    clock.configure(scen.time.dilation)  # as `ibemu run` does: every process of the run on this clock
    result: dict[str, Any] = run_trio(ScenarioRun(scen, out / label).run)
    print(f"  {label}: {time.perf_counter() - t0:.0f} s of real time", file=sys.stderr, flush=True)
    return result


def job_error(job: dict[str, Any]) -> str:
    """A traffic entry's error (a QP that gave up, a worker killed): in its ``extra``, where
    ``scenario.measure`` puts it; "" when none."""
    return str(job.get("extra", {}).get("error") or "")


def job_valid(fidelity: dict[str, Any], job: dict[str, Any]) -> bool:
    """A job's figures count: its run is marked valid and the job ended without an error."""
    return bool(fidelity["valid"]) and not job_error(job)


def worker_lag(fidelity: dict[str, Any]) -> float:
    """The traffic workers' worst p99 lag behind the clock (emulated us): ibemu's own CPU, which a
    step's times carry; the verdict's 2 ms bound is far above the tens of us measured here."""
    return max((p["p99_us"] for name, p in fidelity.get("processes", {}).items() if name.startswith("traffic")),
               default=0.0)


def worst_lag(fidelity: dict[str, Any]) -> tuple[float, str]:
    """The run's worst p99 lag (emulated us) and whose: what a stricter bound would judge."""
    procs = fidelity.get("processes", {})
    if not procs:
        return 0.0, "-"
    name = max(procs, key=lambda k: procs[k]["p99_us"])
    return float(procs[name]["p99_us"]), name


def lag_text(fidelity: dict[str, Any]) -> str:
    """``123.4 us (12.3 ms real, agent-host)``: the worst p99 lag, emulated and x dilation."""
    us, who = worst_lag(fidelity)
    return f"{us:,.1f} us ({us * fidelity.get('dilation', 1) / 1e3:,.1f} ms real, {who})"


def run_scenario(label: str, scen: Scenario, out: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    clock.configure(scen.time.dilation)
    result: dict[str, Any] = run_trio(ScenarioRun(scen, out / label).run)
    print(f"  {label}: {time.perf_counter() - t0:.0f} s of real time", file=sys.stderr, flush=True)
    return result


def pool(args: argparse.Namespace) -> None:
    """``scenarios/gpu-pool.yaml`` under each placement, and each job alone on the same servers."""
    rows: list[tuple[str, str, tuple[str, ...], dict[str, Any], dict[str, Any], bool, float, float, str]] = []
    alone: dict[tuple[str, tuple[str, ...]], tuple[dict[str, Any], bool, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        for policy in args.pool:
            text = POOL.read_text().replace("placement: topology", f"placement: {policy}")
            text = text.replace("dilation: 20000", f"dilation: {args.dilation}")
            if args.fabrics[0] != "ib":  # RoCE: routers and a fabric manager, no SM
                text = text.replace("fabric: {kind: ib, datapath: user}",
                                    f"fabric: {fabric_text(args.fabrics[0], args.buffer_kb)}")
                text = text.replace("sm: {impl: ibemu, engine: updn}\n", "")
            scen = loads_scenario(text, f"<pool-{policy}>")
            res = run_scenario(f"pool-{policy}", scen, Path(tmp))
            valid = bool(res["fidelity"]["valid"])
            for t, out in zip(scen.traffic, res["traffic"], strict=True):
                key = (t.name, t.hosts)
                if key not in alone:
                    one = dataclasses.replace(scen, traffic=(t,))
                    r1 = run_scenario(f"alone-{t.name}-{'-'.join(t.hosts)}", one, Path(tmp))
                    alone[key] = (r1["traffic"][0], job_valid(r1["fidelity"], r1["traffic"][0]),
                                  worker_lag(r1["fidelity"]))
                a, a_ok, a_lag = alone[key]
                rows.append((policy, t.name, t.hosts, out, a, valid and a_ok and not job_error(out),
                             worker_lag(res["fidelity"]), a_lag, lag_text(res["fidelity"])))
    load = os.getloadavg()
    buf = f", buffers {args.buffer_kb:g} KiB" if args.buffer_kb is not None and args.fabrics[0] != "ib" else ""
    print(f"GPU pool ({POOL.name}, fabric {args.fabrics[0]}{buf}): 3 jobs on 8 H100 servers, 2 leaves of 4, one spine; "
          f"dilation {args.dilation:,}; "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("  emulated time, to scale; slowdown = the job's step (fabric part) in the pool over alone on the same servers;")
    print("  lag: the traffic workers' worst p99 lag behind the clock (emulated us; the pool run's, alone's);")
    print("  resent: the job's retransmitted packets in the pool; dropped, pauses: RoCE routers' (the whole pool run)")
    print(f"  {'placement':<9} {'job':<3} {'servers':<24} {'leaves':>6} {'step us':>8} {'alone':>8} {'slowdown':>8} "
          f"{'fabric us':>9} {'alone':>8} {'slowdown':>8} {'verdict':<8} {'lag us':>6} {'alone':>6} {'resent':>6} "
          f"{'dropped':>7} {'pauses':>6} {'marked':>6}  worst p99 lag (pool run)")
    for policy, name, hosts, out, a, ok, lag, a_lag, worst in rows:
        x, y = out.get("extra", {}), a.get("extra", {})
        if "step_s" not in x or "step_s" not in y:
            print(f"  {policy:<9} {name:<3} {','.join(hosts):<24} no step measured in the pool or alone "
                  f"(resent {x.get('retransmitted', 0):,}, dropped {x.get('router_dropped', 0):,}, pauses "
                  f"{x.get('router_pause_sent', 0):,}, marked {x.get('router_ecn_marked', 0):,}) "
                  f"{job_error(out)}  {worst}")
            continue
        leaves = len({int(h.split("_")[0][1:]) // 4 for h in hosts})
        print(f"  {policy:<9} {name:<3} {','.join(h.split('_')[0] for h in hosts):<24} {leaves:6d} "
              f"{x['step_s'] * 1e6:8.1f} {y['step_s'] * 1e6:8.1f} {x['step_s'] / y['step_s']:7.2f}x "
              f"{x['fabric_s'] * 1e6:9.1f} {y['fabric_s'] * 1e6:8.1f} {x['fabric_s'] / y['fabric_s']:7.2f}x "
              f"{'valid' if ok else 'INVALID':<8} {lag:6.1f} {a_lag:6.1f} {x.get('retransmitted', 0):6,} "
              f"{x.get('router_dropped', 0):7,} {x.get('router_pause_sent', 0):6,} {x.get('router_ecn_marked', 0):6,}  "
              f"{worst}")


def sm_only(text: str) -> str:
    """The failure scenario with SM-only recovery: ftree, no alternates written."""
    out = text.replace("engine: ftree_ar", "engine: ftree").replace(", local_failover: true", "")
    if out == text:
        raise SystemExit(f"{FAILURE.name}: expected sm engine ftree_ar and fabric.local_failover: true")
    return out


def held_sm(text: str, delay_ms: float) -> str:
    """The failure scenario with the SM killed just before each cable or switch failure and
    started again ``delay_ms`` (emulated) after it: a stand-in for a real SM's reroute time,
    which dilation divides away (the SM's CPU runs N times faster against the emulated clock)."""
    scen = loads_scenario(text, "<failure>")
    lines = []
    for f in scen.faults:
        if f.action in ("link_down", "switch_down"):
            lines.append(f"  - {{at_s: {f.at_s - 1e-4:.6f}, action: sm_down}}")
            lines.append(f"  - {{at_s: {f.at_s + delay_ms / 1e3:.6f}, action: sm_up}}")
    if not lines:
        raise SystemExit(f"{FAILURE.name}: no cable or switch failure to hold the SM across")
    return text.replace("faults:\n", "faults:\n" + "\n".join(lines) + "\n", 1)


NDR_RATE = "4x NDR"
NDR_DILATION = 20000
NDR_SCALE = 10000
"""The job's scale at 4x NDR: the training tables' (1.35 MB of gradients a step on each server's
one rail), a step of ~0.14 ms emulated (2.8 s of real time at dilation 20,000)."""
NDR_TIME = 40
"""The file's fault times and duration divided by this at 4x NDR: faults at 1, 2 and 3 ms, 4 ms
in all (80 s of real time a run), 6-7 steps before the first fault and 6-9 after each."""
NDR_RC_TIMEOUT = 7
"""The job's RC local ACK timeout at 4x NDR: 4.096 us x 2^7 = 0.52 ms emulated (~4 steps, 10 s
real). The default 14 (67 ms) would be 22 minutes of real time a tail loss at dilation 20,000,
~500 steps; 2^7 stays far above the traffic worker's lag behind the clock (a few us emulated
at p99 in these runs, tens under heavy load) and the fabric's round trip (a few us), so no timer
fires but for a lost frame, and seven retries (3.7 ms) outlast ibemu's SM's reroute here."""


def replace_once(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` replaced by ``new``; exits when ``old`` is not in it exactly once."""
    if text.count(old) != 1:
        raise SystemExit(f"{FAILURE.name}: expected {old!r} once")
    return text.replace(old, new)


def ndr(text: str) -> str:
    """The failure scenario at 4x NDR and dilation 20,000: the same fabric, job and faults, the
    job's scale that of the training tables (``NDR_SCALE``), its RC timeout shortened
    (``NDR_RC_TIMEOUT``), every fault time and the duration divided by ``NDR_TIME``."""
    text = replace_once(text, "rate: 1x SDR", f"rate: {NDR_RATE}")
    text = replace_once(text, "dilation: 100}", f"dilation: {NDR_DILATION}}}")
    text = replace_once(text, "scale: 30000}", f"scale: {NDR_SCALE}, rc_timeout: {NDR_RC_TIMEOUT}}}")

    def shorter(m: re.Match[str]) -> str:
        return f"{m[1]}{float(m[2]) / NDR_TIME:.6f}"

    text, n = re.subn(r"^(\s*- \{at_s: |duration_s: )([0-9.]+)", shorter, text, flags=re.M)
    if n < 2:
        raise SystemExit(f"{FAILURE.name}: expected fault times and a duration")
    return text


def drawn(text: str, rng: random.Random, window_s: float) -> tuple[str, list[float]]:
    """The scenario with each fault's time moved later by its own draw from U(0, ``window_s``)
    (the offsets, in the file's order): faults land anywhere in a step, its compute or its
    communication, where fixed times land in the same part of a step every run."""
    offsets: list[float] = []

    def later(m: re.Match[str]) -> str:
        offsets.append(rng.uniform(0.0, window_s))
        return f"{m[1]}{float(m[2]) + offsets[-1]:.9f}"

    text = re.sub(r"^(\s*- \{at_s: )([0-9.]+)", later, text, flags=re.M)
    if not offsets:
        raise SystemExit(f"{FAILURE.name}: expected fault times")
    return text, offsets


def failure(args: argparse.Namespace) -> None:
    """``scenarios/training-under-failure.yaml`` with local failover and with SM-only recovery."""
    text = FAILURE.read_text()
    if args.ndr:
        text = ndr(text)
    if args.dilation_given:
        text = re.sub(r"dilation: \d+", f"dilation: {args.dilation}", text, count=1)
    first = loads_scenario(text, "<failure>")
    plan = next(t.training for t in first.traffic if t.training is not None)
    window_s = plan.scaled_step_s  # the model's scaled step: a draw covers one whole step
    rng = random.Random(args.draw_faults)
    rows: list[tuple[int, str, dict[str, Any]]] = []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-failure-") as tmp:
        for run in range(args.runs):
            t = text
            if args.draw_faults is not None:  # the same drawn times for both variants of a run
                t, offsets = drawn(text, rng, window_s)
                print(f"  run {run + 1}: faults moved later by " + ", ".join(f"{o * 1e6:.1f}" for o in offsets)
                      + " us (emulated)", file=sys.stderr, flush=True)
            if args.sm_delay_ms:
                t = held_sm(t, args.sm_delay_ms)
            for label, v in (("local failover", t), ("SM only", sm_only(t))):
                scen = loads_scenario(v, f"<{label}>")
                rows.append((run + 1, label, run_scenario(f"{label.replace(' ', '-')}-{run + 1}", scen, Path(tmp))))
    load = os.getloadavg()
    if args.save:
        Path(args.save).write_text(json.dumps([{"run": r, "recovery": lb, "result": res} for r, lb, res in rows],
                                              indent=1, default=str))
    dilation = rows[0][2]["fidelity"].get("dilation", 1) if rows else first.time.dilation
    job = next(t for t in first.traffic if t.training is not None)
    scale = job.training.scale if job.training is not None else 1.0
    rate = first.defaults.rate
    timeout = 4.096 * 2 ** (job.rc_timeout if job.rc_timeout is not None else 14)
    faults = ", ".join(f"{f.at_s * 1e3:g}" for f in sorted(first.faults, key=lambda f: f.at_s))
    if args.draw_faults is not None:
        faults += (f" each + U(0, {window_s * 1e6:.1f} us: the model's scaled step) drawn per run "
                   f"(seed {args.draw_faults})")
    print(f"Training under faults ({FAILURE.name}{', --ndr' if args.ndr else ''}): Llama 2 7B steps "
          f"(1/{scale:,.0f}) on 4 H100 servers, leaf-spine 2x2, {rate.width}x {rate.speed} cables, user datapath, "
          f"dilation {dilation:g}; faults at {faults} ms of {first.duration_s * 1e3:g}; RC ACK timeout "
          f"{timeout / 1e3:,.2f} ms; load average {load0[0]:.2f} before, {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} after")
    print("  us of the scaled step, emulated time: base = median step before the fault; stall = the step under way at")
    print("  it; gap = last step end before the fault to the stall's end; after = mean of the later steps (to the next")
    print("  fault); slow = steps over 1.1x base from the stall on; resent = the job's retransmissions (whole run);")
    print("  failover, SM: ms after the fault to the first switch on its alternates, to the SM's reroute programmed")
    print("  (1 us resolution); into: us from the last step end to the fault, in the step's compute (its sleep and the")
    print("  first NVLink phase: no frame of the job on the fabric) or comm (the fabric part and the last NVLink phase)")
    if dilation != 1:
        print(f"  to scale: link rates and delays, the RC transport's timers. NOT to scale at dilation {dilation:g}: every")
        print("  process's CPU time is divided by it, so the SM's reroute (20-40 ms of real CPU) takes tenths of a ms")
        print("  here and SM-only recovery looks far faster than a real SM's; a switch's own failover (the agent")
        print("  host's reaction, real CPU / dilation) is an upper bound of what hardware does")
    if args.sm_delay_ms:
        print(f"  the SM is killed 0.1 ms before each cable or switch failure and started again {args.sm_delay_ms:g} ms "
              "after it")
        print("  (emulated): a real SM's reroute time standing in for the dilated one; its faults rows are left out")
    print(f"  {'run':>3} {'recovery':<14} {'verdict':<7} {'#':>1} {'fault':<28} {'base us':>8} {'stall us':>9} "
          f"{'x':>6} {'gap us':>8} {'worst us':>9} {'after us':>9} {'x':>6} {'slow':>4} {'steps':>5} "
          f"{'into us':>7} {'phase':<7} {'failover':>8} {'SM':>6} {'resent':>6}  worst p99 lag")
    stalls: dict[tuple[str, str, str], list[float]] = {}  # (recovery, fault, phase) -> valid runs' stall x
    for run, label, res in rows:
        fid = res["fidelity"]
        job = next((t for t in res["traffic"] if t["kind"] == "training"), {})
        ok = job_valid(fid, job)
        jx = job.get("extra", {})
        quiet_us = (jx.get("compute_s", 0.0) + jx.get("nvlink_s", 0.0) / 2) * 1e6  # before its frames go out
        for i, f in enumerate(res["faults"], 1):
            if f["action"] in ("sm_down", "sm_up"):
                continue
            for fl in f["flows"]:
                x = fl.get("training")
                if not x:
                    continue

                def v(key: str, fmt: str = "9.1f", x: dict[str, Any] = x) -> str:
                    return format(x[key], fmt) if x.get(key) is not None else "-"

                ph = f.get("phases_ms", {})
                lf, sm = ph.get("local_failover"), ph.get("programmed")
                into = x.get("into_us")
                phase = "-" if into is None or not quiet_us else "compute" if into < quiet_us else "comm"
                if ok and x.get("stall_x") is not None and phase != "-":
                    stalls.setdefault((label, f["action"], phase), []).append(float(x["stall_x"]))
                print(f"  {run:3d} {label:<14} {'valid' if ok else 'INVALID':<7} {i:1d} "
                      f"{f['action'] + ' ' + f['target']:<28.28} {v('base_us', '8.1f'):>8} {v('stall_us'):>9} "
                      f"{v('stall_x', '5.2f'):>5}x {v('gap_us', '8.1f'):>8} {v('worst_us'):>9} {v('after_us'):>9} "
                      f"{v('after_x', '5.2f'):>5}x {x['slow_steps']:4d} {x['steps_after']:5d} "
                      f"{v('into_us', '7.1f'):>7} {phase:<7} {'-' if lf is None else format(lf, '.3f'):>8} {'-' if sm is None else format(sm, '.3f'):>6} "
                      f"{fl.get('retransmitted', 0):6,}  {lag_text(fid)}")
        if quiet_us:
            print(f"      run {run}, {label}: compute + first NVLink phase {quiet_us:.1f} us a step, fabric part "
                  f"{jx.get('fabric_s', 0.0) * 1e6:.1f} us (mean), {jx.get('steps', 0)} steps")
        if not ok:
            print(f"      INVALID: {job_error(job) or fid['note'][:300]}")
    if stalls:
        print("  stall x by where the fault fell (valid runs): median [min-max] (n)")
        for key in sorted(stalls):
            xs = stalls[key]
            print(f"    {key[0]:<14} {key[1]:<12} in {key[2]:<7} {statistics.median(xs):5.2f}x "
                  f"[{min(xs):.2f}-{max(xs):.2f}] ({len(xs)})")


def pipeline(args: argparse.Namespace) -> None:
    """One job per ``--pipeline`` stage count (``--tensor``, ``--microbatches``) on the first of
    ``--fabrics`` with the first of ``--algorithms``: the measured step and pipeline part beside
    the model's scaled ones, the bubble, the pipeline's idle share measured and modelled."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        for p in args.pipeline:
            m = f", microbatches: {args.microbatches}" if args.microbatches else ""
            extra = f", tensor: {args.tensor}, pipeline: {p}{m}"
            label = f"{args.fabrics[0]}-t{args.tensor}-p{p}"
            result = run_one(label, args.fabrics[0], args.algorithms[0], args, Path(tmp), extra)
            rows.append((label, result["fidelity"], next(t for t in result["traffic"] if t["kind"] == "training")))
    load = os.getloadavg()
    x0 = rows[0][2]["extra"]
    print(f"Training with a pipeline: {args.model}, {args.tokens:,.0f} tokens/step, {x0['gpus']} H100 on "
          f"{args.servers} servers x {args.rails} rails of 4x NDR (gpu-rails), tensor {args.tensor}, "
          f"{args.algorithms[0]} DP allreduce, overlap {args.overlap:g}, scale 1/{args.scale:g}, dilation "
          f"{args.dilation:,}, fabric {args.fabrics[0]}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("  emulated us of the scaled step; pipe: until the first stage's last backward pass ended; bubble: the")
    print("  model's (P - 1)/m of the work over its full-size step; idle: the pipeline beyond its work (compute,")
    print("  TP) over the step, measured, the scaled model's and the full-size model's (the model's transfers pay")
    print("  its network step latency, NCCL's 9.6 us unless --net-latency-us, whole in the scaled step)")
    print(f"  {'run':<16} {'fidelity':<8} {'m':>3} {'steps':>5} {'step us':>8} {'model':>8} {'pipe us':>8} {'model':>8} "
          f"{'bubble':>6} {'idle':>6} {'model':>6} {'full':>6} {'DP fabric us':>12} {'PP B/step':>10} {'wrong':>5} "
          f"{'lag us':>6}")
    for label, fid, job in rows:
        x = job["extra"]
        valid = job_valid(fid, job)
        if "step_s" not in x:
            print(f"  {label:<16} {'valid' if valid else 'INVALID':<8} no step completed {job_error(job)}")
            continue
        piped = x.get("pipeline", 1) > 1
        work = x["model_compute_s"] + x.get("model_tp_s", 0.0)
        model_idle = x.get("model_pipeline_idle_share", 0.0)
        scaled_pipe = x.get("model_scaled_pipeline_s", work / x["scale"])
        scaled_idle = (scaled_pipe - work / x["scale"]) / x["model_scaled_step_s"]
        print(f"  {label:<16} {'valid' if valid else 'INVALID':<8} {x.get('microbatches', 1):3d} {x['steps']:5d} "
              f"{x['step_s'] * 1e6:8.1f} {x['model_scaled_step_s'] * 1e6:8.1f} "
              f"{x['pipeline_s'] * 1e6 if piped else work / x['scale'] * 1e6:8.1f} "
              f"{scaled_pipe * 1e6:8.1f} "
              f"{x.get('model_bubble_share', 0.0) * 100:5.1f}% {x.get('pipeline_idle_share', 0.0) * 100:5.1f}% "
              f"{scaled_idle * 100:5.1f}% {model_idle * 100:5.1f}% {x['fabric_s'] * 1e6:12.2f} {x.get('pp_bytes_per_step', 0):10,d} "
              f"{x['wrong']:5d} {worker_lag(fid):6.2f}")
        if not valid:
            print(f"    INVALID: {job_error(job) or fid['note']}")


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
    ap.add_argument("--algorithms", nargs="+", choices=["hierarchical", "ring", "tree"],
                    default=["hierarchical", "ring", "tree"])
    ap.add_argument("--buffer-kb", type=float, default=None, help="RoCE routers' port buffers (KiB; default 1 MiB)")
    ap.add_argument("--failure", action="store_true",
                    help="run scenarios/training-under-failure.yaml with local failover and SM-only instead")
    ap.add_argument("--ndr", action="store_true",
                    help="--failure: at 4x NDR and dilation 20,000 (the job at scale 1e4, RC timeout 2^7, "
                         "times / 40) instead of 1x SDR at dilation 100")
    ap.add_argument("--runs", type=int, default=1, help="--failure: runs of each variant (default 1)")
    ap.add_argument("--draw-faults", type=int, default=None, metavar="SEED",
                    help="--failure: each run moves every fault later by its own draw from U(0, the model's "
                         "scaled step) (seeded), so faults land in compute and in communication alike")
    ap.add_argument("--save", default=None, help="--failure: write every run's result (JSON) to this file")
    ap.add_argument("--sm-delay-ms", type=float, default=0.0,
                    help="--failure: hold the SM from each failure until this many emulated ms after it")
    ap.add_argument("--pool", nargs="*", choices=["topology", "packed", "spread"], default=None,
                    help="run scenarios/gpu-pool.yaml under these placements (none given: all three) instead")
    ap.add_argument("--pipeline", nargs="+", type=int, default=None, metavar="P",
                    help="one job per stage count P (dividing --servers) instead: the pipeline's figures")
    ap.add_argument("--tensor", type=int, default=1, help="--pipeline: tensor-parallel degree (default 1)")
    ap.add_argument("--microbatches", type=int, default=0, help="--pipeline: microbatches (default 4P)")
    args = ap.parse_args()
    args.dilation_given = "--dilation" in sys.argv
    if args.failure:
        if not args.dilation_given:
            args.dilation = NDR_DILATION if args.ndr else 100
        failure(args)
        return
    if args.pool is not None:
        args.pool = args.pool or ["topology", "packed", "spread"]
        pool(args)
        return
    if args.pipeline is not None:
        pipeline(args)
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
          f"{'model s':>8} {'proj. days':>10} {'model':>8} {'lag us':>6}  worst p99 lag")
    for label, fid, job in rows:
        x = job["extra"]
        valid = job_valid(fid, job)
        if "step_s" not in x:
            print(f"  {label:<18} {'valid' if valid else 'INVALID':<8} no step completed {job_error(job)}")
            continue
        model_comm = 1 - x["compute_s"] / x["model_scaled_step_s"]
        print(f"  {label:<18} {'valid' if valid else 'INVALID':<8} {x['steps']:5d} {x['step_s'] * 1e6:8.1f} "
              f"{x['model_scaled_step_s'] * 1e6:8.1f} {x['fabric_s'] * 1e6:9.1f} {x['model_scaled_fabric_s'] * 1e6:8.1f} "
              f"{x['fabric_busbw_gbs']:5.1f}/{x['rail_gbs']:<4g} {x['comm_share'] * 100:5.1f}% {model_comm * 100:5.1f}% "
              f"{x['efficiency'] * 100:5.1f}% {(1 - model_comm) * 100:5.1f}% {x['projected_step_s']:12.3f} "
              f"{x['model_step_s']:8.3f} {x['projected_time_to_train_days']:10.1f} {x['model_time_to_train_days']:8.1f} "
              f"{worker_lag(fid):6.1f}  {lag_text(fid)}")
        if not valid:
            print(f"    INVALID: {job_error(job) or fid['note']}")


if __name__ == "__main__":
    main()
