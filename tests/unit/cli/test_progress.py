"""Progress: plain lines off a terminal (as logs and scripts read them), rich's display on one,
nothing with --quiet."""

from __future__ import annotations

import io
import re

from ibemu.cli.progress import Reporter, on_terminal


def test_plain_lines_off_a_terminal() -> None:
    out = io.StringIO()
    assert not on_terminal(out)
    with Reporter(stream=out) as p:
        p("build", "k=4 fat-tree: 36 nodes")
        p("traffic", "flows started")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and re.fullmatch(r"\[\s*\d+\.\d\ds\] build     k=4 fat-tree: 36 nodes", lines[0]), lines
    labelled = io.StringIO()
    with Reporter(stream=labelled, label="ib") as p:
        p("sm", "SUBNET UP")
    assert "] ib     sm        SUBNET UP" in labelled.getvalue()


def test_quiet_prints_nothing() -> None:
    out = io.StringIO()
    with Reporter(stream=out, quiet=True, live=True) as p:
        p("build", "x")
    assert out.getvalue() == ""


def test_the_live_display_shows_every_phase_done_and_the_traffic_bar() -> None:
    out = io.StringIO()
    with Reporter(stream=out, live=True, traffic_s=4.0) as p:
        p("build", "36 nodes")
        p("sm", "SUBNET UP in 0.1 s")
        p("traffic", "flows started")
        p("teardown", "torn down")
    text = out.getvalue()
    for phase in ("build", "traffic", "teardown"):
        assert phase in text, text
    assert "✓" in text and "/4.0 s" in text
    assert re.search(r"traffic +flows started \(\d+\.\d\d s\)", text)  # timed: reported as it starts
    assert not re.search(r"SUBNET UP in 0.1 s \(", text)  # reported when done: no second figure
