"""A picture of a topology (PNG, SVG or PDF) with matplotlib's Agg backend.

Layouts: layered (tiers bottom-up: hosts, edge/leaf, aggregation, core) for trees and Clos,
a grid for tori and meshes, groups on a circle for dragonflies, and a seeded spring layout
for anything else. Names are drawn while a tier is small enough to read them. Failed links and
nodes (``failed_links``, ``failed_nodes``) can be marked in red.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from pathlib import Path

from ibemu.errors import ConfigError
from ibemu.topo.analysis import infer_levels
from ibemu.topo.model import Link, NodeKind, Topology

log = logging.getLogger(__name__)

LABEL_LIMIT = 48  # most nodes in one tier that still get their names drawn
_TIER_COLORS = ["#6c757d", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
FAILED_COLOR = "#e41a1c"
_TIER_COLORS_NO_RED = [c if c != "#d62728" else "#17becf" for c in _TIER_COLORS]
"""Tier colours when failures are marked: red means failed."""


def _layered(topo: Topology) -> dict[str, tuple[float, float]]:
    levels = infer_levels(topo)
    tiers: dict[int, list[str]] = {}
    for name in topo.nodes:  # generation order keeps pods/leaves together
        tiers.setdefault(levels[name], []).append(name)
    widest = max(len(v) for v in tiers.values())
    pos = {}
    for lvl, names in tiers.items():
        n = len(names)
        for i, name in enumerate(names):
            pos[name] = ((i + 0.5) * widest / n, float(lvl))
    return pos


def _grid(topo: Topology) -> dict[str, tuple[float, float]]:
    pos: dict[str, tuple[float, float]] = {}
    for n in topo.switches():
        c = n.coords or (0,)
        x, y = c[0], (c[1] if len(c) > 1 else 0)
        z = c[2] if len(c) > 2 else 0
        pos[n.name] = (x * 2.0 + z * 0.45, y * 2.0 + z * 0.45)
    for n in topo.cas():
        sw = next((end.node for _, end in topo.neighbors(n.name) if end.node in pos), None)
        if sw is None:
            continue
        siblings = [e.node for _, e in topo.neighbors(sw) if topo.nodes[e.node].is_ca]
        k = siblings.index(n.name)
        ang = math.pi / 4 + k * 2 * math.pi / max(len(siblings), 1)
        sx, sy = pos[sw]
        pos[n.name] = (sx + 0.6 * math.cos(ang), sy + 0.6 * math.sin(ang))
    return pos


def _groups(topo: Topology) -> dict[str, tuple[float, float]]:
    groups: dict[int, list[str]] = {}
    for n in topo.switches():
        groups.setdefault(n.group or 0, []).append(n.name)
    ng = len(groups)
    big = max(3.0, ng * 0.9)
    pos: dict[str, tuple[float, float]] = {}
    for gi, (_, names) in enumerate(sorted(groups.items())):
        ga = 2 * math.pi * gi / ng
        cx, cy = big * math.cos(ga), big * math.sin(ga)
        for ri, name in enumerate(names):
            ra = ga + 2 * math.pi * ri / len(names)
            pos[name] = (cx + 0.8 * math.cos(ra), cy + 0.8 * math.sin(ra))
    for n in topo.cas():
        sw = next((e.node for _, e in topo.neighbors(n.name) if e.node in pos), None)
        if sw is None:
            continue
        sx, sy = pos[sw]
        d = math.hypot(sx, sy) or 1.0
        siblings = [e.node for _, e in topo.neighbors(sw) if topo.nodes[e.node].is_ca]
        k = siblings.index(n.name)
        spread = (k - (len(siblings) - 1) / 2) * 0.25
        pos[n.name] = (sx + 0.7 * sx / d - spread * sy / d, sy + 0.7 * sy / d + spread * sx / d)
    return pos


def _circle(topo: Topology) -> dict[str, tuple[float, float]]:
    sws = topo.switches()
    pos: dict[str, tuple[float, float]] = {}
    for i, n in enumerate(sws):
        a = 2 * math.pi * i / len(sws)
        pos[n.name] = (math.cos(a), math.sin(a))
    for n in topo.cas():
        sw = next((e.node for _, e in topo.neighbors(n.name) if e.node in pos), None)
        if sw is None:
            continue
        siblings = [e.node for _, e in topo.neighbors(sw) if topo.nodes[e.node].is_ca]
        k = siblings.index(n.name)
        sx, sy = pos[sw]
        a = math.atan2(sy, sx) + (k - (len(siblings) - 1) / 2) * 0.15
        pos[n.name] = (1.35 * math.cos(a), 1.35 * math.sin(a))
    return pos


def layout(topo: Topology) -> tuple[str, dict[str, tuple[float, float]]]:
    """Choose a layout for ``topo``: ``(kind, positions)``."""
    nodes = topo.nodes
    switches = topo.switches()
    if topo.generator == "dragonfly":
        return "groups", _groups(topo)
    if switches and all(n.coords is not None and len(n.coords) >= 2 for n in switches):
        return "grid", _grid(topo)
    levels = infer_levels(topo)
    tree_like = all(levels[lk.a.node] != levels[lk.b.node] for lk in topo.iter_switch_links())
    if (tree_like and len(set(levels.values())) > 1) or len(nodes) > 400:
        return "layered", _layered(topo)
    import networkx as nx

    g = nx.Graph()
    g.add_nodes_from(nodes)
    g.add_edges_from(
        (lk.a.node, lk.b.node) for lk in topo.links if lk.a.node in nodes and lk.b.node in nodes
    )
    # A ring (or other cycle of switches) reads best as a circle with the hosts outside it.
    if topo.generator == "ring":
        return "circle", _circle(topo)
    raw = nx.spring_layout(g, seed=1)  # numpy-only below 500 nodes
    return "spring", {k: (float(v[0]), float(v[1])) for k, v in raw.items()}


def draw(
    topo: Topology,
    path: str | Path,
    title: str | None = None,
    dpi: int = 120,
    failed_links: Iterable[Link] = (),
    failed_nodes: Iterable[str] = (),
) -> Path:
    """Render ``topo`` to ``path`` (format from the suffix: .png, .svg, .pdf).

    ``failed_links`` and ``failed_nodes`` are drawn in red (a failed node's cables too).
    """
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ConfigError(f"cannot draw to {path.name!r}: use a .png, .svg or .pdf file name")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind, pos = layout(topo)
    levels = infer_levels(topo)
    n = len(topo.nodes)
    tiers: dict[int, int] = {}
    for lvl in levels.values():
        tiers[lvl] = tiers.get(lvl, 0) + 1
    width = (
        min(40.0, max(8.0, max(tiers.values(), default=1) * 0.32))
        if kind == "layered"
        else min(30.0, max(8.0, math.sqrt(n) * 1.1))
    )
    height = max(5.0, 1.6 * len(tiers)) if kind == "layered" else width * 0.85
    fig, ax = plt.subplots(figsize=(width, height))
    segs_sw: list[tuple[tuple[float, float], tuple[float, float]]] = []
    segs_host: list[tuple[tuple[float, float], tuple[float, float]]] = []
    segs_failed: list[tuple[tuple[float, float], tuple[float, float]]] = []
    crosses: list[tuple[float, float]] = []  # midpoints of the links that failed themselves
    down_nodes = {name for name in failed_nodes if name in pos}
    down_links = {lk.key() for lk in failed_links}
    highlight = bool(down_nodes or down_links)
    tier_colors = _TIER_COLORS_NO_RED if highlight else _TIER_COLORS
    for lk in topo.links:
        if lk.a.node not in pos or lk.b.node not in pos:
            continue
        seg = (pos[lk.a.node], pos[lk.b.node])
        if lk.key() in down_links or lk.a.node in down_nodes or lk.b.node in down_nodes:
            segs_failed.append(seg)
            if lk.key() in down_links:
                crosses.append(((seg[0][0] + seg[1][0]) / 2, (seg[0][1] + seg[1][1]) / 2))
            continue
        both_sw = topo.nodes[lk.a.node].is_switch and topo.nodes[lk.b.node].is_switch
        (segs_sw if both_sw else segs_host).append(seg)
    from matplotlib.collections import LineCollection

    lw = 0.4 if len(topo.links) > 1500 else 0.8
    ax.add_collection(LineCollection(segs_host, colors="#bbbbbb", linewidths=lw, zorder=1))
    ax.add_collection(LineCollection(segs_sw, colors="#555555", linewidths=lw, alpha=0.7, zorder=1))
    if segs_failed:
        ax.add_collection(
            LineCollection(
                segs_failed,
                colors=FAILED_COLOR,
                linewidths=max(2.0, lw * 2.5),
                linestyles="dashed",
                zorder=2.5,
                label="failed link",
            )
        )
        if crosses and len(crosses) <= LABEL_LIMIT:
            ax.scatter(
                [m[0] for m in crosses],
                [m[1] for m in crosses],
                marker="x",
                s=60,
                c=FAILED_COLOR,
                linewidths=2,
                zorder=4,
            )
    for kind_ in (NodeKind.CA, NodeKind.ROUTER, NodeKind.SWITCH):
        members = [m for m in topo.nodes.values() if m.kind is kind_ and m.name in pos]
        if not members:
            continue
        xs = [pos[m.name][0] for m in members]
        ys = [pos[m.name][1] for m in members]
        if kind_ is NodeKind.SWITCH:
            colors = [tier_colors[levels[m.name] % len(tier_colors)] for m in members]
            ax.scatter(
                xs, ys, s=140 if n < 200 else 40, marker="s", c=colors, zorder=3, label="switch"
            )
        else:
            marker = "o" if kind_ is NodeKind.CA else "D"
            ax.scatter(
                xs,
                ys,
                s=40 if n < 200 else 8,
                marker=marker,
                c="#ff7f0e",
                zorder=2,
                label=kind_.value.upper(),
            )
    if down_nodes:
        ax.scatter(
            [pos[m][0] for m in sorted(down_nodes)],
            [pos[m][1] for m in sorted(down_nodes)],
            s=220 if n < 200 else 70,
            marker="s",
            facecolors=FAILED_COLOR,
            edgecolors="black",
            linewidths=1.2,
            zorder=3.5,
            label="failed switch"
            if all(topo.nodes[m].is_switch for m in down_nodes)
            else "failed node",
        )
    for lvl, count in tiers.items():
        if count > LABEL_LIMIT:
            continue
        for name, l2 in levels.items():
            if l2 == lvl and name in pos:
                x, y = pos[name]
                is_sw = topo.nodes[name].is_switch
                ax.annotate(
                    name,
                    (x, y),
                    fontsize=7,
                    ha="center",
                    va="bottom" if is_sw else "top",
                    xytext=(0, 7 if is_sw else -6),
                    textcoords="offset points",
                    zorder=4,
                    color=FAILED_COLOR if name in down_nodes else "black",
                    fontweight="bold" if name in down_nodes else "normal",
                )
    c = topo.counts()
    ax.set_title(
        title or f"{topo.name}: {c.switches} switches, {c.cas} CAs, {c.links} links", fontsize=11
    )
    if highlight:  # below the drawing: failures are often at the top right (core switches)
        ax.legend(
            loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=5, fontsize=8, frameon=False
        )
    else:
        ax.legend(loc="upper right", fontsize=8, framealpha=0.8)
    ax.autoscale()
    ax.margins(0.05)
    ax.set_axis_off()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    log.info("drew %s (%s layout) to %s", topo.name, kind, path)
    return path
