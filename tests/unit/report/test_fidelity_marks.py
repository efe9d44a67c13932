"""An invalid run is marked wherever its figures appear: summary, plots' titles, compare; an
ibemu.run/1 result still reads, its fidelity unknown."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ibemu.report import RunResult, summary
from ibemu.report.compare import compare, render
from ibemu.report.plots import INVALID_TITLE, phases_plot, throughput_plot, topology_plot
from ibemu.report.result import validate
from ibemu.report.summary import DILATION_NOTE, INVALID_MARK
from ibemu.topo import generate
from tests.unit.report.sample import result


def invalid() -> dict[str, Any]:
    d = result()
    f = d["fidelity"]
    f["processes"]["agent-host"] = {"p50_us": 120.0, "p99_us": 48_000.0, "max_us": 52_300.0, "samples": 2311}
    f.update(valid=False, worst_lag_us=48_000.0,
             note="agent-host fell behind the emulated clock: p99 lag 48.0 ms (max 52.3 ms) >= 2 ms")
    return d


def _section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
    out = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        out.append(ln)
    return out


def test_a_valid_run_says_so_and_carries_no_mark() -> None:
    text = summary(result())
    assert INVALID_MARK not in text
    fid = _section(text, "Fidelity")
    assert fid[0] == ("  valid: every process kept up with the emulated clock (worst p99 lag 0.81 ms, agent-host; "
                      "threshold 2.00 ms)")
    assert any(ln.split()[:1] == ["sm"] for ln in fid)
    assert "links: none timed" in fid[-1]
    assert DILATION_NOTE not in text


def test_an_invalid_run_is_marked_in_every_figure_section() -> None:
    text = summary(invalid())
    lines = text.splitlines()
    assert lines[next(i for i, ln in enumerate(lines) if ln.startswith("started ")) + 1] == INVALID_MARK
    fid = _section(text, "Fidelity")
    assert fid[0] == ("  INVALID: fell behind the emulated clock: agent-host p99 lag 48.00 ms (max 52.30 ms); "
                      "threshold 2.00 ms")
    for title in ("Fabric", "Faults", "Traffic"):
        assert _section(text, title)[0] == f"  {INVALID_MARK}", title


def test_dilation_adds_what_is_to_scale() -> None:
    d = result()
    d["fabric"]["dilation"] = 10.0
    d["fidelity"]["dilation"] = 10.0
    text = summary(d)
    assert "not to scale (ibemu's own CPU, N times shorter in emulated time)" in text
    assert "to scale (emulated clock): link rates and delays" in text and "fabric up is real seconds" in text


def test_under_dilation_the_lags_and_the_threshold_read_in_both_clocks() -> None:
    from ibemu.report.html import render as render_html
    from ibemu.scenario.fidelity import judge
    from tests.unit.test_fidelity import _stats

    d = result()
    d["fabric"]["dilation"] = 20_000.0
    d["fidelity"] = judge({"sm": _stats([0.15] * 100), "traffic job": _stats([3.2] * 100)}, dilation=20_000.0,
                          figure=("job fabric_s", 33.6))
    assert validate(d) == []
    r = RunResult.from_dict(d)
    assert r.fidelity is not None and r.fidelity.threshold_real_us == 33_600.0 and r.fidelity.figure_us == 33.6
    assert r.to_dict() == d  # the optional fields round-trip
    fid = _section(summary(d), "Fidelity")
    assert fid[0].startswith("  INVALID: fell behind the emulated clock: traffic job p99 lag 3.2 us emulated = "
                             "64 ms real (max 3.2 us emulated = 64 ms real); threshold 1.68 us emulated = "
                             "33.6 ms real: 5% of job fabric_s 33.6 us"), fid[0]
    assert fid[1].split() == ["process", "p50", "lag", "p99", "lag", "p99", "real", "max", "lag", "samples", "busy"]
    assert "threshold 1.68 us emulated = 33.60 ms real: 5% of job fabric_s" in render_html(d)
    d["fidelity"]["threshold_real_us"] = "2 ms"
    assert validate(d) == ["fidelity.threshold_real_us: expected number, got str '2 ms'"]


def test_a_run1_result_still_reads_with_fidelity_unknown() -> None:
    d = result()
    d["schema"] = "ibemu.run/1"
    del d["fidelity"]
    assert validate(d) == []
    r = RunResult.from_dict(d)
    assert r.fidelity is None and not r.invalid and r.to_dict() == d
    assert "unknown" in _section(summary(r), "Fidelity")[0]
    d["fidelity"] = result()["fidelity"]
    assert validate(d) == ["fidelity: unknown key in an ibemu.run/1 result"]
    run2 = result()
    del run2["fidelity"]
    assert validate(run2) == ["fidelity: missing"]


def test_plot_titles_carry_the_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    titles: list[str] = []
    sup, set_title = Figure.suptitle, Axes.set_title
    monkeypatch.setattr(Figure, "suptitle", lambda self, t, **kw: (titles.append(t), sup(self, t, **kw))[1])
    monkeypatch.setattr(Axes, "set_title", lambda self, t, *a, **kw: (titles.append(t), set_title(self, t, *a, **kw))[1])
    import ibemu.topo.draw as draw_mod

    drawn = draw_mod.draw
    monkeypatch.setattr(draw_mod, "draw", lambda topo, path, title="", **kw: (titles.append(title),
                                                                              drawn(topo, path, title=title, **kw))[1])
    topo = generate("fat-tree", k=4)
    for d in (result(), invalid()):
        titles.clear()
        throughput_plot(d, tmp_path / "t.png")
        phases_plot(d, tmp_path / "p.png")
        topology_plot(d, topo, tmp_path / "topo.png")
        mine = {t for t in titles if t.startswith(d["scenario"]["name"]) or t.startswith(INVALID_TITLE)}
        assert len(mine) == 3
        assert all(t.startswith(INVALID_TITLE) == (not d["fidelity"]["valid"]) for t in mine)


def test_compare_shows_each_sides_validity() -> None:
    ib = result()
    roce = copy.deepcopy(invalid())
    roce["fabric"]["kind"] = "roce"
    roce["sm"] = {"impl": "none", "engine": None, "host": None}
    c = compare(ib, roce)
    assert c["fidelity"]["ib"]["valid"] is True and c["fidelity"]["roce"]["valid"] is False
    text = render(c)
    assert "fidelity: ib valid, roce INVALID (agent-host p99 lag 48.00 ms)" in text
    assert "INVALID RUN" in text
    old = copy.deepcopy(ib)
    old["schema"] = "ibemu.run/1"
    del old["fidelity"]
    assert "fidelity: ib fidelity unknown, roce INVALID" in render(compare(old, roce))
