"""Drawing: every layout renders a real image file."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.errors import ConfigError
from ibemu.topo import generate
from ibemu.topo import ibnetdiscover as ib
from ibemu.topo.draw import draw, layout

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("gen", "params", "kind"),
    [
        ("fat-tree", {"k": 4}, "layered"),
        ("leaf-spine", {}, "layered"),
        ("torus", {"dims": "3x3"}, "grid"),
        ("mesh", {"dims": "2x2x2"}, "grid"),
        ("dragonfly", {"routers_per_group": 2, "global_links": 1}, "groups"),
        ("ring", {}, "circle"),
    ],
)
def test_layouts(gen: str, params: dict[str, object], kind: str) -> None:
    t = generate(gen, params)
    got, pos = layout(t)
    assert got == kind
    assert set(pos) == set(t.nodes)


def test_layered_puts_tiers_in_rows() -> None:
    _, pos = layout(generate("fat-tree", k=4))
    assert pos["h0"][1] < pos["edge0_0"][1] < pos["agg0_0"][1] < pos["core0"][1]
    assert pos["edge0_0"][0] < pos["edge3_1"][0]


def test_draw_png(tmp_path: Path) -> None:
    out = draw(generate("fat-tree", k=4), tmp_path / "ft.png")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_draw_import_and_svg(tmp_path: Path) -> None:
    t = ib.loads(ib.dumps(generate("torus", dims="3x3")))  # no coords: falls back to spring/layered
    out = draw(t, tmp_path / "t.svg")
    assert out.read_text().lstrip().startswith("<?xml")


def test_draw_rejects_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"use a \.png, \.svg or \.pdf"):
        draw(generate("ring"), tmp_path / "x.gif")


def _failed_red_pixels(path: Path) -> int:
    import matplotlib.image as mpimg
    import numpy as np

    rgb = mpimg.imread(path)[..., :3]
    return int((np.abs(rgb - np.array([0xE4, 0x1A, 0x1C]) / 255).max(axis=2) < 0.03).sum())


def test_draw_marks_failed_links_and_nodes(tmp_path: Path) -> None:
    t = generate("fat-tree", k=4)
    plain = draw(t, tmp_path / "plain.png")
    link = draw(t, tmp_path / "link.png", failed_links=[t.links_between("agg0_0", "core0")[0]])
    node = draw(t, tmp_path / "node.png", failed_nodes=["core3"])
    both = draw(
        t, tmp_path / "both.png", failed_links=t.links_between("edge0_0", "h0"), failed_nodes=["core3"]
    )
    assert _failed_red_pixels(plain) == 0
    assert 0 < _failed_red_pixels(link) < _failed_red_pixels(node) < _failed_red_pixels(both)
