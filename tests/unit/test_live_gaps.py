"""The live blackout watch of a traffic worker (``traffic.blackout.LiveGaps``) and what the
metrics endpoint makes of the files it writes (``fabric.metrics.RunEvents``)."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.core import Metric

from ibemu.fabric.metrics import RunEvents
from ibemu.traffic.blackout import LiveGaps


def test_the_longest_silence_and_the_open_one() -> None:
    g = LiveGaps(since_ns=1_000)
    for t in (500, 1_000, 2_000, 3_000, 10_000, 11_000, 10_500):  # a late stamp, out of order
        g(t)
    assert g.frames == 6  # 500 is before time zero
    assert (g.longest_ns, g.longest_end_ns, g.last_ns) == (7_000, 10_000, 11_000)
    d = g.as_dict(now_ns=20_000)
    assert d["silence_ns"] == 9_000 and d["longest_gap_ns"] == 7_000
    assert LiveGaps().as_dict(5)["silence_ns"] == 0  # nothing received yet: no silence to speak of


def _family(families: list[Metric], name: str) -> dict[tuple[str, ...], float]:
    (fam,) = [f for f in families if f.name == name]
    return {tuple(s.labels.values()): s.value for s in fam.samples if not s.name.endswith("_created")}


def test_run_events_serve_each_flows_live_watch(tmp_path: Path) -> None:
    (tmp_path / "flows-0.live.json").write_text(json.dumps(
        {"flows": ["probe"], "frames": 120, "last_ns": 9, "longest_gap_ns": 512_000_000,
         "longest_gap_end_ns": 7, "silence_ns": 3_000_000}))
    (tmp_path / "flows-1.live.json").write_text("{not json")  # being replaced: skipped
    ev = RunEvents(tmp_path)
    ev.update()
    fams = list(ev.families())
    assert _family(fams, "ibemu_flow_frames_received") == {("probe",): 120}
    assert _family(fams, "ibemu_flow_longest_gap_seconds") == {("probe",): 0.512}
    assert _family(fams, "ibemu_flow_silence_seconds") == {("probe",): 0.003}
    assert not [f for f in list(RunEvents(tmp_path / "none").families()) if f.name.startswith("ibemu_flow")]
