"""A run's fidelity: did every ibemu process keep up with the emulated clock?

Each monitored process of a run writes its lag behind the emulated clock to ``RUN_DIR/lag.jsonl``
(``ibemu.lagmon``, ``Kind.LAG`` records, one per process and second). ``fidelity`` merges each
process's records over the measured window (from the flows' time zero to the end of the
drain: where every fault phase, blackout and throughput figure is taken; bring-up is ibemu's
own CPU cost and is reported as such) and judges the run:

    valid  <=>  at least one process reported, and every process's p99 lag < threshold_us

``threshold_us`` is ``DEFAULT_THRESHOLD_US`` unless the scenario's ``time: {lag_threshold_us}``
says otherwise; ``worst_lag_us`` is the highest p99 of any process (``worst_process``'s).
``worst_link`` is null: a link's achieved-vs-configured rate needs the link model, which does
not exist yet (the ``note`` says so).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ibemu.events import Kind
from ibemu.lagmon import LagStats

DEFAULT_THRESHOLD_US = 2000.0
"""A process is behind when its p99 lag reaches 2 ms of emulated time. Trio's timers wake up to
1 ms late by themselves (epoll's millisecond timeouts, rounded up), so a tighter bound would
judge the event loop's resolution rather than the process."""
LINK_NOTE = ("per-link achieved vs configured rate is not measured yet (it needs the link model): "
             "worst_link is null")


def merge(records: Iterable[Mapping[str, Any]], lo_ns: int | None = None,
          hi_ns: int | None = None) -> dict[str, LagStats]:
    """Per process, its ``Kind.LAG`` intervals overlapping [lo_ns, hi_ns] merged into one."""
    out: dict[str, LagStats] = {}
    for r in records:
        if r.get("kind") != Kind.LAG or not isinstance(r.get("buckets"), Mapping):
            continue
        t, since = r.get("t_ns"), r.get("since_ns", r.get("t_ns"))
        if not (isinstance(t, int) and isinstance(since, int)):
            continue
        if (lo_ns is not None and t < lo_ns) or (hi_ns is not None and since > hi_ns):
            continue
        name = str(r.get("process", "?"))
        part = LagStats.from_buckets(r["buckets"], float(r.get("max_us", 0.0)))
        out.setdefault(name, LagStats()).merge(part)
    return out


def judge(per_process: Mapping[str, LagStats], *, dilation: float,
          threshold_us: float = DEFAULT_THRESHOLD_US) -> dict[str, Any]:
    """The result's ``fidelity`` block from each process's lag distribution."""
    processes = {name: s.summary() for name, s in sorted(per_process.items()) if s.samples}
    worst = max(processes, key=lambda n: (processes[n]["p99_us"], processes[n]["max_us"]), default=None)
    behind = [n for n, p in processes.items() if p["p99_us"] >= threshold_us]
    valid = bool(processes) and not behind
    if not processes:
        note = "no process reported its lag behind the emulated clock: fidelity unknown"
    elif behind:
        note = "; ".join(f"{n} fell behind the emulated clock: p99 lag {processes[n]['p99_us'] / 1e3:.1f} ms "
                         f"(max {processes[n]['max_us'] / 1e3:.1f} ms) >= {threshold_us / 1e3:g} ms"
                         for n in sorted(behind, key=lambda n: -processes[n]["p99_us"]))
    else:
        note = f"every process kept up: p99 lag under {threshold_us / 1e3:g} ms of emulated time"
    return {"valid": valid, "dilation": dilation, "threshold_us": threshold_us,
            "worst_lag_us": processes[worst]["p99_us"] if worst else None, "worst_process": worst,
            "processes": processes, "worst_link": None, "note": f"{note}; {LINK_NOTE}"}


def fidelity(records: Iterable[Mapping[str, Any]], *, dilation: float, threshold_us: float = DEFAULT_THRESHOLD_US,
             lo_ns: int | None = None, hi_ns: int | None = None) -> dict[str, Any]:
    """``judge`` of ``merge``: the fidelity block of a run from its lag log's records."""
    return judge(merge(records, lo_ns, hi_ns), dilation=dilation, threshold_us=threshold_us)
