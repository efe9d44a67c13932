"""``ibemu compare --variant local-failover`` end to end on a small fat-tree: a cable cut under two
probe streams, once with the switches failing over by themselves (``ftree_ar``, alternates and
fault notices) and once with SM-only recovery; both runs and the comparison written, the table
printed with both sides, the ``local_failover`` phase on side A only.

No blackout magnitude is asserted: on a loaded 2-core machine either side's can be stretched
by scheduling (``benchmarks/bench_local_failover.py`` measures them over fresh fabrics)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ibemu.cli.main import main
from ibemu.kernel import netns
from ibemu.report import validate

pytestmark = pytest.mark.root

SCENARIO = """\
name: tiny-failover
description: 2-level fat-tree, probe streams out of edge0, an edge0 uplink cut
topology: {generator: fat-tree, k: 4, levels: 2}
fabric: {kind: ib}
sm: {impl: ibemu, engine: ftree}
traffic:
  - {name: p1, kind: stream, from: h0, to: h5, size: 256, rate_pps: 2000}
  - {name: p2, kind: stream, from: h1, to: h7, size: 256, rate_pps: 2000}
faults:
  - {at_s: 1.5, action: link_down, link: edge0:3}
duration_s: 3
"""


def test_compare_local_failover_against_sm_only(state_dir: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                run_ids: list[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["compare", str(path), "--variant", "local-failover", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "VARIANT local-failover" in text
    assert "A: local-failover: ibemu SM (ftree_ar)" in text and "B: sm-only: ibemu SM (ftree_ar)" in text
    lf_row = next(ln for ln in text.splitlines() if ln.strip().startswith("local_failover (ms)"))
    assert lf_row.split()[-2:] == ["-", "-"] and lf_row.split()[-3] != "-"  # A failed over, B did not
    runs = {name: json.loads((out / f"{name}.json").read_text()) for name in ("local-failover", "sm-only")}
    doc = json.loads((out / "compare.json").read_text())
    assert doc["schema"] == "ibemu.compare/1"
    assert doc["runs"] == {"ib": runs["local-failover"], "roce": runs["sm-only"]}
    for r in runs.values():
        assert validate(r) == [] and r["fabric"]["kind"] == "ib" and r["sm"]["engine"] == "ftree_ar"
        assert [t["extra"]["delivered"] > 0 for t in r["traffic"]] == [True, True], r["traffic"]
    lf_fault, sm_fault = runs["local-failover"]["faults"][0], runs["sm-only"]["faults"][0]
    assert lf_fault["phases_ms"]["local_failover"] is not None  # the edge switch moved by itself
    assert "local_failover" not in sm_fault["phases_ms"]  # no alternates written: nothing moved before the SM
    assert sm_fault["phases_ms"]["programmed"] is not None  # the SM rerouted
    c = doc["comparison"]
    assert c["variant"] == "local-failover" and c["sides"] == {"ib": "local-failover", "roce": "sm-only"}
    fault = c["faults"][0]
    assert fault["phases_ms"]["local_failover"]["ib"] == lf_fault["phases_ms"]["local_failover"]
    assert fault["phases_ms"]["local_failover"]["roce"] is None
    # per flow the blackout of each side: the cut cable carried one of the streams (or its ACKs)
    both = [f for f, p in fault["blackout_ms"].items() if p["ib"] is not None and p["roce"] is not None]
    assert both and all(f"blackout {f} (ms)" in text for f in both), fault["blackout_ms"]
    assert len(run_ids) == 2  # two runs, both torn down
    assert not [n for n in netns.list_names() if any(n.startswith(f"ibemu-{i}-") for i in run_ids)]
