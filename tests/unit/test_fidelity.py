"""A run's fidelity from its lag log: the window, the merge per process, the validity rule."""

from __future__ import annotations

from typing import Any

import pytest

from ibemu.events import Kind
from ibemu.lagmon import LagStats
from ibemu.report.result import validate
from ibemu.scenario.fidelity import (
    DEFAULT_THRESHOLD_US,
    MAX_WORKER_BUSY_PCT,
    fidelity,
    judge,
    merge,
    merge_busy,
)
from tests.unit.report.sample import result


def _rec(process: str, t_ns: int, lags_us: list[float], since_ns: int | None = None,
         busy: tuple[float, float] | None = None) -> dict[str, Any]:
    s = LagStats()
    for v in lags_us:
        s.add(v)
    return {"kind": Kind.LAG.value, "t_ns": t_ns, "process": process, "pid": 1,
            "since_ns": t_ns - 1_000_000_000 if since_ns is None else since_ns, "period_us": 10_000,
            **s.summary(), "buckets": s.buckets(), "final": False,
            **({} if busy is None else {"busy": busy[0], "wall_s": busy[1]})}


def _stats(lags: list[float]) -> LagStats:
    s = LagStats()
    for v in lags:
        s.add(v)
    return s


def test_a_quiet_run_is_valid_and_names_its_worst_process() -> None:
    f = judge({"agent-host": _stats([100.0] * 100), "sm": _stats([300.0] * 100)}, dilation=1.0)
    assert f["valid"] is True and f["worst_process"] == "sm" and 300.0 <= f["worst_lag_us"] <= 340.0
    assert f["threshold_us"] == DEFAULT_THRESHOLD_US and f["worst_link"] is None
    assert "no link reported" in f["note"] and set(f["processes"]) == {"agent-host", "sm"}
    assert f["processes"]["sm"]["samples"] == 100


def test_a_process_over_the_threshold_at_p99_makes_the_run_invalid() -> None:
    # 2% of the samples 30 ms late: p99 is 30 ms
    f = judge({"agent-host": _stats([100.0] * 98 + [30_000.0] * 2), "sm": _stats([50.0] * 100)},
              dilation=4.0, threshold_real_us=2000.0)
    assert f["valid"] is False and f["worst_process"] == "agent-host" and f["dilation"] == 4.0
    assert f["worst_lag_us"] >= 30_000.0 and f["threshold_us"] == 500.0 and f["threshold_real_us"] == 2000.0
    assert f["note"].startswith("agent-host fell behind the emulated clock: p99 lag 30 ms emulated = 120 ms real "
                                "(max 30 ms emulated = 120 ms real) >= 500 us emulated = 2 ms real")


def test_one_late_wakeup_in_a_thousand_is_not_behind_but_its_max_shows() -> None:
    f = judge({"sm": _stats([100.0] * 999 + [80_000.0])}, dilation=1.0)
    assert f["valid"] is True and f["processes"]["sm"]["max_us"] == 80_000.0


def test_the_threshold_is_configurable_and_nothing_measured_is_not_valid() -> None:
    stats = {"sm": _stats([500.0] * 100)}
    assert judge(stats, dilation=1.0, threshold_us=400.0)["valid"] is False
    f = judge({}, dilation=1.0)
    assert f["valid"] is False and f["worst_process"] is None and f["worst_lag_us"] is None
    assert "no process reported" in f["note"]


def test_records_merge_per_process_within_the_window() -> None:
    s = 1_000_000_000
    recs = [
        _rec("sm", 1 * s, [90_000.0] * 50),          # bring-up, before the window: left out
        _rec("sm", 11 * s, [100.0] * 100),
        _rec("sm", 12 * s, [200.0] * 100),
        _rec("agent-host", 12 * s, [300.0] * 100),
        _rec("sm", 30 * s, [90_000.0] * 50),         # after the window: left out
        {"kind": "carrier", "t_ns": 11 * s},          # not a lag record
        _rec("traffic a", 25 * s, [10.0], since_ns=19 * s),  # its final interval overlaps the end
    ]
    m = merge(recs, 10 * s, 20 * s)
    assert set(m) == {"sm", "agent-host", "traffic a"}
    assert m["sm"].samples == 200 and m["sm"].max_us == 200.0
    everything = merge(recs)
    assert everything["sm"].samples == 300 and everything["sm"].max_us == 90_000.0
    block = fidelity(recs, dilation=1.0, lo_ns=10 * s, hi_ns=20 * s)
    assert block["valid"] is True and block["worst_process"] == "agent-host"


def test_a_saturated_traffic_worker_invalidates_a_dilated_run_whatever_its_lag() -> None:
    """Busy shares merge per process over the window, weighted by real time; a traffic worker
    at or over MAX_WORKER_BUSY_PCT makes a dilated run invalid with its lag far under the
    threshold, an agent host as busy does not, and at dilation 1 nothing changes."""
    s = 1_000_000_000
    recs = [
        _rec("traffic ring", 1 * s, [0.01] * 100, busy=(0.2, 1.0)),   # before the window: left out
        _rec("traffic ring", 11 * s, [0.01] * 100, busy=(0.99, 3.0)),
        _rec("traffic ring", 12 * s, [0.01] * 100, busy=(0.87, 1.0)),
        _rec("agent-host", 12 * s, [0.01] * 100, busy=(0.99, 1.0)),
        _rec("sm", 12 * s, [0.01] * 100),                            # an old record: no share
    ]
    shares = merge_busy(recs, 10 * s, 20 * s)
    assert set(shares) == {"traffic ring", "agent-host"}
    assert shares["traffic ring"] == pytest.approx(100 * (0.99 * 3 + 0.87) / 4)
    block = fidelity(recs, dilation=20_000.0, lo_ns=10 * s, hi_ns=20 * s, figure=("ring time_us", 963.0))
    assert block["worst_lag_us"] < block["threshold_us"]
    assert block["valid"] is False and "traffic ring was busy 96% of the time" in block["note"], block["note"]
    assert "agent-host was busy" not in block["note"]
    assert block["processes"]["traffic ring"]["busy_pct"] == 96.0 and "busy_pct" not in block["processes"]["sm"]
    assert fidelity(recs, dilation=1.0, lo_ns=10 * s, hi_ns=20 * s)["valid"] is True
    calm = [_rec("traffic ring", 11 * s, [0.01] * 100, busy=((MAX_WORKER_BUSY_PCT - 1) / 100, 1.0))]
    assert fidelity(calm, dilation=20_000.0, figure=("ring time_us", 963.0))["valid"] is True
    d = result()
    d["fidelity"] = block
    assert validate(d) == []


def test_the_block_fits_the_run_schema() -> None:
    d = result()
    d["fidelity"] = judge({"agent-host": _stats([100.0] * 98 + [30_000.0] * 2)}, dilation=2.0)
    assert validate(d) == []
    d["fidelity"] = judge({}, dilation=1.0)
    assert validate(d) == []
    d["fidelity"]["valid"] = True
    assert validate(d) == ["fidelity.valid: true with no process measured"]


def _link(link: str, *, busy_model: int, busy_real: int, late_us: list[float]) -> dict[str, object]:
    from ibemu.lagmon import LagStats

    s = LagStats()
    for x in late_us:
        s.add(x)
    return {"kind": "link_fidelity", "t_ns": 2_000_000_000, "since_ns": 1_000_000_000, "link": link,
            "gbps": 100.0, "frames": len(late_us), "bytes": 4138 * len(late_us), "busy_model_ns": busy_model,
            "busy_real_ns": busy_real, **s.summary(), "buckets": s.buckets(), "final": False}


def test_links_that_kept_to_the_model_leave_the_run_valid_and_name_the_worst() -> None:
    from ibemu.scenario.fidelity import merge_links

    recs = [_link("sw0:2", busy_model=10_000_000, busy_real=10_010_000, late_us=[5.0] * 100),
            _link("sw0:1", busy_model=10_000_000, busy_real=10_000_000, late_us=[1.0] * 100)]
    # dilation 100: 20 us emulated (2 ms real); the host 5 us (0.5 ms real), the links' 5 us late
    f = judge({"agent-host": _stats([5.0] * 100)}, dilation=100.0, links=merge_links(recs))
    assert f["valid"] is True and f["worst_link"] == "sw0:2"
    assert "every link kept to the model" in f["note"] and "sw0:2" in f["note"]


def test_frames_dropped_arriving_at_a_switch_port_invalidate_the_run() -> None:
    from ibemu.scenario.fidelity import judge_links

    rec = _link("sw0:1", busy_model=10_000_000, busy_real=10_000_000, late_us=[1.0] * 100)
    rec["rx_drops"] = 42
    lj = judge_links([rec])
    assert lj["valid"] is False and lj["worst_link"] == "sw0:1" and "42 frames dropped" in lj["behind"]["sw0:1"]


def test_a_link_that_fell_behind_invalidates_the_run() -> None:
    from ibemu.scenario.fidelity import judge_links, merge_links

    slow = _link("leaf0:3", busy_model=10_000_000, busy_real=12_000_000, late_us=[50.0] * 100)
    late = _link("leaf1:1", busy_model=0, busy_real=0, late_us=[5000.0] * 100)
    ok = _link("spine0:1", busy_model=10_000_000, busy_real=10_000_000, late_us=[1.0] * 100)
    lj = judge_links([slow, late, ok])
    assert lj["valid"] is False and set(lj["behind"]) == {"leaf0:3", "leaf1:1"}
    assert lj["worst_link"] == "leaf0:3" and "83.3%" in lj["behind"]["leaf0:3"]
    f = judge({"agent-host": _stats([100.0] * 100)}, dilation=100.0, links=merge_links([slow, ok]))
    assert f["valid"] is False and "link leaf0:3 fell behind" in f["note"]


# --- the threshold: real time, bounded by the run's figures (scenario.fidelity.threshold) ---


def test_the_default_threshold_is_two_ms_of_real_time_at_every_dilation() -> None:
    from ibemu.scenario.fidelity import DEFAULT_REAL_THRESHOLD_US, threshold

    fig = ("lat t_typical", 1.0)  # a figure too small to relax anything
    for n, emulated in ((1, 2000.0), (4, 500.0), (100, 20.0), (20_000, 0.1)):
        t = threshold(n, figure=fig)
        assert t.us == pytest.approx(emulated) and t.real_us == pytest.approx(DEFAULT_REAL_THRESHOLD_US), n
    assert threshold(1).basis == "2 ms of real time"
    assert threshold(20_000, figure=fig).basis == "2 ms of real time / N = 0.1 us emulated"
    # a run with no time figure of its own (bulk flows, fault timing) is judged as at dilation 1
    for n in (1, 4, 20_000):
        assert threshold(n).us == 2000.0
    assert threshold(8).basis.startswith("2 ms emulated (the run reports no time figure")
    assert threshold(8, real_us=2000.0).us == 250.0  # the real-time rule, when asked for


def test_a_process_behind_in_real_time_is_invalid_at_a_high_factor() -> None:
    # at N = 20,000: an SM 0.05 us emulated behind at p99 (1 ms real) keeps up; a worker 12 us
    # behind (240 ms real: the old rule's 2 ms emulated passed it) does not
    stats = {"sm": _stats([0.02] * 99 + [0.05]), "traffic job": _stats([0.02] * 90 + [12.0] * 10)}
    f = judge(stats, dilation=20_000.0, threshold_real_us=2000.0)
    assert f["valid"] is False and f["worst_process"] == "traffic job"
    assert f["threshold_us"] == 0.1 and f["threshold_real_us"] == 2000.0 and f["figure_us"] is None
    assert "traffic job fell behind the emulated clock: p99 lag 12" in f["note"]
    assert "emulated = 2" in f["note"] and "sm fell" not in f["note"]
    assert f["processes"]["sm"]["p99_us"] < 0.06  # resolved below 1 us (the histogram goes down to ~1 ns)
    assert judge({"sm": stats["sm"]}, dilation=20_000.0, threshold_real_us=2000.0)["valid"] is True
    assert judge(stats, dilation=20_000.0)["valid"] is True  # no figure: 2 ms emulated, as at N = 1


def test_the_figure_bound_relaxes_the_real_time_rule_to_five_percent_of_the_smallest_figure() -> None:
    from ibemu.scenario.fidelity import threshold

    t = threshold(20_000, figure=("job fabric_s", 33.6))
    assert t.us == pytest.approx(1.68) and t.real_us == pytest.approx(33_600.0)
    assert t.basis.startswith("5% of job fabric_s 33.6 us")
    # an idle SM 3 ms late in real time (0.15 us emulated) is no error a 33.6 us figure can
    # show; a worker 3.25 us behind (10% of it) is
    quiet = {"sm": _stats([0.15] * 100)}
    assert judge(quiet, dilation=20_000.0, threshold_real_us=2000.0)["valid"] is False
    assert judge(quiet, dilation=20_000.0, figure=("job fabric_s", 33.6))["valid"] is True
    late = {"sm": _stats([0.15] * 100), "traffic job": _stats([3.25] * 100)}
    f = judge(late, dilation=20_000.0, figure=("job fabric_s", 33.6))
    assert f["valid"] is False and f["figure_us"] == 33.6 and f["threshold_us"] == 1.68
    # below the real-time rule the figure changes nothing; never above R emulated; dilation 1 as before
    assert threshold(20_000, figure=("tiny", 1.0)).us == pytest.approx(0.1)
    big = threshold(4, figure=("step", 1e6))
    assert big.us == 2000.0 and big.basis.startswith("2 ms emulated (the most it is")
    for fig in (None, ("step", 1.0), ("step", 1e9)):
        assert threshold(1, figure=fig).us == 2000.0


def test_the_overrides_and_bad_values() -> None:
    from ibemu.scenario.fidelity import threshold

    t = threshold(20_000, emulated_us=5.0, figure=("x", 1e6))  # emulated outright: no real or figure part
    assert t.us == 5.0 and t.real_us == 100_000.0 and t.basis.startswith("time.lag_threshold_us")
    assert threshold(4, real_us=8000.0).us == 2000.0
    assert threshold(1000, real_us=500.0, figure=("x", 100.0)).us == 5.0  # 5% of 100 us > 500 us / 1000
    f = judge({"sm": _stats([300.0] * 100)}, dilation=4.0, threshold_real_us=1000.0)
    assert f["valid"] is False and f["threshold_us"] == 250.0 and f["threshold_real_us"] == 1000.0
    bad = [dict(emulated_us=0.0), dict(emulated_us=-1.0), dict(real_us=float("nan")), dict(real_us=True),
           dict(real_us="2ms"), dict(emulated_us=5.0, real_us=5.0), dict(figure=("x", 0.0)),
           dict(figure=("x", float("inf")))]
    for kw in bad:
        with pytest.raises(ValueError):
            threshold(4, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dilation"):
        threshold(0.5)


def test_the_smallest_measured_figure_of_a_run() -> None:
    from ibemu.scenario.fidelity import figure_scale

    traffic = [
        {"name": "bulk", "kind": "write_bw", "extra": {"avg_mibps": 900.0}},
        {"name": "job", "kind": "training", "extra": {"step_s": 1.22e-4, "fabric_s": 3.36e-5, "nvlink_s": 1.9e-8,
                                                      "model_scaled_fabric_s": 7.9e-5}},
        {"name": "lat", "kind": "write_lat", "extra": {"t_typical": 45.0}},
        {"name": "broken", "kind": "send_lat", "extra": {"t_typical": 0.5, "error": "timed out"}},
        {"name": "empty", "kind": "write_lat", "extra": {"t_typical": 0.0}},
    ]
    name, us = figure_scale(traffic)  # type: ignore[misc]
    assert name == "job fabric_s" and us == pytest.approx(33.6)
    assert figure_scale(traffic[2:]) == ("lat t_typical", 45.0)
    assert figure_scale(traffic[:1]) is None and figure_scale([]) is None
