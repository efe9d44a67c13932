"""A run's fidelity: did every ibemu process keep up with the emulated clock?

Each monitored process of a run writes its lag behind the emulated clock to ``RUN_DIR/lag.jsonl``
(``ibemu.lagmon``, ``Kind.LAG`` records, one per process and second). ``fidelity`` merges each
process's records over the measured window (from the flows' time zero to the end of the
drain: where every fault phase, blackout and throughput figure is taken; bring-up is ibemu's
own CPU cost and is reported as such) and judges the run:

    valid  <=>  at least one process reported, and every process's p99 lag < threshold_us

``threshold_us`` is ``DEFAULT_THRESHOLD_US`` unless the scenario's ``time: {lag_threshold_us}``
says otherwise; ``worst_lag_us`` is the highest p99 of any process (``worst_process``'s).

Links (the user datapaths: the IB agent host's ``ibemu.fabric.linkplane``, the RoCE routers'
``ibemu.roce.links``, both through ``ibemu.kernel.linkio``): each writes a
``Kind.LINK_FIDELITY`` record per cable direction and interval into the same log: frames, how
late each real departure left against the link model's time (a lag distribution), and the
model's against the real time over back-to-back frames, and the frames its switch port's
socket dropped (the datapath did not read them in time). Merged over the window like the
processes', a link *fell behind* when frames were dropped arriving at it, when its real
departures were late at p99 by ``threshold_us`` or more, or when, busy for at least
:data:`MIN_BUSY_NS`, it achieved less than :data:`MIN_BUSY_RATIO` of its configured rate; a run with such a link is invalid like one
with a lagging process. ``worst_link`` names the link furthest behind (else the one with the
latest departures) with its figures; null when no link reported (the kernel datapaths).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ibemu.events import Kind
from ibemu.lagmon import LagStats

DEFAULT_THRESHOLD_US = 2000.0
"""A process is behind when its p99 lag reaches 2 ms of emulated time. Trio's timers wake up to
1 ms late by themselves (epoll's millisecond timeouts, rounded up), so a tighter bound would
judge the event loop's resolution rather than the process."""
LINK_NOTE = "no link reported (links are timed on the user datapaths, IB and RoCE): worst_link is null"
MIN_BUSY_RATIO = 0.97
"""A busy link achieving less than 97% of its configured rate fell behind."""
MIN_BUSY_NS = 100_000
"""Below 100 us of emulated busy time the busy ratio is not judged (too few frames)."""


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


@dataclass(slots=True)
class LinkTotals:
    """One cable direction's ``Kind.LINK_FIDELITY`` records merged."""

    gbps: float = 0.0
    frames: int = 0
    bytes: int = 0
    busy_model_ns: int = 0
    busy_real_ns: int = 0
    rx_drops: int = 0
    late: LagStats = field(default_factory=LagStats)

    def busy_pct(self) -> float | None:
        if self.busy_model_ns < MIN_BUSY_NS:
            return None
        return 100.0 * self.busy_model_ns / max(self.busy_real_ns, 1)

    def summary(self) -> dict[str, Any]:
        pct = self.busy_pct()
        return {"gbps": self.gbps, "frames": self.frames, "bytes": self.bytes, "rx_drops": self.rx_drops,
                "busy_pct": None if pct is None else round(pct, 2),
                "late_p50_us": round(self.late.quantile_us(0.5), 1),
                "late_p99_us": round(self.late.quantile_us(0.99), 1), "late_max_us": round(self.late.max_us, 1)}


def merge_links(records: Iterable[Mapping[str, Any]], lo_ns: int | None = None,
                hi_ns: int | None = None) -> dict[str, LinkTotals]:
    """Per link, its ``Kind.LINK_FIDELITY`` intervals overlapping [lo_ns, hi_ns] merged."""
    out: dict[str, LinkTotals] = {}
    for r in records:
        if r.get("kind") != Kind.LINK_FIDELITY or not isinstance(r.get("buckets"), Mapping):
            continue
        t, since = r.get("t_ns"), r.get("since_ns", r.get("t_ns"))
        if not (isinstance(t, int) and isinstance(since, int)):
            continue
        if (lo_ns is not None and t < lo_ns) or (hi_ns is not None and since > hi_ns):
            continue
        tot = out.setdefault(str(r.get("link", "?")), LinkTotals())
        tot.gbps = float(r.get("gbps", 0.0))
        tot.frames += int(r.get("frames", 0))
        tot.bytes += int(r.get("bytes", 0))
        tot.busy_model_ns += int(r.get("busy_model_ns", 0))
        tot.busy_real_ns += int(r.get("busy_real_ns", 0))
        tot.rx_drops += int(r.get("rx_drops", 0))
        tot.late.merge(LagStats.from_buckets(r["buckets"], float(r.get("max_us", 0.0))))
    return out


def judge_links(records: Iterable[Mapping[str, Any]] | Mapping[str, LinkTotals], *,
                threshold_us: float = DEFAULT_THRESHOLD_US) -> dict[str, Any]:
    """The links' part of the fidelity block: ``valid`` (no link fell behind), ``worst_link``
    and its figures, ``behind`` (the links that fell behind, each with why)."""
    links = records if isinstance(records, Mapping) else merge_links(records)
    behind: dict[str, str] = {}
    for name, t in links.items():
        pct, p99 = t.busy_pct(), t.late.quantile_us(0.99)
        if t.rx_drops:
            behind[name] = (f"{t.rx_drops} frames dropped arriving at it (its socket was full: the "
                            "datapath did not read them in time)")
        elif pct is not None and pct < 100 * MIN_BUSY_RATIO:
            behind[name] = f"achieved {pct:.1f}% of its {t.gbps:g} Gb/s while busy (< {100 * MIN_BUSY_RATIO:g}%)"
        elif t.late.samples and p99 >= threshold_us:
            behind[name] = f"departures late by {p99 / 1e3:.2f} ms at p99 (>= {threshold_us / 1e3:g} ms)"

    def badness(name: str) -> tuple[int, int, float, float]:
        t = links[name]
        pct = t.busy_pct()
        return (name in behind, t.rx_drops, -(pct if pct is not None else 100.0), t.late.quantile_us(0.99))

    worst = max(links, key=badness, default=None)
    w = links[worst].summary() if worst else {}
    return {"valid": not behind, "worst_link": worst, "worst_busy_pct": w.get("busy_pct"),
            "worst_late_p99_us": w.get("late_p99_us"), "behind": behind,
            "links": {n: links[n].summary() for n in sorted(links)}}


def judge(per_process: Mapping[str, LagStats], *, dilation: float,
          threshold_us: float = DEFAULT_THRESHOLD_US,
          links: Mapping[str, LinkTotals] | None = None) -> dict[str, Any]:
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
    if links:
        lj = judge_links(links, threshold_us=threshold_us)
        valid = valid and lj["valid"]
        worst_link: str | None = lj["worst_link"]
        w = lj["links"][worst_link]
        busy = "not busy long enough to judge" if w["busy_pct"] is None else f"{w['busy_pct']}% of its rate while busy"
        link_note = ("; ".join(f"link {n} fell behind: {why}" for n, why in sorted(lj["behind"].items()))
                     if lj["behind"] else f"every link kept to the model ({len(links)} cable directions)")
        link_note += (f"; worst link {worst_link} ({w['gbps']:g} Gb/s): {busy}, departures late by "
                      f"{w['late_p99_us']} us at p99 (max {w['late_max_us']} us)")
    else:
        worst_link, link_note = None, LINK_NOTE
    return {"valid": valid, "dilation": dilation, "threshold_us": threshold_us,
            "worst_lag_us": processes[worst]["p99_us"] if worst else None, "worst_process": worst,
            "processes": processes, "worst_link": worst_link, "note": f"{note}; {link_note}"}


def fidelity(records: Iterable[Mapping[str, Any]], *, dilation: float, threshold_us: float = DEFAULT_THRESHOLD_US,
             lo_ns: int | None = None, hi_ns: int | None = None) -> dict[str, Any]:
    """``judge`` of ``merge``: the fidelity block of a run from its lag log's records."""
    records = list(records)
    return judge(merge(records, lo_ns, hi_ns), dilation=dilation, threshold_us=threshold_us,
                 links=merge_links(records, lo_ns, hi_ns))
