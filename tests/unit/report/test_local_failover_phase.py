"""A fault's ``local_failover`` phase: measured from the agent host's event, optional in the
result, a column of the faults table only when a switch failed over by itself."""

from __future__ import annotations

from ibemu.events import Kind
from ibemu.report import validate
from ibemu.report.summary import summary
from ibemu.scenario.measure import fault_phases
from tests.unit.report.sample import result

T = 10_000_000_000


def test_the_phase_comes_from_the_local_failover_event() -> None:
    fabric = [{"kind": Kind.CARRIER, "t_ns": T + 500_000}, {"kind": Kind.LOCAL_FAILOVER, "t_ns": T + 560_000}]
    sm = [{"kind": Kind.TRAP, "t_ns": T + 1_500_000}]
    ph = fault_phases(T, T + 10**9, fabric, sm)
    assert ph["detect"] == 0.5 and ph["local_failover"] == 0.56 and ph["trap"] == 1.5
    assert "local_failover" not in fault_phases(T, T + 10**9, fabric[:1], sm)  # none: not said


def test_the_result_takes_it_and_the_summary_shows_it_only_when_there() -> None:
    r = result()
    assert "local failover (ms)" not in summary(r)
    r["faults"][0]["phases_ms"]["local_failover"] = 0.56
    assert validate(r) == []
    text = summary(r)
    header = next(ln for ln in text.splitlines() if "programmed (ms)" in ln)
    assert "local failover (ms)" in header
    r["faults"][0]["phases_ms"]["local_failover"] = "soon"
    assert validate(r) == ["faults[0].phases_ms.local_failover: expected number or null, got str 'soon'"]
