"""Plots: real, non-empty images of sensible size; failures marked on the topology."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from ibemu.report import RunResult
from ibemu.report.plots import (
    failed_targets,
    phases_plot,
    resolve_targets,
    throughput_plot,
    topology_plot,
    write_plots,
)
from ibemu.topo import generate
from tests.unit.report.sample import result

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _image(path: Path) -> np.ndarray:
    assert path.read_bytes().startswith(PNG_MAGIC)
    img = mpimg.imread(path)
    assert img.ndim == 3
    return img


def _non_white(img: np.ndarray) -> float:
    """Share of pixels that are not (near) white: something was drawn."""
    return float((img[..., :3].min(axis=2) < 0.9).mean())


def _red(img: np.ndarray) -> int:
    """Pixels of the failure red (#e41a1c, not the core tier's #d62728)."""
    rgb = img[..., :3]
    return int((np.abs(rgb - np.array([0xE4, 0x1A, 0x1C]) / 255).max(axis=2) < 0.03).sum())


def test_throughput_plot(tmp_path: Path) -> None:
    img = _image(throughput_plot(result(), tmp_path / "tp.png"))
    h, w = img.shape[:2]
    assert w >= 900 and h >= 600  # three panels
    assert _non_white(img) > 0.05


def test_throughput_single_panel_and_many_flows(tmp_path: Path) -> None:
    d = result()
    one = dict(d, traffic=d["traffic"][:1])
    h1 = _image(throughput_plot(one, tmp_path / "one.png")).shape[0]
    h3 = _image(throughput_plot(d, tmp_path / "three.png")).shape[0]
    assert h3 > h1 * 1.3
    many = dict(d, traffic=[dict(d["traffic"][0], name=f"f{i}") for i in range(12)])
    img = _image(throughput_plot(RunResult.from_dict(many), tmp_path / "many.png"))
    assert img.shape[0] < h3  # more than PANEL_LIMIT flows share one panel


def test_phases_plot(tmp_path: Path) -> None:
    img = _image(phases_plot(result(), tmp_path / "ph.png"))
    h, w = img.shape[:2]
    assert w > h > 200
    assert _non_white(img) > 0.03


def test_phases_plot_grows_with_faults(tmp_path: Path) -> None:
    d = result()
    d["faults"] = d["faults"] * 4
    d["faults"][3] = dict(
        d["faults"][3], phases_ms={"detect": 0.4, "trap": None, "routed": None, "programmed": None}
    )
    h8 = _image(phases_plot(d, tmp_path / "eight.png")).shape[0]
    h2 = _image(phases_plot(result(), tmp_path / "two.png")).shape[0]
    assert h8 > h2 * 1.5


def test_empty_run_still_plots(tmp_path: Path) -> None:
    d = result()
    d["faults"], d["traffic"] = [], []
    assert _image(throughput_plot(d, tmp_path / "tp.png")).size > 0
    assert _image(phases_plot(d, tmp_path / "ph.png")).size > 0
    assert write_plots(d, None, tmp_path / "none") == []


def test_failed_targets_and_resolution() -> None:
    d = result()
    d["faults"].append(dict(d["faults"][0], action="link_up"))
    d["faults"].append(dict(d["faults"][0], action="port_flap", target="edge0_0-agg0_0"))
    assert failed_targets(d) == ["agg0_0:3-core0:1", "core3", "edge0_0-agg0_0"]
    topo = generate("fat-tree", k=4)
    links, nodes = resolve_targets(topo, [*failed_targets(d), "nosuch:1"])
    assert [str(lk.key()[0]) + "-" + str(lk.key()[1]) for lk in links] == [
        "agg0_0:3-core0:1",
        str(topo.links_between("edge0_0", "agg0_0")[0].key()[0])
        + "-"
        + str(topo.links_between("edge0_0", "agg0_0")[0].key()[1]),
    ]
    assert nodes == ["core3"]


def test_topology_plot_marks_failures_in_red(tmp_path: Path) -> None:
    topo = generate("fat-tree", k=4)
    marked = _image(topology_plot(result(), topo, tmp_path / "marked.png"))
    clean = _image(topology_plot(result(), topo, tmp_path / "clean.png", failed=[]))
    assert _red(marked) > 500
    assert _red(clean) == 0


def test_topology_plot_skips_unknown_targets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topo = generate("fat-tree", k=4)
    img = _image(topology_plot(result(), topo, tmp_path / "t.png", failed=["spine9"]))
    assert _red(img) == 0
    assert "cannot mark 'spine9' as failed: no node 'spine9'" in caplog.text


def test_write_plots(tmp_path: Path) -> None:
    paths = write_plots(result(), generate("fat-tree", k=4), tmp_path / "plots")
    assert [p.name for p in paths] == ["throughput.png", "phases.png", "topology.png"]
    for p in paths:
        assert p.parent == tmp_path / "plots"
        assert p.stat().st_size > 10_000
