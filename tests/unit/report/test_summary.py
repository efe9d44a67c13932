"""The terminal summary: every section, aligned columns, absent values shown as '-'."""

from __future__ import annotations

import pytest

from ibemu.report import ResultError, RunResult, summary
from ibemu.report.summary import table
from tests.unit.report.sample import result


def _section(text: str, title: str) -> list[str]:
    """Lines from the ``title`` line up to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(title))
    out = []
    for ln in lines[start + 1 :]:
        if not ln.strip():
            break
        out.append(ln)
    return out


def test_header_and_fabric() -> None:
    text = summary(result())
    assert text.startswith("ibemu run: default (scenarios/default.yaml)\n")
    assert "started 2025-03-14T10:21:07.512+00:00, 23.4 s, completed" in text
    fabric = _section(text, "Fabric")
    assert fabric == [
        "  ib (kernel datapath), fat-tree k=4: 36 nodes (20 switches, 16 hosts), 48 links",
        "  fabric up in 0.85 s",
        "  SM ibemu (ftree) on h0: SUBNET UP in 0.42 s",
    ]


def test_fault_phases_table() -> None:
    rows = _section(summary(result()), "Faults (2)")
    assert rows[0].split() == [
        "#",
        "at",
        "(s)",
        "t",
        "(s)",
        "action",
        "target",
        "detect",
        "(ms)",
        "trap",
        "(ms)",
        "routed",
        "(ms)",
        "programmed",
        "(ms)",
    ]
    assert rows[2].split() == [
        "1",
        "5.00",
        "5.012",
        "link_down",
        "agg0_0:3-core0:1",
        "0.31",
        "1.24",
        "3.40",
        "8.71",
    ]
    assert rows[3].split() == [
        "2",
        "12.00",
        "12.004",
        "switch_down",
        "core3",
        "0.52",
        "2.90",
        "6.10",
        "19.4",
    ]
    # right-aligned numbers end in the same column as their header
    assert rows[2].rindex("8.71") + 4 == len(rows[0]) == len(rows[3])


def test_flows_per_fault() -> None:
    text = summary(result())
    f1 = _section(text, "  Fault 1 (link_down agg0_0:3-core0:1), flows:")
    assert f1[2].split() == ["bulk", "9.80", "10.2", "37", "41"]
    assert f1[3].split() == ["probe", "0.20", "0.30", "0", "0"]
    f2 = _section(text, "  Fault 2 (switch_down core3), flows:")
    assert f2[2].split() == ["bulk", "-", "-", "0", "0"]
    assert f2[3].split() == ["probe", "21.3", "21.9", "213", "0"]


def test_traffic_table() -> None:
    rows = _section(summary(result()), "Traffic (3)")
    assert rows[0].split()[:7] == ["name", "kind", "from", "->", "to", "Gb/s", "packets"]
    assert rows[2].split()[:7] == ["bulk", "write_bw", "h0", "->", "h15", "2.41", "1,472,930"]
    assert "h2 -> h3,h6,... (5)" in rows[4]
    assert "busbw_gbps=0.93" in rows[4]
    assert "latency_us.p50=41.2" in rows[4]


def test_files_section() -> None:
    files = _section(summary(result()), "Files")
    assert files == [
        "  events    runs/default/events.jsonl",
        "  json      results/default.json",
        "  captures  runs/default/agg0_0-3.pcap",
    ]


def test_absent_parts() -> None:
    d = result()
    d["faults"] = []
    d["traffic"] = []
    d["interrupted"] = True
    d["sm"] = {"impl": "opensm", "engine": None, "host": None}
    d["bringup"]["sm_s"] = None
    d["files"] = {"events": None, "json": None, "plots": [], "captures": []}
    text = summary(RunResult.from_dict(d))
    assert "23.4 s, INTERRUPTED" in text
    assert "  SM opensm: never reached SUBNET UP" in text
    assert _section(text, "Faults (0)") == ["  none injected"]
    assert _section(text, "Traffic (0)") == ["  none"]
    assert "Files" not in text


def test_no_sm() -> None:
    d = result()
    d["sm"] = {"impl": "none", "engine": None, "host": None}
    assert "  no subnet manager" in summary(d)


def test_roce_fabric_names_its_fabric_manager() -> None:
    d = result()
    d["fabric"]["kind"] = "roce"
    d["sm"] = {"impl": "none", "engine": None, "host": None}
    d["bringup"]["sm_s"] = 0.012
    text = summary(d)
    assert "  fabric manager (ECMP routes over netlink): routes installed in 0.01 s" in text
    assert "subnet manager" not in text


def test_invalid_result_is_refused() -> None:
    d = result()
    d["fabric"]["links"] = "many"
    with pytest.raises(ResultError, match=r"fabric\.links"):
        summary(d)


def test_table_alignment() -> None:
    out = table(["a", "num"], [["long name", "1"], ["x", "1,234"]], [False, True], indent="")
    assert out.splitlines() == [
        "a            num",
        "---------  -----",
        "long name      1",
        "x          1,234",
    ]
