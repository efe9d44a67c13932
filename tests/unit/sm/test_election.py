"""The SM election state machine (ibemu.sm.election), without IO."""

from __future__ import annotations

import pytest

from ibemu.sm.election import (
    Election,
    MasterLost,
    Poll,
    SendSet,
    SmInfo,
    SmInfoMod,
    SmState,
    StateChange,
    Takeover,
    outranks,
)

MS = 1_000_000
A, B, C = 0x10, 0x20, 0x30


def test_sminfo_round_trip_and_layout():
    info = SmInfo(0x0002C90000001001, 7, SmState.STANDBY, 0x01020304, 0)
    raw = info.pack()
    assert len(raw) == 21
    assert raw[16:20] == b"\x01\x02\x03\x04"
    assert raw[20] == 0x72  # priority in the high nibble, SMState in the low one
    assert SmInfo.unpack(raw + bytes(43)) == info
    with pytest.raises(ValueError):
        SmInfo.unpack(raw[:20])
    with pytest.raises(ValueError):
        SmInfo.unpack(raw[:20] + b"\x07")  # SMState 7


def test_outranks_priority_then_lower_guid():
    assert outranks((5, B), (4, A))
    assert not outranks((4, A), (5, B))
    assert outranks((4, A), (4, B))
    assert not outranks((4, B), (4, A))


def test_alone_or_highest_becomes_master():
    e = Election(A, priority=1)
    acts = e.discovered([])
    assert e.state is SmState.MASTER
    assert acts == [StateChange(SmState.DISCOVERING, SmState.MASTER, "no other SM")]
    e = Election(B, priority=5)
    e.discovered([SmInfo(A, 4, SmState.DISCOVERING), None])
    assert e.state is SmState.MASTER


def test_a_master_found_wins_whatever_the_priorities():
    e = Election(A, priority=15)
    e.discovered([SmInfo(B, 0, SmState.MASTER)], now_ns=0)
    assert (e.state, e.master) == (SmState.STANDBY, B)


def test_higher_discovering_peer_makes_us_standby():
    e = Election(B, priority=3)
    e.discovered([SmInfo(A, 3, SmState.DISCOVERING)])  # same priority, lower GUID
    assert (e.state, e.master) == (SmState.STANDBY, A)


def test_standby_polls_on_its_interval():
    e = Election(B, priority=1, poll_interval_ns=100 * MS, poll_retries=3)
    e.discovered([SmInfo(A, 5, SmState.MASTER, act_count=1)], now_ns=0)
    assert e.poll_due(50 * MS) == []
    assert e.poll_due(100 * MS) == [Poll(A)]
    assert e.poll_due(150 * MS) == []
    assert e.poll_due(200 * MS) == [Poll(A)]


def test_takeover_after_retries_failed_polls():
    e = Election(B, priority=1, poll_interval_ns=100 * MS, poll_retries=3)
    e.discovered([SmInfo(A, 5, SmState.MASTER, act_count=1)], now_ns=0)
    assert e.poll_result(SmInfo(A, 5, SmState.MASTER, act_count=10), 100 * MS) == []
    assert e.poll_result(None, 200 * MS) == []
    assert e.poll_result(None, 300 * MS) == []
    acts = e.poll_result(None, 400 * MS)
    assert acts[0] == MasterLost(A, 200 * MS, 3)
    assert isinstance(acts[1], StateChange) and acts[1].new is SmState.DISCOVERING
    assert acts[2] == Takeover("master lost")
    assert e.state is SmState.DISCOVERING
    # the takeover sweep finds nobody: master
    e.discovered([None])
    assert e.state is SmState.MASTER


def test_an_answer_resets_the_count():
    e = Election(B, priority=1, poll_retries=2)
    e.discovered([SmInfo(A, 5, SmState.MASTER)])
    e.poll_result(None, 1)
    assert e.poll_result(SmInfo(A, 5, SmState.MASTER, act_count=3), 2) == []
    assert e.poll_result(None, 3) == []
    assert e.state is SmState.STANDBY


def test_actcount_must_move():
    e = Election(B, priority=1, poll_retries=2)
    e.discovered([SmInfo(A, 5, SmState.MASTER)])
    assert e.poll_result(SmInfo(A, 5, SmState.MASTER, act_count=7), 1) == []
    assert e.poll_result(SmInfo(A, 5, SmState.MASTER, act_count=7), 2) == []  # stalled: 1
    acts = e.poll_result(SmInfo(A, 5, SmState.MASTER, act_count=7), 3)  # stalled: 2
    assert any(isinstance(a, Takeover) for a in acts)


def test_answer_from_a_master_that_stepped_down_counts_as_failed():
    e = Election(B, priority=5, poll_retries=1)
    e.discovered([SmInfo(A, 1, SmState.MASTER)])
    acts = e.poll_result(SmInfo(A, 1, SmState.NOT_ACTIVE, act_count=9), 1)
    assert any(isinstance(a, MasterLost) for a in acts)


def test_master_hands_over_to_a_higher_standby_and_steps_down_on_ack():
    e = Election(B, priority=1)
    e.discovered([])
    acts = e.discovered([SmInfo(A, 9, SmState.STANDBY)])
    assert acts == [SendSet(A, SmInfoMod.HANDOVER)]
    assert e.discovered([SmInfo(A, 9, SmState.STANDBY)]) == []  # not twice
    assert e.on_set(SmInfoMod.ACKNOWLEDGE, C) == []  # not from whom we handed over to
    e.on_set(SmInfoMod.ACKNOWLEDGE, A, now_ns=5)
    assert (e.state, e.master) == (SmState.STANDBY, A)


def test_standby_takes_a_handover():
    e = Election(A, priority=9)
    e.discovered([SmInfo(B, 1, SmState.MASTER)])
    acts = e.on_set(SmInfoMod.HANDOVER, B)
    assert e.state is SmState.MASTER
    assert SendSet(B, SmInfoMod.ACKNOWLEDGE) in acts and Takeover("handover") in acts
    assert e.on_get(42) == SmInfo(A, 9, SmState.MASTER, 42)


def test_disable_and_discover():
    e = Election(A)
    e.discovered([])
    e.on_set(SmInfoMod.DISABLE, B)
    assert e.state is SmState.NOT_ACTIVE
    assert e.discovered([]) == []  # a disabled SM stays out
    acts = e.on_set(SmInfoMod.DISCOVER, B)
    assert e.state is SmState.DISCOVERING and Takeover("discover") in acts


def test_lower_master_steps_down_before_a_higher_one():
    e = Election(B, priority=1)
    e.discovered([])
    e.discovered([SmInfo(A, 4, SmState.MASTER)])
    assert (e.state, e.master) == (SmState.STANDBY, A)


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        Election(A, priority=16)
    with pytest.raises(ValueError):
        Election(A, poll_retries=0)
