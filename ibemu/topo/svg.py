"""A topology as an inline SVG element (text), for HTML pages: the run report and the live view.

The layout is ``ibemu.topo.draw.layout``'s (tiers bottom-up for trees and Clos, a grid for tori,
groups for dragonflies, a seeded spring layout otherwise), so the page and the PNG plot agree.
Every cable is one ``<line>`` and every node one ``<g>`` with stable ids and ``data-*``
attributes, so a script can restyle them as the fabric changes:

- a cable: ``id="link-<a>-<b>"`` (``link_id``: its ends ``node:port`` in the topology's order),
  class ``link`` plus ``failed`` when marked, ``data-load`` (0..1) when loads are given;
- a node: ``id="node-<name>"``, class ``node switch`` or ``node host`` (plus ``failed``),
  ``data-name``.

Colours live in the page's CSS (``SVG_CSS``), not in the elements, except the per-link load
(stroke colour and width from ``load_style``) which is data.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from html import escape

from ibemu.topo.draw import layout
from ibemu.topo.model import Link, Topology

WIDTH = 960.0
MARGIN = 28.0
SWITCH_W, SWITCH_H = 14.0, 10.0
HOST_R = 4.5
LABEL_LIMIT = 40
"""Most nodes in one row that still get their names written."""

SVG_CSS = """
svg.topo { background: #fff; max-width: 100%; height: auto; }
svg.topo .link { stroke: #9aa5b1; stroke-width: 1.4; }
svg.topo .link.loaded { stroke-linecap: round; }
svg.topo .link.down, svg.topo .link.failed { stroke: #e41a1c !important; stroke-width: 3 !important;
  stroke-dasharray: 6 3; }
svg.topo .node rect { fill: #1f77b4; stroke: #0b3d63; }
svg.topo .node circle { fill: #6c757d; stroke: #343a40; }
svg.topo .node.failed rect, svg.topo .node.failed circle, svg.topo .node.down rect { fill: #e41a1c; }
svg.topo text { font: 9px sans-serif; fill: #333; }
"""
"""Styles the elements ``topology_svg`` makes (a page includes them once)."""


def link_id(link: Link) -> str:
    """The element id of a cable: ``link-edge0_0:1-h0:1``."""
    return f"link-{link.a}-{link.b}"


def load_style(fraction: float) -> tuple[str, float]:
    """(stroke colour, width) for a cable that carried ``fraction`` (0..1) of the busiest one's
    bytes: pale blue and thin to dark orange and thick."""
    f = min(max(fraction, 0.0), 1.0)
    lo, hi = (198, 219, 239), (217, 72, 1)
    r, g, b = (round(lo[i] + (hi[i] - lo[i]) * f) for i in range(3))
    return f"#{r:02x}{g:02x}{b:02x}", round(1.2 + 5.0 * f, 2)


def positions(topo: Topology, width: float = WIDTH) -> tuple[dict[str, tuple[float, float]], float]:
    """Node centres in SVG pixels (y down; the bottom tier at the bottom) and the height."""
    if not topo.nodes:
        return {}, 2 * MARGIN
    kind, raw = layout(topo)
    placed = {n: raw[n] for n in topo.nodes if n in raw}
    for i, n in enumerate(x for x in topo.nodes if x not in placed):  # unplaced: a row beneath
        placed[n] = (float(i), -1.0)
    xs = [p[0] for p in placed.values()]
    ys = [p[1] for p in placed.values()]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    rows = len({round(y, 6) for y in ys})
    height = max(160.0, 90.0 * rows) if kind == "layered" else max(320.0, width * 0.6)
    sx = (width - 2 * MARGIN) / ((x1 - x0) or 1.0)
    sy = (height - 2 * MARGIN) / ((y1 - y0) or 1.0)
    out = {n: (MARGIN + (x - x0) * sx if x1 > x0 else width / 2,
               height - MARGIN - (y - y0) * sy if y1 > y0 else height / 2)
           for n, (x, y) in placed.items()}
    return out, height


def topology_svg(topo: Topology, *, loads: Mapping[str, float] | None = None,
                 failed_links: Collection[str] = (), failed_nodes: Collection[str] = (),
                 titles: Mapping[str, str] | None = None, width: float = WIDTH) -> str:
    """``topo`` as one ``<svg class="topo">`` element.

    ``loads``: link id -> fraction of the busiest cable's bytes (0..1); ``failed_links``: link
    ids drawn red and dashed; ``failed_nodes``: node names drawn red; ``titles``: element id ->
    tooltip text (a ``<title>`` child).
    """
    pos, height = positions(topo, width)
    titles = titles or {}
    rows: dict[float, int] = {}
    for _, y in pos.values():
        rows[round(y, 1)] = rows.get(round(y, 1), 0) + 1
    parts = [f'<svg class="topo" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
             f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="topology {escape(topo.name)}">',
             '<g class="links">']
    for lk in topo.links:
        if lk.a.node not in pos or lk.b.node not in pos:
            continue
        lid = link_id(lk)
        (ax, ay), (bx, by) = pos[lk.a.node], pos[lk.b.node]
        cls = ["link"]
        style = ""
        if loads is not None and lid in loads:
            color, w = load_style(loads[lid])
            cls.append("loaded")
            style = f' style="stroke:{color};stroke-width:{w}" data-load="{loads[lid]:.4f}"'
        if lid in failed_links:
            cls.append("failed")
        tip = titles.get(lid, f"{lk.a} - {lk.b}")
        parts.append(f'<line id="{escape(lid)}" class="{" ".join(cls)}" x1="{ax:.1f}" y1="{ay:.1f}" '
                     f'x2="{bx:.1f}" y2="{by:.1f}" data-a="{escape(str(lk.a))}" data-b="{escape(str(lk.b))}"'
                     f'{style}><title>{escape(tip)}</title></line>')
    parts.append("</g>")
    parts.append('<g class="nodes">')
    for name, node in topo.nodes.items():
        if name not in pos:
            continue
        x, y = pos[name]
        nid = f"node-{name}"
        cls = ["node", "switch" if node.is_switch else "host"]
        if name in failed_nodes:
            cls.append("failed")
        shape = (f'<rect x="{x - SWITCH_W / 2:.1f}" y="{y - SWITCH_H / 2:.1f}" width="{SWITCH_W}" '
                 f'height="{SWITCH_H}" rx="2"/>' if node.is_switch else f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{HOST_R}"/>')
        label = ""
        if rows.get(round(y, 1), 0) <= LABEL_LIMIT:
            dy = -SWITCH_H if node.is_switch else HOST_R + 10
            label = f'<text x="{x:.1f}" y="{y + dy:.1f}" text-anchor="middle">{escape(name)}</text>'
        tip = titles.get(nid, name)
        parts.append(f'<g id="{escape(nid)}" class="{" ".join(cls)}" data-name="{escape(name)}">'
                     f'<title>{escape(tip)}</title>{shape}{label}</g>')
    parts.append("</g></svg>")
    return "\n".join(parts)
