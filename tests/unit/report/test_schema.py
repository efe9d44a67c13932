"""ibemu.run/3: a good result passes; every kind of bad value is reported at its key path."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from ibemu.report import (
    SCHEMA_VERSION,
    Bringup,
    FabricInfo,
    FaultResult,
    FlowImpact,
    Phases,
    ResultError,
    RunResult,
    ScenarioInfo,
    SMInfo,
    Timeline,
    TrafficResult,
    dump,
    dumps,
    load,
    loads,
    validate,
)
from tests.unit.report.sample import result


def test_sample_is_valid() -> None:
    assert validate(result()) == []


def test_minimal_result_is_valid() -> None:
    r = RunResult(
        ScenarioInfo("tiny"),
        "2025-01-01T00:00:00",
        1.0,
        False,
        FabricInfo("ib", "kernel", 3, 1, 2, 2, "single-switch hosts=2"),
        SMInfo("none"),
        Bringup(0.1),
    )
    d = r.to_dict()
    assert validate(d) == []
    assert d["schema"] == SCHEMA_VERSION
    assert d["files"] == {"events": None, "json": None, "plots": [], "captures": []}


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    """``_set(d, "faults.0.phases_ms.trap", x)``; the value ``KeyError`` deletes the key."""
    *head, last = path.split(".")
    node: Any = d
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    key: Any = int(last) if isinstance(node, list) else last
    if value is KeyError:
        del node[key]
    else:
        node[key] = value


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "faults.0.phases_ms.trap",
            "fast",
            "faults[0].phases_ms.trap: expected number or null, got str 'fast'",
        ),
        (
            "faults.1.phases_ms.routed",
            True,
            "faults[1].phases_ms.routed: expected number or null, got bool",
        ),
        ("faults.0.phases_ms.detect", -0.5, "faults[0].phases_ms.detect: must be >= 0"),
        ("faults.0.phases_ms.programmed", KeyError, "faults[0].phases_ms.programmed: missing"),
        ("faults.0.flows.1.lost", 2.5, "faults[0].flows[1].lost: expected integer, got float 2.5"),
        ("faults.0.flows.0.retransmitted", -1, "faults[0].flows[0].retransmitted: must be >= 0"),
        (
            "faults.0.flows.0.blackout_ms",
            math.inf,
            "faults[0].flows[0].blackout_ms: expected finite number",
        ),
        ("faults.0.at_s", None, "faults[0].at_s: expected number, got null"),
        ("faults.0.flows", {}, "faults[0].flows: expected list, got object"),
        ("schema", "ibemu.run/4", "schema: expected 'ibemu.run/3' (or 'ibemu.run/1' or 'ibemu.run/2'), got str 'ibemu.run/4'"),
        ("started_at", "yesterday", "started_at: expected ISO-8601 timestamp, got 'yesterday'"),
        ("duration_s", "20", "duration_s: expected number, got str '20'"),
        ("interrupted", 0, "interrupted: expected true or false, got int 0"),
        ("fabric.kind", "ethernet", "fabric.kind: expected one of ib, roce, got 'ethernet'"),
        (
            "fabric.datapath",
            "kernal",
            "fabric.datapath: expected one of kernel, user, got 'kernal' (did you mean 'kernel'?)",
        ),
        ("fabric.nodes", 10, "fabric.nodes: 10 is fewer than switches + hosts (20 + 16)"),
        ("sm.impl", "osm", "sm.impl: expected one of ibemu, opensm, none"),
        ("sm.engine", 3, "sm.engine: expected string or null, got int 3"),
        ("bringup.sm_s", "n/a", "bringup.sm_s: expected number or null"),
        ("scenario.name", "", "scenario.name: must not be empty"),
        ("scenario", [], "scenario: expected object, got list"),
        ("traffic.2.to", [], "traffic[2].to: expected at least one host"),
        ("traffic.2.to.1", 7, "traffic[2].to[1]: expected string, got int 7"),
        ("traffic.0.packets", "many", "traffic[0].packets: expected integer"),
        ("traffic.1.extra", [1], "traffic[1].extra: expected object, got list"),
        ("traffic.1.extra.rate", math.nan, "traffic[1].extra.rate: expected finite number"),
        ("traffic.1.extra.when", object(), "traffic[1].extra.when: not a JSON value"),
        ("traffic.1.timeline.gbps.3", -2.0, "traffic[1].timeline.gbps[3]: must be >= 0"),
        ("traffic.1.name", "bulk", "traffic[1].name: 'bulk' already names traffic[0]"),
        ("files.plots", "a.png", "files.plots: expected list, got str 'a.png'"),
        ("files.events", KeyError, "files.events: missing"),
    ],
)
def test_bad_values_are_located(path: str, value: Any, expected: str) -> None:
    d = result()
    _set(d, path, value)
    problems = validate(d)
    assert any(p.startswith(expected) for p in problems), problems
    assert len(problems) == 1, problems


def test_unknown_keys_are_rejected_except_in_extra() -> None:
    d = result()
    d["fabric"]["toplogy"] = "x"
    d["notes"] = "hello"
    d["traffic"][0]["extra"]["anything"] = {"goes": [1, "two", None]}
    problems = validate(d)
    assert "fabric.toplogy: unknown key (did you mean 'topology'?)" in problems
    assert "notes: unknown key" in problems
    assert len(problems) == 2, problems


def test_timeline_checks() -> None:
    d = result()
    d["traffic"][0]["timeline"]["gbps"].pop()
    d["traffic"][1]["timeline"]["t_s"][5] += 0.05
    d["traffic"][2]["timeline"]["t_s"][1] = 0.0
    problems = validate(d)
    assert "traffic[0].timeline: t_s has 200 bins but gbps has 199" in problems
    assert any(
        p.startswith("traffic[1].timeline.t_s[5]: bins must have equal width 0.1 s")
        for p in problems
    )
    assert any(p.startswith("traffic[2].timeline.t_s: must increase") for p in problems)


def test_every_problem_is_reported_at_once() -> None:
    d = result()
    d["duration_s"] = -1
    d["faults"][1]["target"] = None
    d["traffic"][2]["gbps"] = "fast"
    assert [p.split(":")[0] for p in validate(d)] == [
        "duration_s",
        "faults[1].target",
        "traffic[2].gbps",
    ]


def test_not_an_object() -> None:
    assert validate([]) == ["result: expected object, got list []"]


def test_dataclasses_round_trip() -> None:
    d = result()
    r = RunResult.from_dict(d)
    assert r.traffic[2].dst == ["h3", "h6", "h7", "h10", "h11"]
    assert r.traffic[0].src == "h0"
    assert r.faults[1].phases.programmed == 19.4
    assert r.faults[0].flows[0] == FlowImpact("bulk", 9.8, 10.2, 37, 41)
    assert r.traffic[0].timeline.bin_s == pytest.approx(0.1)
    assert r.to_dict() == d


def test_from_dict_raises_with_every_problem() -> None:
    d = result()
    d["fabric"]["kind"] = "fc"
    d["faults"][0]["phases_ms"]["trap"] = "x"
    with pytest.raises(ResultError) as e:
        RunResult.from_dict(d, source="r.json")
    assert [p.split(":")[0] for p in e.value.problems] == [
        "fabric.kind",
        "faults[0].phases_ms.trap",
    ]
    assert str(e.value).startswith("r.json: not a valid ibemu.run/3 result:")


def test_json_round_trip(tmp_path: Path) -> None:
    d = result()
    path = dump(d, tmp_path / "sub" / "run.json")
    assert json.loads(path.read_text()) == d
    back = load(path)
    assert back.to_dict() == d
    assert loads(dumps(back)).to_dict() == d


def test_json_order_follows_the_schema() -> None:
    text = dumps(result())
    keys = list(json.loads(text))
    assert keys == [
        "schema",
        "scenario",
        "started_at",
        "duration_s",
        "interrupted",
        "fabric",
        "sm",
        "bringup",
        "faults",
        "traffic",
        "fidelity",
        "files",
    ]


def test_dump_refuses_an_invalid_result(tmp_path: Path) -> None:
    d = result()
    d["traffic"][0]["bytes"] = -5
    with pytest.raises(ResultError, match=r"traffic\[0\]\.bytes: must be >= 0"):
        dump(d, tmp_path / "run.json")
    assert not (tmp_path / "run.json").exists()


def test_loads_reports_bad_json() -> None:
    with pytest.raises(ResultError, match=r"(?s)x\.json: .*line 1 column 2"):
        loads("{oops", "x.json")


def test_built_from_dataclasses() -> None:
    fault = FaultResult(
        5.0,
        "link_down",
        "edge0_0:3",
        5.01,
        Phases(detect=0.2, programmed=4.0),
        [FlowImpact("a", 3.0, 3.5, 4, 0)],
    )
    traffic = TrafficResult(
        "a",
        "write_bw",
        "h0",
        "h3",
        1.5,
        10,
        40960,
        Timeline([0.0, 0.5, 1.0], [1.4, 0.0, 1.5]),
        {"qps": 1},
    )
    r = RunResult(
        ScenarioInfo("x", None, None),
        "2025-01-01T00:00:00Z",
        2.0,
        True,
        FabricInfo("roce", "user", 6, 2, 4, 5, "ring"),
        SMInfo("opensm", None, "h0"),
        Bringup(0.3, 0.2),
        [fault],
        [traffic],
    )
    d = json.loads(dumps(r))
    assert d["faults"][0]["phases_ms"] == {
        "detect": 0.2,
        "trap": None,
        "routed": None,
        "programmed": 4.0,
    }
    assert d["traffic"][0]["from"] == "h0" and d["traffic"][0]["to"] == "h3"
    assert RunResult.from_dict(d) == r


def test_readme_example_is_valid() -> None:
    """The README documents the schema with an example: it must stay a valid result."""
    import re

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = readme[readme.index("### Run results (ibemu.run/3)") :]
    block = re.search(r"```json\n(.*?)```", section, re.S)
    assert block is not None
    assert validate(json.loads(block.group(1))) == []


def test_an_ibemu_run_2_result_still_reads_and_keeps_its_key_names() -> None:
    """ibemu.run/3 renamed a bandwidth flow's MiB/s figures (``peak_mibps``/``avg_mibps``);
    a /2 file with the old names still loads and is written back as it was."""
    from ibemu.report.result import RunResult

    old = result()
    old["schema"] = "ibemu.run/2"
    old["traffic"][0]["extra"] = {"peak_mbps": 200.0, "avg_mbps": 183.0}
    assert validate(old) == []
    back = RunResult.from_dict(old).to_dict()
    assert back["schema"] == "ibemu.run/2" and back["traffic"][0]["extra"] == {"peak_mbps": 200.0, "avg_mbps": 183.0}
    no_fidelity = dict(old)
    del no_fidelity["fidelity"]
    assert validate(no_fidelity) == ["fidelity: missing"]


def test_credit_loops_optional_round_trip_and_summary() -> None:
    from ibemu.report import summary
    from ibemu.scenario.runner import credit_loops

    events = [{"kind": "credit_loop", "t_ns": 3_500_000_000, "stalled_us": 9318,
               "hops": [{"switch": f"sw{i}", "port": 3, "vl": 0} for i in range(5)]},
              {"kind": "fault", "t_ns": 1}]
    d = result()
    assert "credit_loops" not in RunResult.from_dict(d).to_dict()  # absent: not watched
    d["credit_loops"] = credit_loops(events, 1_000_000_000)
    assert validate(d) == []
    r = RunResult.from_dict(d)
    assert r.credit_loops is not None and r.credit_loops[0].hops[4] == ("sw4", 3, 0)
    assert r.to_dict()["credit_loops"] == d["credit_loops"] and d["credit_loops"][0]["t_s"] == 2.5
    text = summary(r)
    assert "Credit loops (deadlocks): 1" in text
    assert "at 2.500 s, 5 ports stuck 9,318 us: sw0:3/VL0 -> sw1:3/VL0" in text
    d["credit_loops"] = []
    assert validate(d) == [] and "Credit loops" not in summary(RunResult.from_dict(d))
    d["credit_loops"] = [{"t_s": 1.0, "hops": [{"switch": "sw0", "port": -1, "vl": 0}], "stalled_us": 1}]
    assert validate(d) == ["credit_loops[0].hops[0].port: must be >= 0, got -1"]
