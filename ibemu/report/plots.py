"""Plots of a run: throughput per flow, reroute phases per fault, the topology with its failures.

Figures are built with matplotlib's object API (``matplotlib.figure.Figure``, rendered by Agg):
no pyplot state, no window, safe off the main thread. The format follows the file suffix
(.png, .svg, .pdf).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ibemu.report.result import PHASES, FaultResult, RunResult, TrafficResult, as_result
from ibemu.topo.model import Link, Topology

log = logging.getLogger(__name__)

DPI = 120
PANEL_LIMIT = 6
"""Up to this many flows get a panel each (own y scale); more share one panel."""
FAULT_COLOR = "#d62728"
PHASE_STYLE = {
    "detect": ("#9ecae1", "detect: port down seen"),
    "trap": ("#4292c6", "trap: trap 128 at the SM"),
    "routed": ("#fdae6b", "routed: new routes computed"),
    "programmed": ("#e6550d", "programmed: last LFT Set acked"),
}
FAILING_ACTIONS = ("link_down", "switch_down", "port_flap")
"""Fault actions whose target the topology plot marks as failed by default."""


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", facecolor="white")
    log.info("wrote %s", path)
    return path


def _dest(dst: str | list[str]) -> str:
    if isinstance(dst, str):
        return dst
    return ",".join(dst) if len(dst) <= 3 else f"{len(dst)} hosts"


def _flow_label(t: TrafficResult) -> str:
    if t.src == t.dst:
        return f"{t.name} ({t.kind}, {_dest(t.src)})"
    return f"{t.name} ({t.kind}, {_dest(t.src)} -> {_dest(t.dst)})"


def _steps(t: TrafficResult) -> tuple[list[float], list[float]]:
    """Bin starts plus the end of the last bin, so ``steps-post`` draws every bin in full."""
    xs, ys = list(t.timeline.t_s), list(t.timeline.gbps)
    width = t.timeline.bin_s
    if xs and width:
        xs.append(xs[-1] + width)
        ys.append(ys[-1])
    return xs, ys


def _mark_faults(ax: Axes, faults: Sequence[FaultResult], labels: bool) -> None:
    """A dashed line at each fault; ``labels``: its number just above the axes."""
    for i, f in enumerate(faults, 1):
        ax.axvline(f.t_fault_s, color=FAULT_COLOR, linestyle="--", linewidth=1.1, zorder=3)
        if labels:
            ax.annotate(
                f"#{i}",
                (f.t_fault_s, 1.0),
                xycoords=ax.get_xaxis_transform(),
                xytext=(0, 2),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
                fontweight="bold",
                color=FAULT_COLOR,
            )


def _fault_handles(faults: Sequence[FaultResult]) -> list[Line2D]:
    """Legend entries: the marker, then one line of text per fault."""
    handles = [
        Line2D([], [], color=FAULT_COLOR, linestyle="--", linewidth=1.1, label="fault injected")
    ]
    handles += [
        Line2D(
            [], [], linestyle="none", label=f"#{i} at {f.t_fault_s:.2f} s: {f.action} {f.target}"
        )
        for i, f in enumerate(faults, 1)
    ]
    return handles


def _no_data(ax: Axes, text: str) -> None:
    ax.text(
        0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#666"
    )
    ax.set_xticks([])
    ax.set_yticks([])


INVALID_TITLE = "INVALID RUN (fell behind its clock, not to scale): "
"""What every plot's title starts with when the run's fidelity is not valid."""


def _marked(r: RunResult, title: str) -> str:
    return INVALID_TITLE + title if r.invalid else title


def _subtitle(r: RunResult) -> str:
    f = r.fabric
    sm = (
        "no SM"
        if r.sm.impl == "none"
        else f"SM {r.sm.impl}" + (f" ({r.sm.engine})" if r.sm.engine else "")
    )
    return f"{f.topology}, {f.kind} {f.datapath} datapath, {sm}"


def throughput_plot(result: RunResult | Mapping[str, Any], path: str | Path) -> Path:
    """Throughput of every flow over time, a dashed red marker and label at each fault."""
    r = as_result(result)
    flows = [t for t in r.traffic if t.timeline.t_s]
    panels = len(flows) if 1 < len(flows) <= PANEL_LIMIT else 1
    fig = Figure(figsize=(10, 2.0 + 1.7 * panels if panels > 1 else 4.8))
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    fig.suptitle(_marked(r, f"{r.scenario.name}: throughput per flow\n{_subtitle(r)}"), fontsize=11)
    if not flows:
        _no_data(axes[0], "no traffic timeline in this run")
        return _save(fig, path)
    colors = [f"C{i % 10}" for i in range(len(flows))]
    if len(flows) > 10:
        from matplotlib import colormaps

        cmap = colormaps["tab20"]
        colors = [cmap(i % 20) for i in range(len(flows))]  # type: ignore[misc]
    for i, t in enumerate(flows):
        ax = axes[i] if panels > 1 else axes[0]
        xs, ys = _steps(t)
        ax.step(xs, ys, where="post", color=colors[i], linewidth=1.3, label=_flow_label(t))
        if panels > 1:
            ax.fill_between(xs, ys, step="post", color=colors[i], alpha=0.15)
    fault_ts = [f.t_fault_s for f in r.faults]
    start = min([0.0, *fault_ts])
    end = max([max(_steps(t)[0]) for t in flows] + fault_ts)
    if end <= start:
        end = start + 1.0
    for j, ax in enumerate(axes):
        _mark_faults(ax, r.faults, labels=(j == 0))
        ax.set_ylim(bottom=0)
        ax.set_xlim(start, end)
        ax.grid(True, alpha=0.3)
        ax.set_ylabel("Gb/s" if panels > 1 else "throughput (Gb/s)")
        handles, _ = ax.get_legend_handles_labels()
        if r.faults and j == 0:
            handles += _fault_handles(r.faults)
        ax.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize=8,
            frameon=False,
        )
    axes[-1].set_xlabel("time since traffic start (s)")
    fig.align_ylabels(axes)
    return _save(fig, path)


def _segments(f: FaultResult) -> list[tuple[str, float, float]]:
    """``(phase, start_ms, width_ms)``: each reached phase from the previous one reached."""
    out = []
    prev = 0.0
    for p in PHASES:
        v = getattr(f.phases, p)
        if v is None:
            continue
        start = min(prev, v)
        out.append((p, start, v - start))
        prev = max(prev, v)
    return out


def phases_plot(result: RunResult | Mapping[str, Any], path: str | Path) -> Path:
    """One horizontal bar per fault: detect, trap, routed, programmed (ms since the fault)."""
    r = as_result(result)
    n = len(r.faults)
    fig = Figure(figsize=(10, 1.9 + 0.75 * max(n, 1)))
    ax = fig.subplots()
    ax.set_title(_marked(r, f"{r.scenario.name}: reroute phases per fault\n{_subtitle(r)}"), fontsize=11)
    if not n:
        _no_data(ax, "no faults injected in this run")
        return _save(fig, path)
    seen: set[str] = set()
    resumed: Line2D | None = None
    right = 0.0
    resumed_label = "traffic resumed (last flow)"
    for row, f in enumerate(r.faults):
        y = n - 1 - row
        for phase, start, width in _segments(f):
            color, label = PHASE_STYLE[phase]
            ax.barh(
                y,
                width,
                left=start,
                height=0.55,
                color=color,
                edgecolor="white",
                linewidth=0.8,
                label=label if phase not in seen else None,
            )
            seen.add(phase)
            right = max(right, start + width)
        reached = [(getattr(f.phases, p), p) for p in PHASES if getattr(f.phases, p) is not None]
        total = max(v for v, _ in reached) if reached else None
        text = f"{total:.2f} ms" if total is not None else "no phase recorded"
        if reached and reached[-1][1] != PHASES[-1]:
            text += f" (up to {reached[-1][1]})"
        ax.annotate(
            text,
            (total or 0.0, y),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
        resumes = [fl.resume_ms for fl in f.flows if fl.resume_ms is not None]
        if resumes:
            (resumed,) = ax.plot(
                [max(resumes)],
                [y + 0.36],
                marker="v",
                color="black",
                markersize=7,
                linestyle="none",
                label=resumed_label,
            )
            right = max(right, max(resumes))
    ax.set_yticks(
        range(n),
        [
            f"#{n - y} {f.action} {f.target}\nat {f.t_fault_s:.2f} s"
            for y, f in zip(range(n), reversed(r.faults), strict=True)
        ],
        fontsize=8,
    )
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlim(0, right * 1.15 if right > 0 else 1.0)
    ax.set_xlabel("time since the fault was injected (ms)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    order = [i for i, lb in enumerate(labels) if lb != resumed_label]
    order += [labels.index(resumed_label)] if resumed is not None else []
    ax.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    return _save(fig, path)


def failed_targets(result: RunResult | Mapping[str, Any]) -> list[str]:
    """Targets of the faults that take a link or switch down, in order, without repeats."""
    r = as_result(result)
    out: list[str] = []
    for f in r.faults:
        if f.action in FAILING_ACTIONS and f.target not in out:
            out.append(f.target)
    return out


def resolve_targets(topology: Topology, targets: Iterable[str]) -> tuple[list[Link], list[str]]:
    """Split fault targets into links and node names of ``topology``; unknown ones are logged."""
    from ibemu.topo import refs
    links: list[Link] = []
    nodes: list[str] = []
    for target in targets:
        try:
            if ":" in target or "-" in target:  # node names never contain either
                links.append(refs.link(topology, target))
            else:
                nodes.append(refs.node(topology, target).name)
        except refs.RefError as e:
            log.warning("topology plot: cannot mark %r as failed: %s", target, e)
    return links, nodes


def topology_plot(
    result: RunResult | Mapping[str, Any],
    topology: Topology,
    path: str | Path,
    failed: Iterable[str] | None = None,
) -> Path:
    """The topology with failed links and switches in red.

    ``failed`` names links (any form a scenario accepts) and nodes; by default the targets of
    the run's ``link_down``, ``switch_down`` and ``port_flap`` faults.
    """
    from ibemu.topo.draw import draw

    r = as_result(result)
    targets = list(failed) if failed is not None else failed_targets(r)
    links, nodes = resolve_targets(topology, targets)
    c = topology.counts()
    title = (
        f"{r.scenario.name}: {topology.name}, {c.switches} switches, {c.cas} hosts, {c.links} links"
    )
    if targets:
        shown = ", ".join(targets[:4]) + (
            f" and {len(targets) - 4} more" if len(targets) > 4 else ""
        )
        title += f"\nfailed during the run (red): {shown}"
    return draw(topology, path, title=_marked(r, title), failed_links=links, failed_nodes=nodes)


def write_plots(
    result: RunResult | Mapping[str, Any], topology: Topology | None, out_dir: str | Path
) -> list[Path]:
    """Every plot that has data: ``throughput.png``, ``phases.png``, ``topology.png``."""
    r = as_result(result)
    out = Path(out_dir)
    paths: list[Path] = []
    if any(t.timeline.t_s for t in r.traffic):
        paths.append(throughput_plot(r, out / "throughput.png"))
    if r.faults:
        paths.append(phases_plot(r, out / "phases.png"))
    if topology is not None:
        paths.append(topology_plot(r, topology, out / "topology.png"))
    return paths
