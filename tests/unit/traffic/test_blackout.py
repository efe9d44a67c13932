"""Blackout analysis over delivery times."""

from __future__ import annotations

from ibemu.traffic.blackout import analyse, lost_between, timeline

MS = 1_000_000


def steady(start: int, end: int, step: int) -> list[int]:
    return list(range(start, end, step))


def test_gap_holding_the_fault_is_the_blackout() -> None:
    t = steady(0, 100 * MS, MS // 10) + steady(137 * MS, 300 * MS, MS // 10)
    b = analyse(t, 100 * MS)
    assert b.blackout_ns == 137 * MS - (100 * MS - MS // 10)
    assert b.resume_ns == 37 * MS
    assert b.gap_start_ns == -(MS // 10)


def test_the_first_disruption_after_the_fault_counts_not_a_later_hiccup() -> None:
    t = steady(0, 100 * MS, MS) + steady(130 * MS, 150 * MS, MS) + steady(200 * MS, 300 * MS, MS)
    b = analyse(t, 100 * MS)
    assert b.blackout_ns == 31 * MS and b.resume_ns == 30 * MS


def test_traffic_that_went_on_for_a_while_then_stopped() -> None:
    """Packets in flight still arrive after the fault; the disruption comes a bit later."""
    t = steady(0, 104 * MS, MS // 10) + steady(150 * MS, 300 * MS, MS // 10)
    b = analyse(t, 100 * MS)
    assert b.resume_ns == 50 * MS and b.gap_start_ns == 4 * MS - MS // 10


def test_an_untouched_flow_shows_one_interarrival_time() -> None:
    b = analyse(steady(0, 300 * MS, MS), 100 * MS + MS // 2)
    assert b.blackout_ns == MS and b.resume_ns == MS // 2


def test_a_flow_that_never_resumed() -> None:
    b = analyse(steady(0, 100 * MS, MS), 100 * MS, until_ns=500 * MS)
    assert b.resume_ns is None and b.blackout_ns == 500 * MS - 99 * MS
    assert analyse([], 5).blackout_ns is None


def test_a_flow_that_started_after_the_fault_has_no_blackout() -> None:
    b = analyse(steady(50 * MS, 60 * MS, MS), 10 * MS)  # its start-up is not the fault's doing
    assert b.blackout_ns is None and b.resume_ns == 40 * MS and b.gap_start_ns is None


def test_lost_counts_only_the_window() -> None:
    sent = steady(0, 100, 1)
    got = set(range(100)) - {10, 11, 50}
    assert lost_between(sent, got, 0, 100) == 3
    assert lost_between(sent, got, 40, 100) == 1


def test_timeline_bins_bytes_into_gbps() -> None:
    t_s, gbps = timeline([0, 50 * MS, 150 * MS], [1_250_000, 1_250_000, 2_500_000], 0, 200 * MS, 0.1)
    assert t_s == [0.0, 0.1] and gbps == [0.2, 0.2]

