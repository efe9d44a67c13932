"""The terminal summary of a run: plain-text aligned tables, no colours, no terminal needed.

A run that fell behind its emulated clock (``fidelity.valid`` false) says so under its title,
in its Fidelity section (what fell behind, by how much), and at the head of every section
with figures (``INVALID_MARK``). Under dilation a fixed note says which figures are to scale.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ibemu.report.result import (
    PHASES,
    TAKEOVER_PHASES,
    CaptureFile,
    FaultResult,
    Fidelity,
    ProcessLag,
    RunResult,
    TrafficResult,
    as_result,
)

DASH = "-"
"""What a cell shows for a value that is absent (``null``)."""
DEST_LIMIT = 3
"""Destinations listed by name before a list is shortened to ``h1,h2,... (16)``."""
EXTRA_WIDTH = 48
INVALID_MARK = "INVALID RUN: figures below are not to scale (the emulator fell behind its clock)"
"""The head line of every section with figures of a run whose fidelity is not valid."""
DILATION_NOTE = (
    "  to scale (emulated clock): link rates and delays of the user datapath, transport timers (RC ACK\n"
    "    timeout, retries, pacing), the fault schedule and durations;\n"
    "  not to scale (ibemu's own CPU, N times shorter in emulated time): the agents' and the SM's\n"
    "    processing: SUBNET UP, routes computed, the reroute phases; fabric up is real seconds;\n"
    "  mixed: throughput and blackouts (timers, and ibemu's datapath CPU)"
)
"""Under dilation: which figures are the fabric's and which are ibemu's own cost."""


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool], indent: str = "  "
) -> str:
    """Columns padded to their widest cell; ``right[i]`` right-aligns column i (numbers)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)
        ]
        return (indent + "  ".join(parts)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _num(v: float | None, digits: int = 1) -> str:
    return DASH if v is None else f"{v:,.{digits}f}"


def _int(v: int) -> str:
    return f"{v:,}"


def _ms(v: float | None) -> str:
    """Milliseconds with precision that fits their size (0.42, 8.7, 148)."""
    if v is None:
        return DASH
    if v < 10:
        return f"{v:.2f}"
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def _dest(dst: str | list[str]) -> str:
    if isinstance(dst, str):
        return dst
    if len(dst) <= DEST_LIMIT:
        return ",".join(dst)
    return f"{','.join(dst[:2])},... ({len(dst)})"


def _scalar(v: Any) -> str | None:
    if isinstance(v, bool) or v is None:
        return None if v is None else str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, str):
        return v
    return None


def _extra(extra: Mapping[str, Any]) -> str:
    """``p50_us=3.1 p99_us=9`` from the scalar entries (nested ones are flattened one level)."""
    parts: list[str] = []
    for k, v in extra.items():
        if isinstance(v, Mapping):
            parts.extend(f"{k}.{k2}={s}" for k2, v2 in v.items() if (s := _scalar(v2)) is not None)
        elif (s := _scalar(v)) is not None:
            parts.append(f"{k}={s}")
    text = " ".join(parts)
    return text if len(text) <= EXTRA_WIDTH else text[: EXTRA_WIDTH - 3] + "..."


def _header(r: RunResult) -> list[str]:
    sc = r.scenario
    title = f"ibemu run: {sc.name}" + (f" ({sc.file})" if sc.file else "")
    lines = [title, "=" * len(title)]
    if sc.description:
        lines.append(sc.description)
    state = "INTERRUPTED" if r.interrupted else "completed"
    lines.append(f"started {r.started_at}, {r.duration_s:.1f} s, {state}")
    if r.invalid:
        lines.append(INVALID_MARK)
    return lines


def _mark(r: RunResult) -> list[str]:
    return [f"  {INVALID_MARK}"] if r.invalid else []


def _ms_of(us: float | None) -> str:
    return DASH if us is None else f"{us / 1e3:.2f} ms"


def _lag(us: float | None, f: Fidelity) -> str:
    """An emulated lag, and under dilation its real time: ``0.22 us emulated = 4.38 ms real``."""
    if us is None or f.dilation == 1:
        return _ms_of(us)
    return f"{_dur(us)} emulated = {_dur(us * f.dilation)} real"


def _dur(us: float) -> str:
    if us >= 1000:
        return f"{us / 1e3:.3g} ms" if us < 1e6 else f"{us / 1e6:.3g} s"
    return f"{us:.3g} us"


def _threshold(f: Fidelity) -> str:
    """``threshold 2.00 ms`` (dilation 1), else both values and what set the threshold."""
    text = f"threshold {_lag(f.threshold_us, f)}"
    return text + (f": {f.threshold_basis}" if f.threshold_basis and f.dilation != 1 else "")


def _fidelity(r: RunResult) -> list[str]:
    f: Fidelity | None = r.fidelity
    lines = ["", "Fidelity"]
    if f is None:
        return [*lines, "  unknown: not judged (an ibemu.run/1 result, from before fidelity was)"]
    if f.valid:
        lines.append(f"  valid: every process kept up with the emulated clock (worst p99 lag "
                     f"{_lag(f.worst_lag_us, f)}, {f.worst_process}; {_threshold(f)})")
    else:
        behind = f.behind()
        if behind:
            what = ", ".join(f"{n} p99 lag {_lag(p.p99_us, f)} (max {_lag(p.max_us, f)})" for n, p in behind)
            lines.append(f"  INVALID: fell behind the emulated clock: {what}; {_threshold(f)}")
        else:
            lines.append(f"  INVALID: {f.note}")
    if f.processes:
        def busy(p: ProcessLag) -> str:  # the share of the time it had work waiting
            return "-" if p.busy_pct is None else f"{p.busy_pct:.0f}%"

        if f.dilation == 1:
            rows = [[n, _ms_of(p.p50_us), _ms_of(p.p99_us), _ms_of(p.max_us), _int(p.samples), busy(p)]
                    for n, p in f.processes.items()]
            lines.append(table(["process", "p50 lag", "p99 lag", "max lag", "samples", "busy"], rows,
                               [False, True, True, True, True, True]))
        else:  # emulated lags are fractions of a us at high factors: the real ones beside them
            rows = [[n, _dur(p.p50_us), _dur(p.p99_us), _dur(p.p99_us * f.dilation), _dur(p.max_us), _int(p.samples),
                     busy(p)] for n, p in f.processes.items()]
            lines.append(table(["process", "p50 lag", "p99 lag", "p99 real", "max lag", "samples", "busy"], rows,
                               [False, True, True, True, True, True, True]))
    if f.worst_link:
        lines.append(f"  links: worst {f.worst_link} (see the note: {f.note.split('; ', 1)[-1]})")
    else:
        lines.append("  links: none timed (the link model runs on the user datapaths only)")
    if f.dilation != 1:
        lines.append(DILATION_NOTE)
    return lines


def _fabric(r: RunResult) -> list[str]:
    f, sm, b = r.fabric, r.sm, r.bringup
    lines = [
        "",
        "Fabric",
        *_mark(r),
        f"  {f.kind} ({f.datapath} datapath), {f.topology}: {_int(f.nodes)} nodes "
        f"({_int(f.switches)} switches, {_int(f.hosts)} hosts), {_int(f.links)} links",
        f"  fabric up in {b.fabric_s:.2f} s",
    ]
    if f.dilation != 1:
        lines.insert(3 + len(_mark(r)), f"  time dilation {f.dilation:g}: emulated time runs {f.dilation:g}x slower than real time")
    if f.kind == "roce":
        up = f"routes installed in {b.sm_s:.2f} s" if b.sm_s is not None else "never installed its routes"
        lines.append(f"  fabric manager (ECMP routes over netlink): {up}")
    elif sm.impl == "none":
        lines.append("  no subnet manager")
    else:
        engine = f" ({sm.engine})" if sm.engine else ""
        where = f" on {sm.host}" if sm.host else ""
        up = f"SUBNET UP in {b.sm_s:.2f} s" if b.sm_s is not None else "never reached SUBNET UP"
        lines.append(f"  SM {sm.impl}{engine}{where}: {up}")
    return lines


def _faults(faults: list[FaultResult], mark: list[str] | None = None) -> list[str]:
    lines = ["", f"Faults ({len(faults)})", *(mark or [])]
    if not faults:
        lines.append("  none injected")
        return lines
    rows = [
        [
            str(i),
            f"{f.at_s:.2f}",
            f"{f.t_fault_s:.3f}",
            f.action,
            f.target,
            *(_ms(getattr(f.phases, p)) for p in PHASES),
        ]
        for i, f in enumerate(faults, 1)
    ]
    headers = ["#", "at (s)", "t (s)", "action", "target", *(f"{p} (ms)" for p in PHASES)]
    right = [True, True, True, False, False, True, True, True, True]
    if any(f.phases.local_failover is not None for f in faults):  # switches that failed over by themselves
        headers.append("local failover (ms)")
        right.append(True)
        for row, f in zip(rows, faults, strict=True):
            row.append(_ms(f.phases.local_failover))
    lines.append(table(headers, rows, right))
    lines.append(
        "  (t: since traffic start; phases: ms since the fault was injected, - = did not happen)"
    )
    took = [(i, f) for i, f in enumerate(faults, 1) if f.phases.takeover is not None]
    if took:  # a standby SM took over: master silent -> standby notices -> master -> fabric re-swept
        lines += ["", "  SM takeover (ms since the fault):"]
        trows = [[str(i), f.action, *(_ms((f.phases.takeover or {}).get(p)) for p in TAKEOVER_PHASES)]
                 for i, f in took]
        lines.append(table(["#", "action", "first poll unanswered", "standby gives up", "standby is master",
                            "fabric re-swept"], trows, [True, False, True, True, True, True]))
    for i, f in enumerate(faults, 1):
        if not f.flows:
            continue
        lines += ["", f"  Fault {i} ({f.action} {f.target}), flows:"]
        rows = [
            [fl.flow, _ms(fl.blackout_ms), _ms(fl.resume_ms), _int(fl.lost), _int(fl.retransmitted)]
            for fl in f.flows
        ]
        headers = ["flow", "blackout (ms)", "resume (ms)", "lost", "retransmitted"]
        lines.append(table(headers, rows, [False, True, True, True, True], indent="    "))
    return lines


def _traffic(traffic: list[TrafficResult], mark: list[str] | None = None) -> list[str]:
    lines = ["", f"Traffic ({len(traffic)})", *(mark or [])]
    if not traffic:
        lines.append("  none")
        return lines
    rows = [
        [
            t.name,
            t.kind,
            f"{_dest(t.src)} -> {_dest(t.dst)}" if t.src != t.dst else f"{_dest(t.src)} (all)",
            _num(t.gbps, 2),
            _int(t.packets),
            _int(t.bytes),
            _extra(t.extra),
        ]
        for t in traffic
    ]
    headers = ["name", "kind", "from -> to", "Gb/s", "packets", "bytes", "details"]
    lines.append(table(headers, rows, [False, False, False, True, True, True, False]))
    return lines


def _us(x: Mapping[str, Any], key: str) -> str:
    """``x[key]`` seconds in us, "-" when absent."""
    return f"{x[key] * 1e6:,.1f}" if key in x else "-"


def _pct(x: Mapping[str, Any], key: str) -> str:
    """``x[key]`` (a share) in percent, "-" when absent."""
    return f"{x[key] * 100:.1f}%" if key in x else "-"


def _training(traffic: list[TrafficResult], mark: list[str] | None = None) -> list[str]:
    """Training jobs (``kind: training``): the measured step of the 1/scale model beside the
    model's, and the full-size projections (``ibemu.traffic.training.measured_figures``)."""
    jobs = [t for t in traffic if t.kind == "training" and "model_step_s" in t.extra]
    if not jobs:
        return []
    rows = []
    for t in jobs:
        x = t.extra
        measured = "step_s" in x
        rows.append([
            t.name, f"{x['gpus']} {x['gpu']}", str(x["model"]), f"{x['algorithm']} o={x['overlap']:g}",
            f"{x['scale']:g}", str(x.get("steps", 0)), _us(x, "step_s"), _us(x, "model_scaled_step_s"),
            _us(x, "fabric_s"), f"{x['fabric_busbw_gbs']:.2f}/{x['rail_gbs']:g}" if measured else "-",
            _pct(x, "comm_share"), _pct(x, "efficiency"), f"{x['projected_step_s']:.2f}" if measured else "-",
            f"{x['model_step_s']:.2f}",
            f"{x['projected_time_to_train_days']:,.1f}" if measured else "-",
            f"{x['model_time_to_train_days']:,.1f}",
        ])
    headers = ["job", "GPUs", "model", "allreduce", "scale", "steps", "step us", "model us", "fabric us",
               "busbw/rail GB/s", "comm", "effic.", "proj. step s", "model step s", "proj. days", "model days"]
    return ["", f"Training jobs ({len(jobs)})", *(mark or []),
            "  measured: the 1/scale step in emulated time (compute and gradient bytes / scale); proj.: full size,",
            "  the model's compute and NVLink with the measured fabric time x scale (bandwidth-bound assumption)",
            table(headers, rows, [False, False, False, False, True, True, True, True, True, True, True, True, True,
                                  True, True, True])]


def _parallelism(traffic: list[TrafficResult]) -> list[str]:
    """Training jobs with tensor or pipeline parallelism: the layout, the pipeline's bubble (the
    model's) and its idle share (the measured pipeline beyond its work, beside the model's), the
    TP time on NVLink and what the pipeline moved between stages (``training.measured_figures``)."""
    jobs = [t for t in traffic if t.kind == "training" and "tensor" in t.extra]
    if not jobs:
        return []
    rows = []
    for t in jobs:
        x = t.extra
        rows.append([
            t.name, f"{x['tensor']} x {x['pipeline']} x {x['replicas']}", str(x["microbatches"]),
            _pct(x, "model_bubble_share"), _pct(x, "pipeline_idle_share"), _pct(x, "model_pipeline_idle_share"),
            f"{x['model_tp_s']:.2f}", f"{x['pp_bytes_per_step']:,}" if "pp_bytes_per_step" in x else "-",
            f"{x['model_pp_bytes_per_step'] / 1e9:,.1f}",
        ])
    headers = ["job", "TP x PP x DP", "microbatches", "bubble", "idle", "model idle", "TP s", "PP bytes/step",
               "model PP GB/step"]
    return ["", f"Tensor and pipeline parallelism ({len(jobs)})",
            "  bubble: the model's (P - 1)/m of the work over the step; idle: the measured pipeline beyond its "
            "work (bubble",
            "  and exposed transfers) over the step; TP s: the model's NVLink time a step; PP: activations and "
            "gradients",
            "  between stages over the fabric, measured (scaled) and the model's (full size)",
            table(headers, rows, [False, False, True, True, True, True, True, True, True])]


def _training_faults(r: RunResult, mark: list[str] | None = None) -> list[str]:
    """Training jobs under faults (``training.fault_impact`` per fault and job): the step
    before, the stalled step, the steps after; under dilation, which part is to scale."""
    rows = []
    for i, f in enumerate(r.faults, 1):
        for fl in f.flows:
            x = fl.training
            if not x:
                continue

            def us(key: str, x: Mapping[str, Any] = x) -> str:
                return f"{x[key]:,.1f}" if x.get(key) is not None else "-"

            def ratio(key: str, x: Mapping[str, Any] = x) -> str:
                return f"{x[key]:.2f}x" if x.get(key) is not None else "-"

            rows.append([str(i), f"{f.action} {f.target}", fl.flow, us("base_us"), us("stall_us"), ratio("stall_x"),
                         us("gap_us"), us("worst_us"), us("after_us"), ratio("after_x"), str(x["slow_steps"]),
                         str(x["steps_after"]), _int(fl.retransmitted)])
    if not rows:
        return []
    lines = ["", "Training jobs under faults", *(mark or []),
             "  us of the scaled step, emulated: base = median step before the fault; stall = the step under way at",
             "  it (x base); gap = last step end before the fault to the stall's end; after = mean of the later steps",
             "  (to the next fault); slow = steps from the stall on over 1.1x base before the first that was not"]
    if r.fabric.dilation != 1:
        lines.append(f"  at dilation {r.fabric.dilation:g} every process's CPU time is divided by it: switches failing over "
                     "by themselves are an upper bound of hardware; the SM's reroute is not to scale (a real SM takes ms)")
    headers = ["#", "fault", "job", "base us", "stall us", "stall x", "gap us", "worst us", "after us", "after x",
               "slow", "steps", "resent"]
    lines.append(table(headers, rows, [True, False, False, *([True] * 10)]))
    return lines


def _capture_line(c: CaptureFile) -> str:
    """``out/capture-leaf0-1.pcap  12,345 frames, 4.2 MB`` and what rotated or was lost."""
    size = f"{c.bytes / 1e6:,.1f} MB" if c.bytes >= 100_000 else f"{c.bytes / 1e3:,.1f} kB"
    text = f"{c.file}  {_int(c.frames)} frames, {size}"
    if len(c.files) > 1:
        text += f" in {len(c.files)} files ({', '.join(c.files[1:])})"
    if c.rotations:
        text += f", rotated {_int(c.rotations)}x"
    if c.discarded:
        text += f", {_int(c.discarded)} older frames deleted"
    if c.dropped:
        text += f", {_int(c.dropped)} dropped by the kernel"
    return text


def _files(r: RunResult) -> list[str]:
    f = r.files
    items = [("events", [f.events] if f.events else []), ("json", [f.json] if f.json else [])]
    items += [("plots", f.plots)]
    stats = {c.file: c for c in f.capture_stats or []}
    if stats:  # one line a capture, with its frames
        items += [("capture", [_capture_line(stats[c])]) if c in stats else ("capture", [c]) for c in f.captures]
    else:
        items += [("captures", f.captures)]
    present = [(k, v) for k, v in items if v]
    if not present:
        return []
    lines = ["", "Files"]
    width = max(len(k) for k, _ in present)
    lines += [f"  {k.ljust(width)}  {', '.join(v)}" for k, v in present]
    return lines


def summary(result: RunResult | Mapping[str, Any]) -> str:
    """The whole summary: header, fabric and bring-up, fidelity, faults and their flows, traffic,
    files."""
    r = as_result(result)
    mark = _mark(r)
    lines = (_header(r) + _fabric(r) + _fidelity(r) + _faults(r.faults, mark) + _traffic(r.traffic, mark)
             + _training(r.traffic, mark) + _parallelism(r.traffic) + _training_faults(r, mark) + _credit_loops(r) + _files(r))
    return "\n".join(lines) + "\n"


def _credit_loops(r: RunResult) -> list[str]:
    """The deadlocks the link model found, one line each (nothing when none or not watched)."""
    if not r.credit_loops:
        return []
    lines = ["", f"Credit loops (deadlocks): {len(r.credit_loops)}"]
    lines += [f"  at {c.t_s:.3f} s, {len(c.hops)} ports stuck {c.stalled_us:,.0f} us: {c.describe()}"
              for c in r.credit_loops]
    return lines
