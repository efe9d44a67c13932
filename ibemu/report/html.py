"""A run result as one self-contained HTML page (``ibemu report RESULT --html``).

``render(result) -> str`` is pure: no file, no network, no clock. The page carries everything
inline (CSS, a few lines of script, SVG figures), so it opens offline, from a mail or a CI
artifact, and fetches nothing. It shows what the terminal summary (``report.summary``) and the
PNG plots (``report.plots``) show, from the same data functions:

- the header and fidelity (valid, dilation, worst lag; an invalid run is marked INVALID at the
  top and on every figure, with ``INVALID_MARK``/``plots.INVALID_TITLE``);
- the topology (``ibemu.topo.svg``: tiers for trees and Clos, the same layouts as the PNG),
  each cable coloured and widened by the octets it carried (the result's optional
  ``link_load``), the targets of failing faults in red (``plots.failed_targets``);
- the reroute phases of each fault as horizontal bars (``plots._segments``);
- throughput per flow over time as step lines, a dashed red line at each fault
  (``plots._steps``);
- the faults, flows and fidelity tables (the summary's cell formats).

A result without ``link_load`` (older than it, or a RoCE run: its routers keep no PMA
counters) gets a note instead of the topology.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ibemu.report import plots
from ibemu.report.result import PHASES, FabricLoad, RunResult, as_result
from ibemu.report.summary import DASH, INVALID_MARK, _dest, _extra, _ms, _ms_of
from ibemu.topo.model import NodeKind, Topology
from ibemu.topo.svg import SVG_CSS, link_id, topology_svg

CHART_W = 900.0
FLOW_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
               "#17becf", "#393b79")

PAGE_CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; max-width: 1000px; padding: 12px 20px; color: #222; }
h1 { font-size: 22px; margin: 8px 0 2px; } h2 { font-size: 17px; margin: 22px 0 6px; border-bottom: 1px solid #ddd; }
.meta { color: #555; }
.banner { padding: 8px 12px; border-radius: 4px; margin: 10px 0; font-weight: 600; }
.banner.invalid { background: #fde0dc; color: #a50e0e; border: 2px solid #e41a1c; }
.banner.valid { background: #e6f4ea; color: #137333; }
.banner.unknown { background: #f1f3f4; color: #444; }
.invalid-mark { color: #a50e0e; font-weight: 700; }
figure { margin: 8px 0 16px; } figcaption { color: #555; font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
svg.chart { background: #fff; max-width: 100%; height: auto; }
svg.chart text { font: 10px sans-serif; fill: #333; }
svg.chart .axis { stroke: #555; } svg.chart .grid { stroke: #e5e5e5; }
svg.chart .fault { stroke: #d62728; stroke-dasharray: 5 3; }
svg.chart text.invalid, svg.topo text.invalid { fill: #e41a1c; font-weight: 700; font-size: 13px; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; cursor: pointer; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
.legend span.off { opacity: 0.35; }
"""

PAGE_JS = """
document.querySelectorAll('.legend span[data-flow]').forEach(function (item) {
  item.addEventListener('click', function () {
    item.classList.toggle('off');
    var hide = item.classList.contains('off');
    document.querySelectorAll('[data-series="' + item.dataset.flow + '"]').forEach(function (el) {
      el.style.display = hide ? 'none' : '';
    });
  });
});
"""
"""The page's only script: a click on a flow in the throughput legend hides or shows it."""


def _e(v: object) -> str:
    return escape(str(v))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool]) -> str:
    head = "".join(f'<th{" class=num" if n else ""}>{_e(h)}</th>' for h, n in zip(headers, numeric, strict=True))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if n else ""}>{_e(c)}</td>'
                                    for c, n in zip(row, numeric, strict=True)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _invalid_text(r: RunResult, x: float, y: float) -> str:
    """The INVALID mark inside a figure (every figure of an invalid run carries one)."""
    if not r.invalid:
        return ""
    return f'<text class="invalid" x="{x:.0f}" y="{y:.0f}">{_e(plots.INVALID_TITLE.rstrip(": "))}</text>'


def _figure(r: RunResult, title: str, body: str, caption: str = "") -> str:
    mark = f'<div class="invalid-mark">{_e(INVALID_MARK)}</div>' if r.invalid else ""
    cap = f"<figcaption>{_e(caption)}</figcaption>" if caption else ""
    return f'<figure class="{"invalid" if r.invalid else "valid"}"><h2>{_e(title)}</h2>{mark}{body}{cap}</figure>'


# --------------------------------------------------------------------------- topology


def topology_of(load: FabricLoad) -> Topology:
    """The fabric a result's ``link_load`` describes (nodes with enough ports for its cables)."""
    ports: dict[str, int] = dict.fromkeys(load.nodes, 1)
    ends: list[tuple[str, int, str, int]] = []
    for lk in load.links:
        a, ap = lk.a.rsplit(":", 1)
        b, bp = lk.b.rsplit(":", 1)
        ends.append((a, int(ap), b, int(bp)))
        ports[a] = max(ports.get(a, 1), int(ap))
        ports[b] = max(ports.get(b, 1), int(bp))
    topo = Topology("fabric")
    for name, kind in load.nodes.items():
        topo.add_node(name, NodeKind(kind), ports[name])
    for a_node, a_port, b_node, b_port in ends:
        topo.connect(a_node, a_port, b_node, b_port)
    return topo


def _bytes(n: int | None) -> str:
    if n is None:
        return DASH
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n} B"


def _topology(r: RunResult) -> str:
    if r.link_load is None:
        return _figure(r, "Topology", "<p>This result does not record the fabric's cables (<code>link_load</code>: "
                                      "results before it existed, and RoCE runs, have none).</p>")
    topo = topology_of(r.link_load)
    targets = plots.failed_targets(r)
    failed_links, failed_nodes = plots.resolve_targets(topo, targets)
    by_id = {f"link-{lk.a}-{lk.b}": lk for lk in r.link_load.links}
    busiest = max((lk.bytes or 0 for lk in r.link_load.links), default=0)
    loads = {lid: (lk.bytes or 0) / busiest for lid, lk in by_id.items() if busiest and lk.bytes is not None}
    titles = {lid: f"{lk.a} - {lk.b}: {_bytes(lk.bytes)}" for lid, lk in by_id.items()}
    svg = topology_svg(topo, loads=loads, failed_links={link_id(lk) for lk in failed_links},
                       failed_nodes=set(failed_nodes), titles=titles)
    if r.invalid:  # the mark inside the picture too
        svg = svg.replace('<g class="links">', _invalid_text(r, 10, 18) + '<g class="links">', 1)
    c = topo.counts()
    caption = (f"{c.switches} switches, {c.cas} hosts, {len(topo.links)} cables; colour and width: octets each "
               f"cable carried (both directions, busiest {_bytes(busiest)})")
    if targets:
        caption += f"; red: failed during the run ({', '.join(targets)})"
    top = sorted((lk for lk in r.link_load.links if lk.bytes), key=lambda lk: -(lk.bytes or 0))[:8]
    table = _table(["cable", "bytes"], [[f"{lk.a} - {lk.b}", _bytes(lk.bytes)] for lk in top], [False, True]) if top else ""
    return _figure(r, "Topology and cable load", svg + table, caption)


# --------------------------------------------------------------------------- charts


def _ticks(hi: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``hi``."""
    if hi <= 0:
        return [0.0, 1.0]
    raw = hi / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out, v = [], 0.0
    while v < hi + step * 0.999:
        out.append(round(v, 10))
        v += step
    return out


def _axes(x0: float, x1: float, y1: float, w: float, h: float, left: float, top: float,
          xlabel: str, ylabel: str, yticks: bool = True) -> tuple[str, Any, Any]:
    """Axes with grid and ticks; returns (svg, fx, fy) mapping data to pixels."""
    pw, ph = w - left - 20, h - top - 40
    yt = _ticks(y1)
    ymax = yt[-1]
    span = (x1 - x0) or 1.0

    def fx(x: float) -> float:
        return left + (x - x0) / span * pw

    def fy(y: float) -> float:
        return top + ph - (y / ymax) * ph if ymax else top + ph

    parts = []
    for v in yt if yticks else []:
        parts.append(f'<line class="grid" x1="{left}" x2="{left + pw:.1f}" y1="{fy(v):.1f}" y2="{fy(v):.1f}"/>'
                     f'<text x="{left - 4}" y="{fy(v) + 3:.1f}" text-anchor="end">{v:g}</text>')
    for v in _ticks(x1 - x0, 8):
        x = x0 + v
        if x <= x1 + 1e-9:
            parts.append(f'<text x="{fx(x):.1f}" y="{top + ph + 14:.1f}" text-anchor="middle">{x:g}</text>')
    parts.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{top}" y2="{top + ph:.1f}"/>'
                 f'<line class="axis" x1="{left}" x2="{left + pw:.1f}" y1="{top + ph:.1f}" y2="{top + ph:.1f}"/>'
                 f'<text x="{left + pw / 2:.1f}" y="{h - 6:.1f}" text-anchor="middle">{_e(xlabel)}</text>'
                 f'<text transform="translate(12 {top + ph / 2:.1f}) rotate(-90)" text-anchor="middle">{_e(ylabel)}</text>')
    return "".join(parts), fx, fy


def _throughput(r: RunResult) -> str:
    flows = [t for t in r.traffic if t.timeline.t_s]
    if not flows:
        return _figure(r, "Throughput per flow", "<p>No traffic timeline in this run.</p>")
    steps = {t.name: plots._steps(t) for t in flows}
    fault_ts = [f.t_fault_s for f in r.faults]
    x0 = min([0.0, *fault_ts])
    x1 = max([max(xs) for xs, _ in steps.values()] + fault_ts)
    x1 = x1 if x1 > x0 else x0 + 1.0
    y1 = max((max(ys, default=0.0) for _, ys in steps.values()), default=0.0)
    h = 320.0
    axes, fx, fy = _axes(x0, x1, y1 * 1.05, CHART_W, h, 56.0, 24.0, "time since traffic start (s)", "Gb/s")
    series = []
    legend = []
    for i, t in enumerate(flows):
        color = FLOW_COLORS[i % len(FLOW_COLORS)]
        xs, ys = steps[t.name]
        pts = []
        for j, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if j:
                pts.append(f"{fx(x):.1f},{fy(ys[j - 1]):.1f}")
            pts.append(f"{fx(x):.1f},{fy(y):.1f}")
        series.append(f'<polyline class="flow" data-series="{_e(t.name)}" fill="none" stroke="{color}" '
                      f'stroke-width="1.5" points="{" ".join(pts)}"><title>{_e(plots._flow_label(t))}</title></polyline>')
        legend.append(f'<span data-flow="{_e(t.name)}"><i style="background:{color}"></i>{_e(plots._flow_label(t))}'
                      f' {t.gbps:.2f} Gb/s</span>')
    marks = []
    for i, f in enumerate(r.faults, 1):
        x = fx(f.t_fault_s)
        marks.append(f'<line class="fault" x1="{x:.1f}" x2="{x:.1f}" y1="20" y2="{h - 40:.1f}">'
                     f'<title>#{i} at {f.t_fault_s:.2f} s: {_e(f.action)} {_e(f.target)}</title></line>'
                     f'<text x="{x:.1f}" y="16" text-anchor="middle" fill="#d62728">#{i}</text>')
    svg = (f'<svg class="chart throughput" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {CHART_W:.0f} {h:.0f}" '
           f'width="{CHART_W:.0f}" height="{h:.0f}">{axes}{"".join(series)}{"".join(marks)}'
           f'{_invalid_text(r, 64, 14)}</svg>')
    body = svg + f'<div class="legend">{"".join(legend)}</div>'
    faults = "; ".join(f"#{i} {f.action} {f.target} at {f.t_fault_s:.2f} s" for i, f in enumerate(r.faults, 1))
    return _figure(r, "Throughput per flow", body, f"dashed red: faults ({faults})" if faults else "")


def _phases(r: RunResult) -> str:
    if not r.faults:
        return _figure(r, "Reroute phases per fault", "<p>No faults injected in this run.</p>")
    n = len(r.faults)
    row_h, top, left = 34.0, 24.0, 250.0
    h = top + row_h * n + 44
    right = 0.0
    for f in r.faults:
        for _, start, width in plots._segments(f):
            right = max(right, start + width)
        right = max([right, *(fl.resume_ms for fl in f.flows if fl.resume_ms is not None)])
    axes, fx, _ = _axes(0.0, right * 1.15 or 1.0, 1.0, CHART_W, h, left, top, "time since the fault was injected (ms)",
                        "", yticks=False)
    bars = []
    for row, f in enumerate(r.faults):
        y = top + row * row_h + 6
        label = f"#{row + 1} {f.action} {f.target} at {f.t_fault_s:.2f} s"
        bars.append(f'<text x="{left - 6}" y="{y + 14:.1f}" text-anchor="end">{_e(label)}</text>')
        for phase, start, width in plots._segments(f):
            color, text = plots.PHASE_STYLE[phase]
            bars.append(f'<rect class="phase {phase}" x="{fx(start):.1f}" y="{y:.1f}" width="{max(fx(start + width) - fx(start), 1.0):.1f}" '
                        f'height="20" fill="{color}"><title>{_e(text)}: {_ms(getattr(f.phases, phase))} ms</title></rect>')
        reached = [(getattr(f.phases, p), p) for p in PHASES if getattr(f.phases, p) is not None]
        total = max((v for v, _ in reached), default=None)
        text = f"{total:.2f} ms" if total is not None else "no phase recorded"
        if reached and reached[-1][1] != PHASES[-1]:
            text += f" (up to {reached[-1][1]})"
        bars.append(f'<text x="{fx(total or 0.0) + 4:.1f}" y="{y + 14:.1f}">{_e(text)}</text>')
        resumes = [fl.resume_ms for fl in f.flows if fl.resume_ms is not None]
        if resumes:
            x = fx(max(resumes))
            bars.append(f'<path d="M{x - 5:.1f},{y - 4:.1f} L{x + 5:.1f},{y - 4:.1f} L{x:.1f},{y + 3:.1f} Z" fill="#000">'
                        f'<title>traffic resumed (last flow): {_ms(max(resumes))} ms</title></path>')
    svg = (f'<svg class="chart phases" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {CHART_W:.0f} {h:.0f}" '
           f'width="{CHART_W:.0f}" height="{h:.0f}">{axes}{"".join(bars)}{_invalid_text(r, left, 14)}</svg>')
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(t)}</span>' for c, t in plots.PHASE_STYLE.values())
    legend += "<span>&#9660; traffic resumed (last flow)</span>"
    rows = [[str(i), f"{f.t_fault_s:.3f}", f.action, f.target, *(_ms(getattr(f.phases, p)) for p in PHASES),
             _ms(f.phases.local_failover)] for i, f in enumerate(r.faults, 1)]
    table = _table(["#", "t (s)", "action", "target", *(f"{p} (ms)" for p in PHASES), "local failover (ms)"], rows,
                   [True, True, False, False, True, True, True, True, True])
    impacts = [[f"#{i}", fl.flow, _ms(fl.blackout_ms), _ms(fl.resume_ms), f"{fl.lost:,}",
                f"{fl.retransmitted:,}"] for i, f in enumerate(r.faults, 1) for fl in f.flows]
    flows = _table(["fault", "flow", "blackout (ms)", "resume (ms)", "lost", "retransmitted"], impacts,
                   [False, False, True, True, True, True]) if impacts else ""
    return _figure(r, "Reroute phases per fault", svg + f'<div class="legend">{legend}</div>' + table + flows,
                   "phases: ms since the fault was injected; - = did not happen")


# --------------------------------------------------------------------------- text sections


def _fidelity(r: RunResult) -> str:
    f = r.fidelity
    if f is None:
        return '<div class="banner unknown" id="fidelity">Fidelity unknown: not judged (a result from before it was)</div>'
    worst = _ms_of(f.worst_lag_us)
    thr = _ms_of(f.threshold_us)
    dil = f", time dilation {f.dilation:g}" if f.dilation != 1 else ""
    if f.dilation != 1 and f.worst_lag_us is not None:  # emulated lags are tiny: their real time too
        worst += f" emulated = {_ms_of(f.worst_lag_us * f.dilation)} real"
    if f.dilation != 1:
        thr = (f"{f.threshold_us:.3g} us emulated = {_ms_of(f.threshold_us * f.dilation)} real"
               + (f": {f.threshold_basis}" if f.threshold_basis else ""))
    if f.valid:
        head = (f'<div class="banner valid" id="fidelity">Valid: every process kept up with the emulated clock '
                f'(worst p99 lag {_e(worst)}, {_e(f.worst_process)}; threshold {_e(thr)}{dil})</div>')
    else:
        behind = ", ".join(f"{n} p99 lag {_ms_of(p.p99_us)}" for n, p in f.behind()) or f.note
        head = (f'<div class="banner invalid" id="fidelity">{_e(INVALID_MARK)}<br>fell behind: {_e(behind)}; '
                f'worst lag {_e(worst)}; threshold {_e(thr)}{dil}</div>')
    rows = [[n, _ms_of(p.p50_us), _ms_of(p.p99_us), _ms_of(p.max_us), f"{p.samples:,}"]
            for n, p in f.processes.items()]
    table = _table(["process", "p50 lag", "p99 lag", "max lag", "samples"], rows, [False, True, True, True, True])
    link = f"<p>worst link: {_e(f.worst_link)}</p>" if f.worst_link else ""
    return head + "<details><summary>Fidelity per process</summary>" + table + link + "</details>"


def _traffic_table(r: RunResult) -> str:
    if not r.traffic:
        return ""
    rows = [[t.name, t.kind, f"{_dest(t.src)} -> {_dest(t.dst)}" if t.src != t.dst
             else f"{_dest(t.src)} (all)", f"{t.gbps:,.2f}", f"{t.packets:,}", f"{t.bytes:,}",
             _extra(t.extra)] for t in r.traffic]
    return _table(["name", "kind", "from -> to", "Gb/s", "packets", "bytes", "details"], rows,
                  [False, False, False, True, True, True, False])


def _credit_loops(r: RunResult) -> str:
    """The deadlocks the IB user datapath's link model found (``credit_loops``), one row each."""
    if not r.credit_loops:
        return ""
    rows = [[f"{c.t_s:.3f}", str(len(c.hops)), f"{c.stalled_us:,.0f}", c.describe()] for c in r.credit_loops]
    table = _table(["at s", "ports", "stuck us", "egress port / VL, each waiting on the next"], rows,
                   [True, True, True, False])
    return _figure(r, "Credit loops (deadlocks)", table,
                   "a cycle of egress ports, each waiting for credits the next one holds: traffic on it stopped")


def render(result: RunResult | Mapping[str, Any]) -> str:
    """The whole page for ``result`` (an ``ibemu.run/1..3`` result, typed or as JSON)."""
    r = as_result(result)
    sc, fab = r.scenario, r.fabric
    title = f"ibemu run: {sc.name}"
    state = "INTERRUPTED" if r.interrupted else "completed"
    meta = (f"{fab.kind} ({fab.datapath} datapath), {fab.topology}: {fab.switches} switches, {fab.hosts} hosts, "
            f"{fab.links} links; {plots._subtitle(r).rsplit(', ', 1)[-1]}; started {r.started_at}, "
            f"{r.duration_s:.1f} s, {state}")
    up = f"fabric up in {r.bringup.fabric_s:.2f} s" + (
        f", SM up in {r.bringup.sm_s:.2f} s" if r.bringup.sm_s is not None else "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(('INVALID: ' if r.invalid else '') + title)}</title>",
        f"<style>{PAGE_CSS}{SVG_CSS}</style></head><body>",
        f'<h1>{_e(title)}</h1><div class="meta">{_e(sc.description or "")}</div>',
        f'<div class="meta">{_e(meta)}; {_e(up)}</div>',
        _fidelity(r),
        _topology(r),
        _phases(r),
        _throughput(r),
        "<h2>Flows</h2>", INVALID_MARK.join(["<p class=invalid-mark>", "</p>"]) if r.invalid else "",
        _traffic_table(r) or "<p>none</p>",
        _credit_loops(r),
        f"<script>{PAGE_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
