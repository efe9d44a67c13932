"""A run's fidelity: did every ibemu process keep up with the emulated clock?

Each monitored process of a run writes its lag behind the emulated clock to ``RUN_DIR/lag.jsonl``
(``ibemu.lagmon``, ``Kind.LAG`` records, one per process and second). ``fidelity`` merges each
process's records over the measured window (from the flows' time zero to the end of the
drain: where every fault phase, blackout and throughput figure is taken; bring-up is ibemu's
own CPU cost and is reported as such) and judges the run:

    valid  <=>  at least one process reported, and every process's p99 lag < threshold_us

Lags are in emulated time (a real stall of X is X/N at dilation N). The threshold
(:func:`threshold`) is stated in real time and bounded by the run's own figures::

    threshold_us = min(R, max(R / N, FIGURE_FRACTION x figure_us))      (emulated us)

- ``R``: ``DEFAULT_REAL_THRESHOLD_US`` (2 ms) of *real* time, ``R / N`` emulated: at
  dilation 1 the rule is exactly the old one (2 ms), and at N = 20,000 it is 0.1 us emulated
  (the old rule's 2 ms emulated was 40 s of real time there, and judged nothing: training
  runs whose traffic worker was 3-30 us emulated behind at p99, 60-600 ms of real time and
  10-40% of the fabric time they measured, were valid).
  Scheduler jitter does not shrink with N, though: on a loaded 2-core machine an idle SM wakes
  3 ms (real) late at p99, 0.16 us emulated at N = 20,000, against a step's fabric time of
  34 us; the real-time rule alone would mark every dilated run of a shared machine invalid
  for lags no figure can see. Hence
- the *figure* bound: a p99 lag under ``FIGURE_FRACTION`` (5%) of the smallest time figure
  the run reports (:func:`figure_scale`: a training job's measured step and its fabric part,
  a latency flow's typical latency) distorts no figure by more than about that, so it passes
  even when it is more than ``R`` of real time. Without such a figure (bulk flows, fault
  timing only; and the live metrics during a run, before any figure exists) the threshold
  is ``R`` of emulated time, as at dilation 1: such a run prints nothing finer than the
  milliseconds it prints undilated, and a default-like run at the factor ``auto`` picks,
  with every process 2-3 ms (real) late at p99 on a quiet machine (0.3-0.4 ms emulated at
  N = 8), was INVALID under the real-time rule alone for lags none of its figures can show.
  ``time.lag_threshold_real_us`` given: the real-time rule, also without a figure. A deviation: the figure is the run's own, so a lag that inflates it
  loosens its own bound, by 5% of the inflation (a worker 5 us behind that stretched a 25 us
  fabric time to 37 us raised the bound from 1.25 to 1.86 us: still INVALID).
- ``min(R, ...)``: never looser than ``R`` of emulated time, the old rule (so dilation 1 is
  unchanged whatever the figures).

``time: {lag_threshold_real_us: R}`` sets ``R``; ``time: {lag_threshold_us: T}`` sets the
emulated threshold outright at every dilation (no real-time or figure part), as before. The
block reports the threshold both ways (``threshold_us`` emulated, ``threshold_real_us`` =
``threshold_us x N``) and which part set it (``threshold_basis``); ``worst_lag_us`` is the
highest p99 of any process (``worst_process``'s), emulated.

Links (the user datapaths: the IB agent host's ``ibemu.fabric.linkplane``, the RoCE routers'
``ibemu.roce.links``, both through ``ibemu.kernel.linkio``): each writes a
``Kind.LINK_FIDELITY`` record per cable direction and interval into the same log: frames, how
late each real departure left against the link model's time (a lag distribution), and the
model's against the real time over back-to-back frames, and the frames its switch port's
socket dropped (the datapath did not read them in time). Merged over the window like the
processes', a link *fell behind* when frames were dropped arriving at it, when its real
departures were late at p99 by ``threshold_us`` (the processes' threshold) or more, or when,
busy for at least :data:`MIN_BUSY_NS`, it achieved less than :data:`MIN_BUSY_RATIO` of its
configured rate; a run with such a link is invalid like one with a lagging process. ``worst_link`` names the link furthest behind (else the one with the
latest departures) with its figures; null when no link reported (the kernel datapaths).

Saturated traffic workers (``busy_pct``, ``ibemu.lagmon.BusyMeter``): a worker whose trio loop
had work waiting :data:`MAX_WORKER_BUSY_PCT` of the window's real time or more carried its
HCAs' frames about as fast as its CPU went, so its throughput figures are that CPU's, not the
fabric's, whatever its lag said (it wakes its monitor between batches, a few ms late). The
evidence (``benchmarks/bench_allreduce_physics.py --fabrics ib --sizes 16777216``: a 16-rank
ring of 16 MiB at 4x NDR, all lags under the bound in every run): at dilation 20,000 the
worker was busy 86% of the time and the ring reached 67-82% of its analytic bound (as the
benchmark then stated it); at 40,000, 70% busy and 90%; at 60,000, 90-96%. Under dilation (N > 1, where figures claim to be to
scale) such a run is invalid and the note says which worker and how busy; at dilation 1
every figure is ibemu's CPU anyway and nothing changes.
Every process's ``busy_pct`` is in the block where its records carry one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ibemu.events import Kind
from ibemu.lagmon import LagStats, round_us

DEFAULT_REAL_THRESHOLD_US = 2000.0
"""A process is behind when its p99 lag reaches 2 ms of real time (2000/N us emulated at
dilation N; see the module docstring for the figure bound). Trio's timers wake up to 1 ms late
by themselves (epoll's millisecond timeouts, rounded up), so a tighter bound would judge the
event loop's resolution rather than the process."""
DEFAULT_THRESHOLD_US = DEFAULT_REAL_THRESHOLD_US
"""The threshold at dilation 1 (emulated = real), and the most it is at any dilation."""
FIGURE_FRACTION = 0.05
"""A p99 lag under 5% of the run's smallest time figure passes whatever it is in real time."""
LINK_NOTE = "no link reported (links are timed on the user datapaths, IB and RoCE): worst_link is null"
MAX_WORKER_BUSY_PCT = 80.0
"""A traffic worker busy this share of the window (or more) set the pace (module docstring)."""
MIN_BUSY_RATIO = 0.97
"""A busy link achieving less than 97% of its configured rate fell behind."""
MIN_BUSY_NS = 100_000
"""Below 100 us of emulated busy time the busy ratio is not judged (too few frames)."""


def _windowed(records: Iterable[Mapping[str, Any]], kind: Kind, lo_ns: int | None,
              hi_ns: int | None) -> Iterator[Mapping[str, Any]]:
    """The ``kind`` records whose interval (``since_ns`` .. ``t_ns``) overlaps [lo_ns, hi_ns]."""
    for r in records:
        if r.get("kind") != kind:
            continue
        t, since = r.get("t_ns"), r.get("since_ns", r.get("t_ns"))
        if not (isinstance(t, int) and isinstance(since, int)):
            continue
        if (lo_ns is not None and t < lo_ns) or (hi_ns is not None and since > hi_ns):
            continue
        yield r


def merge(records: Iterable[Mapping[str, Any]], lo_ns: int | None = None,
          hi_ns: int | None = None) -> dict[str, LagStats]:
    """Per process, its ``Kind.LAG`` intervals overlapping [lo_ns, hi_ns] merged into one."""
    out: dict[str, LagStats] = {}
    for r in _windowed(records, Kind.LAG, lo_ns, hi_ns):
        if not isinstance(r.get("buckets"), Mapping):
            continue
        name = str(r.get("process", "?"))
        part = LagStats.from_buckets(r["buckets"], float(r.get("max_us", 0.0)))
        out.setdefault(name, LagStats()).merge(part)
    return out


def merge_busy(records: Iterable[Mapping[str, Any]], lo_ns: int | None = None,
               hi_ns: int | None = None) -> dict[str, float]:
    """Per process, its busy share over the ``Kind.LAG`` intervals overlapping [lo_ns, hi_ns]
    (weighted by their real length), in percent; processes whose records carry none are absent."""
    busy: dict[str, float] = {}
    wall: dict[str, float] = {}
    for r in _windowed(records, Kind.LAG, lo_ns, hi_ns):
        w = r.get("wall_s")
        if not (isinstance(r.get("busy"), (int, float)) and isinstance(w, (int, float)) and w > 0):
            continue
        name = str(r.get("process", "?"))
        busy[name] = busy.get(name, 0.0) + float(r["busy"]) * float(w)
        wall[name] = wall.get(name, 0.0) + float(w)
    return {name: 100.0 * busy[name] / wall[name] for name in busy}


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
                "late_p50_us": round_us(self.late.quantile_us(0.5)),
                "late_p99_us": round_us(self.late.quantile_us(0.99)), "late_max_us": round_us(self.late.max_us)}


def merge_links(records: Iterable[Mapping[str, Any]], lo_ns: int | None = None,
                hi_ns: int | None = None) -> dict[str, LinkTotals]:
    """Per link, its ``Kind.LINK_FIDELITY`` intervals overlapping [lo_ns, hi_ns] merged."""
    out: dict[str, LinkTotals] = {}
    for r in _windowed(records, Kind.LINK_FIDELITY, lo_ns, hi_ns):
        if not isinstance(r.get("buckets"), Mapping):
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
            behind[name] = f"departures late by {duration_text(p99)} at p99 (>= {duration_text(threshold_us)})"

    def badness(name: str) -> tuple[int, int, float, float]:
        t = links[name]
        pct = t.busy_pct()
        return (name in behind, t.rx_drops, -(pct if pct is not None else 100.0), t.late.quantile_us(0.99))

    worst = max(links, key=badness, default=None)
    w = links[worst].summary() if worst else {}
    return {"valid": not behind, "worst_link": worst, "worst_busy_pct": w.get("busy_pct"),
            "worst_late_p99_us": w.get("late_p99_us"), "behind": behind,
            "links": {n: links[n].summary() for n in sorted(links)}}

@dataclass(frozen=True, slots=True)
class Threshold:
    """The emulated threshold a run is judged on, and why (see the module docstring)."""

    us: float
    """Emulated microseconds."""
    dilation: float
    basis: str

    @property
    def real_us(self) -> float:
        return self.us * self.dilation


def check_threshold(value: object, what: str = "lag threshold") -> float:
    """``value`` as a threshold in us: a finite number > 0 (``ValueError`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a number of microseconds > 0, not {value!r}")
    return float(value)


def threshold(dilation: float, *, emulated_us: float | None = None, real_us: float | None = None,
              figure: tuple[str, float] | None = None) -> Threshold:
    """The threshold at ``dilation``: ``emulated_us`` outright when given (``time.lag_threshold_us``),
    else ``min(R, max(R / N, FIGURE_FRACTION x figure))`` with ``R = real_us`` (default
    ``DEFAULT_REAL_THRESHOLD_US``) and ``figure`` (name, emulated us) the run's smallest time
    figure (:func:`figure_scale`). Without a figure: ``R`` emulated, as at dilation 1, unless
    ``real_us`` was given (then the real-time rule alone).

    ``ValueError`` for a dilation below 1, a threshold that is not a number > 0, both
    overrides at once, or a figure that is not a number > 0."""
    n = float(dilation)
    if not (math.isfinite(n) and n >= 1):
        raise ValueError(f"dilation must be a number >= 1, not {dilation!r}")
    if emulated_us is not None and real_us is not None:
        raise ValueError("give the lag threshold in emulated time (lag_threshold_us) or in real time "
                         "(lag_threshold_real_us), not both")
    if emulated_us is not None:
        t = check_threshold(emulated_us, "lag_threshold_us")
        return Threshold(t, n, f"time.lag_threshold_us: {t:g} us emulated at any dilation")
    r = DEFAULT_REAL_THRESHOLD_US if real_us is None else check_threshold(real_us, "lag_threshold_real_us")
    real_rule = Threshold(r / n, n, f"{r / 1e3:g} ms of real time" + (f" / N = {duration_text(r / n)} emulated" if n != 1 else ""))
    if figure is None:
        if real_us is None and n != 1:  # nothing finer to protect: as at dilation 1
            return Threshold(r, n, f"{r / 1e3:g} ms emulated (the run reports no time figure finer than that)")
        return real_rule
    name, fig_us = figure
    if isinstance(fig_us, bool) or not isinstance(fig_us, (int, float)) or not (math.isfinite(fig_us) and fig_us > 0):
        raise ValueError(f"figure {name!r}: expected a time > 0 us, not {fig_us!r}")
    by_figure = FIGURE_FRACTION * fig_us
    if by_figure <= real_rule.us or n == 1:
        return real_rule
    if by_figure >= r:
        return Threshold(r, n, f"{r / 1e3:g} ms emulated (the most it is; {FIGURE_FRACTION:.0%} of {name} "
                         f"{duration_text(fig_us)} is more)")
    return Threshold(by_figure, n, f"{FIGURE_FRACTION:.0%} of {name} {duration_text(fig_us)} (more than {r / 1e3:g} ms "
                     f"of real time / N = {duration_text(r / n)})")



FIGURE_KEYS: dict[str, tuple[tuple[str, float], ...]] = {
    "training": (("step_s", 1e6), ("fabric_s", 1e6)),
    "write_lat": (("t_typical", 1.0),),
    "send_lat": (("t_typical", 1.0),),
}
"""Per traffic kind, the time figures of its ``extra`` the figure bound reads, each with its
factor to microseconds: a training job's measured step and fabric part, a latency flow's
typical (median) latency. Model figures (``model_*``, the NVLink phases the worker sleeps)
are not measured and are not read."""


def figure_scale(traffic: Iterable[Mapping[str, Any]]) -> tuple[str, float] | None:
    """The run's smallest measured time figure, (``"FLOW KEY"``, emulated us), from its result's
    ``traffic`` entries (:data:`FIGURE_KEYS`); None when it has none (a flow that failed, or
    measured 0, reports none)."""
    best: tuple[str, float] | None = None
    for t in traffic:
        keys = FIGURE_KEYS.get(str(t.get("kind")), ())
        extra = t.get("extra")
        if not keys or not isinstance(extra, Mapping) or extra.get("error"):
            continue
        for key, to_us in keys:
            v = extra.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                continue
            us = float(v) * to_us
            if best is None or us < best[1]:
                best = (f"{t.get('name', t.get('kind'))} {key}", us)
    return best


def judge(per_process: Mapping[str, LagStats], *, dilation: float,
          threshold_us: float | None = None, threshold_real_us: float | None = None,
          figure: tuple[str, float] | None = None,
          links: Mapping[str, LinkTotals] | None = None,
          busy: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The result's ``fidelity`` block from each process's lag distribution, judged on
    :func:`threshold` (``threshold_us``: emulated outright; ``threshold_real_us``: the real-time
    part; ``figure``: the run's smallest time figure, :func:`figure_scale`), and the traffic
    workers' busy shares (``busy``, percent: :func:`merge_busy`)."""
    th = threshold(dilation, emulated_us=threshold_us, real_us=threshold_real_us, figure=figure)
    n, t_us = th.dilation, _round(th.us)  # as the block says it (result.Fidelity.behind compares the same)
    busy = busy or {}
    processes = {name: {**s.summary(), **({"busy_pct": round(busy[name], 1)} if name in busy else {})}
                 for name, s in sorted(per_process.items()) if s.samples}
    worst = max(processes, key=lambda n: (processes[n]["p99_us"], processes[n]["max_us"]), default=None)
    behind = [name for name, p in processes.items() if p["p99_us"] >= t_us]
    saturated = ([name for name, p in processes.items() if name.startswith("traffic")
                  and p.get("busy_pct", 0.0) >= MAX_WORKER_BUSY_PCT] if n > 1 else [])
    valid = bool(processes) and not behind and not saturated
    limit = f"{lag_text(t_us, n)} ({th.basis})"
    if not processes:
        note = "no process reported its lag behind the emulated clock: fidelity unknown"
    elif behind:
        note = "; ".join(f"{name} fell behind the emulated clock: p99 lag {lag_text(processes[name]['p99_us'], n)} "
                         f"(max {lag_text(processes[name]['max_us'], n)}) >= {limit}"
                         for name in sorted(behind, key=lambda name: -processes[name]["p99_us"]))
    else:
        note = f"every process kept up: p99 lag under {limit}"
    if saturated:
        note += "; " + "; ".join(
            f"{name} was busy {processes[name]['busy_pct']:g}% of the time (>= {MAX_WORKER_BUSY_PCT:g}%): its HCAs' "
            f"frames went as fast as its CPU, so its throughput is ibemu's, not the fabric's (a larger dilation)"
            for name in saturated)
    if links:
        lj = judge_links(links, threshold_us=t_us)
        valid = valid and lj["valid"]
        worst_link: str | None = lj["worst_link"]
        w = lj["links"][worst_link]
        rate = "not busy long enough to judge" if w["busy_pct"] is None else f"{w['busy_pct']}% of its rate while busy"
        link_note = ("; ".join(f"link {name} fell behind: {why}" for name, why in sorted(lj["behind"].items()))
                     if lj["behind"] else f"every link kept to the model ({len(links)} cable directions)")
        link_note += (f"; worst link {worst_link} ({w['gbps']:g} Gb/s): {rate}, departures late by "
                      f"{w['late_p99_us']} us at p99 (max {w['late_max_us']} us)")
    else:
        worst_link, link_note = None, LINK_NOTE
    return {"valid": valid, "dilation": dilation, "threshold_us": t_us,
            "worst_lag_us": processes[worst]["p99_us"] if worst else None, "worst_process": worst,
            "processes": processes, "worst_link": worst_link, "note": f"{note}; {link_note}",
            "threshold_real_us": _round(th.real_us), "threshold_basis": th.basis,
            "figure_us": None if figure is None else _round(figure[1])}


def _round(us: float) -> float:
    """To 4 significant digits (a threshold of 0.1 us emulated stays 0.1)."""
    return float(f"{us:.4g}")


def duration_text(us: float) -> str:
    """``2 ms``, ``33.6 us``, ``0.1 us``: a duration in us, 3 significant digits."""
    if us >= 1000:
        return f"{us / 1e3:.3g} ms" if us < 1e6 else f"{us / 1e6:.3g} s"
    return f"{us:.3g} us"


def lag_text(us: float, dilation: float) -> str:
    """An emulated duration, with its real one when they differ: ``0.1 us emulated = 2 ms real``."""
    if dilation == 1:
        return duration_text(us)
    return f"{duration_text(us)} emulated = {duration_text(us * dilation)} real"


def fidelity(records: Iterable[Mapping[str, Any]], *, dilation: float, threshold_us: float | None = None,
             threshold_real_us: float | None = None, figure: tuple[str, float] | None = None,
             lo_ns: int | None = None, hi_ns: int | None = None) -> dict[str, Any]:
    """``judge`` of ``merge``: the fidelity block of a run from its lag log's records."""
    records = list(records)
    return judge(merge(records, lo_ns, hi_ns), dilation=dilation, threshold_us=threshold_us,
                 threshold_real_us=threshold_real_us, figure=figure, links=merge_links(records, lo_ns, hi_ns),
                 busy=merge_busy(records, lo_ns, hi_ns))
