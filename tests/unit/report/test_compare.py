"""The IB-vs-RoCE comparison: pairing of faults and flows, ratios, efficiency, the table, bad input."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ibemu.report import validate
from ibemu.report.compare import compare, document, render
from tests.unit.report.sample import result


def _pair() -> tuple[dict[str, Any], dict[str, Any]]:
    ib = result()
    ring = next(t for t in ib["traffic"] if t["name"] == "ring")
    ring["extra"] = {"iterations": 10, "time_us": 200_000.0, "algbw_gbs": 0.005, "busbw_gbs": 0.01, "wrong": 0}
    roce = copy.deepcopy(ib)
    roce["fabric"]["kind"] = "roce"
    roce["sm"] = {"impl": "none", "engine": None, "host": None}
    roce["bringup"] = {"fabric_s": 0.4, "sm_s": 0.006}
    roce["faults"][0]["phases_ms"] = {"detect": 0.5, "trap": None, "routed": 1.3, "programmed": 2.4}
    roce["faults"][0]["flows"][0]["blackout_ms"] = 4.9
    rring = next(t for t in roce["traffic"] if t["name"] == "ring")
    rring["extra"] = {"iterations": 4, "time_us": 500_000.0, "algbw_gbs": 0.002, "busbw_gbs": 0.004, "wrong": 0,
                      "retransmitted": 3088,
                      "error": "RETRY_EXC_ERR on rank 3"}
    next(t for t in roce["traffic"] if t["name"] == "bulk")["gbps"] = 1.205
    assert validate(ib) == [] and validate(roce) == []
    return ib, roce


def test_compare_pairs_faults_flows_and_figures() -> None:
    ib, roce = _pair()
    c = compare(ib, roce, {"loss_pct": 0.1, "delay_us": 0.0})
    assert c["schema"] == "ibemu.compare/1"
    assert c["kinds"] == {"ib": "ibemu SM (ftree)", "roce": "fabric manager (ECMP)"}
    assert c["bringup"]["sm_s"] == {"ib": 0.42, "roce": 0.006, "ratio": round(0.006 / 0.42, 4)}
    f1, f2 = c["faults"]
    assert (f1["action"], f1["target"]) == ("link_down", "agg0_0:3-core0:1")
    assert f1["phases_ms"]["trap"] == {"ib": 1.24, "roce": None, "ratio": None}
    assert f1["phases_ms"]["programmed"]["ratio"] == round(2.4 / 8.71, 4)
    assert f1["blackout_ms"]["bulk"] == {"ib": 9.8, "roce": 4.9, "ratio": 0.5}
    assert f2["blackout_ms"]["bulk"] == {"ib": None, "roce": None, "ratio": None}
    ring = next(t for t in c["traffic"] if t["name"] == "ring")
    assert ring["time_us"] == {"ib": 200_000.0, "roce": 500_000.0, "ratio": 2.5}
    assert ring["wrong"] == {"ib": 0, "roce": 0, "ratio": None}
    assert ring["retransmitted"] == {"ib": None, "roce": 3088, "ratio": None}
    assert ring["error"]["roce"].startswith("RETRY_EXC_ERR")
    assert c["efficiency"] == {"bulk": 0.5, "probe": 1.0, "ring": 0.4}


def test_render_puts_both_kinds_side_by_side() -> None:
    ib, roce = _pair()
    text = render(compare(ib, roce, {"loss_pct": 0.1, "delay_us": 20.0}))
    lines = text.splitlines()
    assert lines[0] == "ibemu compare: default (scenarios/default.yaml)"
    assert "0.1% of frames lost and 20 us added" in text
    trap = next(ln for ln in lines if ln.strip().startswith("trap (ms)"))
    assert trap.split()[-3:] == ["1.24", "-", "-"]
    busbw = next(ln for ln in lines if "ring busbw" in ln)
    assert busbw.split()[-3:] == ["0.01", "0.004", "0.40x"]
    assert any("ring time / iteration (us)" in ln and "500,000" in ln for ln in lines)
    assert "ring: RoCE busbw is 40.0% of IB's (efficiency loss 60.0%)" in text
    assert "its blackout is at least the gap between two iterations" not in text  # ring was not hit
    ib["faults"][0]["flows"].append({"flow": "ring", "blackout_ms": 900.0, "resume_ms": 950.0, "lost": 0,
                                     "retransmitted": 0})
    assert "its blackout is at least the gap between two iterations" in render(compare(ib, roce))
    assert any("ring error" in ln and "RETRY_EXC_ERR" in ln for ln in lines)


def test_document_keeps_both_runs() -> None:
    ib, roce = _pair()
    doc = document(ib, roce)
    assert validate(doc["runs"]["ib"]) == [] and validate(doc["runs"]["roce"]) == []
    assert doc["comparison"]["impairments"] == {"loss_pct": 0.0, "delay_us": 0.0}


def test_runs_of_the_wrong_kind_are_refused() -> None:
    ib, roce = _pair()
    with pytest.raises(ValueError, match="roce result is a ib run"):
        compare(ib, ib)
    roce["schema"] = "ibemu.run/4"
    with pytest.raises(ValueError, match=r"not an ibemu\.run result \(ibemu\.run/1, ibemu\.run/2, ibemu\.run/3\)"):
        compare(ib, roce)


def test_a_control_compares_two_runs_of_one_kind_and_says_how_fair_it_is() -> None:
    a = result()
    b = copy.deepcopy(a)
    ring = next(t for t in b["traffic"] if t["name"] == "ring")
    ring["extra"] = {**ring.get("extra", {}), "busbw_gbs": 0.0101}
    ring_a = next(t for t in a["traffic"] if t["name"] == "ring")
    ring_a["extra"] = {**ring_a.get("extra", {}), "busbw_gbs": 0.01}
    next(t for t in b["traffic"] if t["name"] == "bulk")["gbps"] *= 0.9
    with pytest.raises(ValueError, match="roce result is a ib run"):
        compare(a, b)  # not a control: the second must be RoCE
    c = compare(a, b, control="ib", physics="link model")
    assert c["control"] == "ib" and c["kinds"]["ib"].startswith("ib run A") and c["efficiency"]["ring"] == 1.01
    text = render(c)
    assert "CONTROL: both sides are ib runs" in text and "B/A" in text and "both runs timed by the same link model" in text
    assert "ring: control ratio 101.0% (run B's busbw over run A's; target 100 +- 3%: within)" in text
    assert "bulk: control ratio 90.0%" in text and "OUTSIDE" in text
    with pytest.raises(ValueError, match="roce result is a ib run"):
        compare(a, b, control="roce")


def _failover_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """Two IB runs of one scenario: A with local failover (the phase, short blackouts), B SM-only."""
    a = result()
    a["sm"]["engine"] = "ftree_ar"
    a["faults"][0]["phases_ms"]["local_failover"] = 0.56
    a["faults"][0]["flows"][0]["blackout_ms"] = 0.8
    b = copy.deepcopy(a)
    del b["faults"][0]["phases_ms"]["local_failover"]
    b["faults"][0]["flows"][0]["blackout_ms"] = 24.0
    next(t for t in b["traffic"] if t["name"] == "bulk")["gbps"] *= 0.9
    assert validate(a) == [] and validate(b) == []
    return a, b


def test_a_local_failover_variant_puts_both_ib_runs_side_by_side() -> None:
    a, b = _failover_pair()
    c = compare(a, b, variant="local-failover")
    assert c["variant"] == "local-failover" and c["control"] is None
    assert c["sides"] == {"ib": "local-failover", "roce": "sm-only"}
    assert c["kinds"] == {"ib": "local-failover: ibemu SM (ftree_ar)", "roce": "sm-only: ibemu SM (ftree_ar)"}
    f1, f2 = c["faults"]
    assert list(f1["phases_ms"]) == ["detect", "local_failover", "trap", "routed", "programmed"]
    assert f1["phases_ms"]["local_failover"] == {"ib": 0.56, "roce": None, "ratio": None}
    assert f2["phases_ms"]["local_failover"] == {"ib": None, "roce": None, "ratio": None}  # a variant always has it
    assert f1["blackout_ms"]["bulk"] == {"ib": 0.8, "roce": 24.0, "ratio": 30.0}  # SM-only over local failover
    assert c["efficiency"]["bulk"] == 0.9
    text = render(c)
    lines = text.splitlines()
    assert "VARIANT local-failover" in text and "CONTROL" not in text and "RoCE" not in text
    head = next(ln for ln in lines if "A: local-failover" in ln)
    assert "B: sm-only: ibemu SM (ftree_ar)" in head and head.split()[-1] == "sm-only/local-failover"
    lf = next(ln for ln in lines if ln.strip().startswith("local_failover (ms)"))
    assert lf.split()[-3:] == ["0.56", "-", "-"]
    black = next(ln for ln in lines if "blackout bulk" in ln)
    assert black.split()[-3:] == ["0.80", "24.0", "30.00x"]
    assert "fidelity: local-failover valid, sm-only valid" in text
    assert "bulk: sm-only throughput is 90.0% of local-failover's" in text
    doc = document(a, b, variant="local-failover")
    assert doc["runs"] == {"ib": a, "roce": b} and doc["comparison"]["variant"] == "local-failover"


def test_a_variant_takes_ib_runs_only_and_an_ib_roce_comparison_is_unchanged() -> None:
    a, b = _failover_pair()
    ib, roce = _pair()
    with pytest.raises(ValueError, match=r"the sm-only result is a roce run \(a local-failover comparison is of two IB"):
        compare(a, roce, variant="local-failover")
    with pytest.raises(ValueError, match="variant 'adaptive': one of local-failover"):
        compare(a, b, variant="adaptive")
    with pytest.raises(ValueError, match="a control or a variant, not both"):
        compare(a, b, control="ib", variant="local-failover")
    c = compare(ib, roce)
    assert c["variant"] is None and c["sides"] == {"ib": "ib", "roce": "roce"}
    assert "local_failover" not in c["faults"][0]["phases_ms"]  # neither run failed over: the old shape
    assert "local_failover (ms)" not in render(c)
    ib["faults"][0]["phases_ms"]["local_failover"] = 0.5  # an IB run that did: the row is there
    c = compare(ib, roce)
    assert c["faults"][0]["phases_ms"]["local_failover"] == {"ib": 0.5, "roce": None, "ratio": None}
    assert "local_failover (ms)" in render(c)
    assert compare(a, b, control="ib")["sides"] == {"ib": "ib-a", "roce": "ib-b"}
