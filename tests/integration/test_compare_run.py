"""``ibemu compare`` end to end on a small fabric: one command, an IB run and a RoCE run of the
same scenario, both results and the comparison written, the side-by-side table printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ibemu.cli.main import main
from ibemu.kernel import netns
from ibemu.report import validate

pytestmark = pytest.mark.root

SCENARIO = """\
name: tiny-compare
description: 2-level fat-tree, a 4-rank ring allreduce, a leaf uplink cut
topology: {generator: fat-tree, k: 4, levels: 2}
fabric: {kind: roce, loss_pct: 0.5}
sm: {impl: ibemu, engine: ftree}
traffic:
  - {name: ring, kind: allreduce, hosts: [h0, h1, h2, h3], size: 256KiB}
faults:
  - {at_s: 1.5, action: link_down, link: edge0:3}
duration_s: 3
"""


def test_compare_runs_both_kinds(state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 run_ids: list[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["compare", str(path), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "ibemu compare: tiny-compare" in text and "roce: fabric manager (ECMP)" in text
    assert "0.5% of frames lost" in text and "ring: RoCE busbw is" in text
    runs = {k: json.loads((out / f"{k}.json").read_text()) for k in ("ib", "roce")}
    doc = json.loads((out / "compare.json").read_text())
    assert doc["schema"] == "ibemu.compare/1"
    for kind, r in runs.items():
        assert validate(r) == [] and r["fabric"]["kind"] == kind
        assert doc["runs"][kind] == r
        ring = r["traffic"][0]
        assert ring["extra"]["iterations"] >= 1 and ring["extra"]["wrong"] == 0, ring["extra"]
    # the RoCE cables lost frames, resent by the RC transport (IB loses only what was on the cut cable)
    resent = {k: r["traffic"][0]["extra"]["retransmitted"] for k, r in runs.items()}
    assert resent["roce"] > 2 * resent["ib"] + 50, resent
    c = doc["comparison"]
    fault = c["faults"][0]
    assert fault["phases_ms"]["trap"]["ib"] is not None and fault["phases_ms"]["trap"]["roce"] is None
    assert fault["phases_ms"]["detect"]["ib"] is not None and fault["phases_ms"]["detect"]["roce"] is not None
    assert c["efficiency"]["ring"] is not None and c["efficiency"]["ring"] > 0
    assert len(run_ids) == 2  # two runs, both torn down
    assert not [n for n in netns.list_names() if any(n.startswith(f"ibemu-{i}-") for i in run_ids)]
