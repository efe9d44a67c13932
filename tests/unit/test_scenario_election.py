"""SM election keys in a scenario (sm.priority, sm.standby, polling) and the faults sm_down /
sm_up: validated with located errors, carried to the fabric request and the SMs' options."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.fabric import ibemusm, opensm
from ibemu.fabric.session import read_spec, request_from_spec, write_spec
from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.scenario.runner import fabric_request
from ibemu.scenario.schema import StandbySpec
from ibemu.sm.__main__ import parse_args

FT = "topology:\n  generator: fat-tree\n  k: 4\n"  # lines 1-3

BAD: list[tuple[str, str, str]] = [
    ("priority-16", FT + "sm:\n  priority: 16\n", "x.yaml:5 sm.priority: expected an integer from 0 to 15, got 16"),
    ("standby-same-host", FT + "sm:\n  host: h3\n  standby: {host: h3}\n",
     "x.yaml:6 sm.standby.host: h3 runs the master SM; a standby runs on another host (one SM per port)"),
    ("standby-unknown-host", FT + "sm:\n  standby: {host: h99}\n", "x.yaml:5 sm.standby.host:"),
    ("standby-without-host", FT + "sm:\n  standby: {priority: 2}\n",
     "x.yaml:5 sm.standby: give the standby's host (a CA other than the master's)"),
    ("standby-unknown-key", FT + "sm:\n  standby: {host: h1, prio: 2}\n", "x.yaml:5 sm.standby"),
    ("standby-impl", FT + "sm:\n  standby: {host: h1, impl: osm}\n",
     "x.yaml:5 sm.standby.impl: expected one of ibemu, opensm, got 'osm'"),
    ("standby-priority", FT + "sm:\n  standby: {host: h1, priority: -1}\n",
     "x.yaml:5 sm.standby.priority: expected an integer from 0 to 15, got -1"),
    ("poll-too-fast", FT + "sm:\n  poll_interval_ms: 1\n",
     "x.yaml:5 sm.poll_interval_ms: expected an integer from 10 to 600000, got 1"),
    ("retries-0", FT + "sm:\n  poll_retries: 0\n", "x.yaml:5 sm.poll_retries: expected an integer from 1 to 100, got 0"),
    ("sm-down-twice", FT + "duration_s: 5\nfaults:\n  - {at_s: 1, action: sm_down}\n  - {at_s: 2, action: sm_down}\n",
     "x.yaml:7 faults[1]: sm master is already down at 2 s (faults[0] at 1 s)"),
    ("sm-up-first", FT + "duration_s: 5\nfaults:\n  - {at_s: 1, action: sm_up}\n",
     "x.yaml:6 faults[0]: sm master is not down at 1 s; bring it down first"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_election_keys(text: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, "x.yaml", tmp_path)
    assert info.value.problems[0].startswith(expected), info.value.problems


GOOD = FT + """sm:
  host: h0
  priority: 5
  poll_interval_ms: 200
  poll_retries: 4
  standby: {host: h15, priority: 2, impl: opensm}
duration_s: 5
faults:
  - {at_s: 1, action: sm_down}
  - {at_s: 3, action: sm_up}
"""


def test_keys_reach_the_fabric_request_and_both_sms(tmp_path: Path) -> None:
    scen = loads_scenario(GOOD, "x.yaml", tmp_path)
    assert scen.sm.priority == 5 and scen.sm.standby == StandbySpec("h15", 2, "opensm")
    assert [f.action for f in scen.faults] == ["sm_down", "sm_up"]
    req = fabric_request(scen)
    write_spec(tmp_path, "r1", req)
    back = request_from_spec(read_spec(tmp_path))
    assert back.sm_election == {"priority": 5, "poll_interval_ms": 200, "poll_retries": 4,
                                "standby": {"host": "h15", "priority": 2, "impl": "opensm"}}
    args = parse_args(["--ns", "x", *ibemusm.election_args(5, 200, 4)])
    assert (args.priority, args.poll_interval, args.poll_retries) == (5, 0.2, 4)
    # OpenSM: its own option names; it gives up after polling_retry_number + 1 unanswered polls
    conf = opensm.election_config({"priority": 2, "poll_interval_ms": 200, "poll_retries": 4})
    assert conf.splitlines() == ["sm_priority 2", "sminfo_polling_timeout 200", "polling_retry_number 3"]
    assert opensm.write_config(tmp_path, None, None, {"priority": 2}) == str(tmp_path / "opensm.conf")


def test_a_standby_defaults_to_the_masters_impl(tmp_path: Path) -> None:
    scen = loads_scenario(FT + "sm:\n  impl: opensm\n  standby: {host: h2}\n", "x.yaml", tmp_path)
    assert scen.sm.standby == StandbySpec("h2", 0, "opensm")
    assert "standby" not in loads_scenario(FT, "x.yaml", tmp_path).sm.election()


def test_ibemu_up_carries_the_election(tmp_path: Path) -> None:
    import argparse

    from ibemu.cli.fabric_cmd import request_from_args
    from ibemu.errors import ConfigError

    path = tmp_path / "e.yaml"
    path.write_text(FT + "sm:\n  priority: 3\n  standby: {host: h5}\n")
    args = argparse.Namespace(topo=None, scenario=path, datapath=None, fabric=None, dilation=None,
                              sm=None, sm_host=None, sm_engine=None)
    req = request_from_args(args)
    assert req.sm_election["priority"] == 3 and req.sm_election["standby"]["host"] == "h5"
    args.sm_host = "h5"
    with pytest.raises(ConfigError, match=r"standby SM runs there"):
        request_from_args(args)


def test_takeover_phases_from_the_standby_log() -> None:
    from ibemu.report.result import FaultResult
    from ibemu.scenario.measure import fault_phases

    ms = 1_000_000
    t0 = 10_000 * ms
    standby = [
        {"kind": "sm_poll_failed", "t_ns": t0 - 50 * ms},  # before the fault: not this one's
        {"kind": "sm_poll_failed", "t_ns": t0 + 200 * ms},
        {"kind": "sm_poll_failed", "t_ns": t0 + 400 * ms},
        {"kind": "sm_master_lost", "t_ns": t0 + 600 * ms},
        {"kind": "sm_state", "t_ns": t0 + 600 * ms, "new": "discovering"},
        {"kind": "sm_state", "t_ns": t0 + 630 * ms, "new": "master"},
        {"kind": "sweep_end", "t_ns": t0 + 631 * ms, "reason": "cold", "ok": True},  # not the takeover's
        {"kind": "sweep_end", "t_ns": t0 + 660 * ms, "reason": "takeover", "ok": True},
    ]
    ph = fault_phases(t0, t0 + 60_000 * ms, [], standby)
    assert {k: ph[k] for k in ("sm_silent", "sm_noticed", "sm_master", "sm_swept")} == {
        "sm_silent": 200.0, "sm_noticed": 600.0, "sm_master": 630.0, "sm_swept": 660.0}
    # OpenSM: no polls in its log, its SUBNET UP as master ends the sweep
    osm = [{"kind": "sm_state", "t_ns": t0 + 900 * ms, "new": "master"}, {"kind": "subnet_up", "t_ns": t0 + 990 * ms}]
    ph = fault_phases(t0, t0 + 60_000 * ms, [], osm)
    assert (ph["sm_silent"], ph["sm_master"], ph["sm_swept"]) == (None, 900.0, 990.0)
    assert "sm_master" not in fault_phases(t0, t0 + 60_000 * ms, [], [])  # no takeover: no such phases
    # the result keeps them (optional keys of phases_ms) and reads them back
    f = FaultResult.from_dict({"at_s": 1.0, "action": "sm_down", "target": "sm", "t_fault_s": 1.0,
                               "phases_ms": ph, "flows": []})
    assert f.to_dict()["phases_ms"] == ph


def test_ibemu_up_carries_the_scenarios_keys_and_partitions(tmp_path: Path) -> None:
    """``ibemu up SCENARIO`` asks the SM for what ``ibemu run`` would: its M_Key and partitions
    (and the switches' local failover), not only the election."""
    import argparse

    from ibemu.cli.fabric_cmd import request_from_args
    from ibemu.scenario import load_scenario
    from ibemu.scenario.runner import fabric_request

    path = tmp_path / "k.yaml"
    path.write_text(FT + "sm:\n  m_key: 0x1234\n  m_key_protect: 2\n"
                    "partitions:\n  - {name: red, pkey: 0x0010, members: [h0, h1]}\n"
                    "fabric:\n  local_failover: false\n")
    args = argparse.Namespace(topo=None, scenario=path, datapath=None, fabric=None, dilation=None,
                              sm=None, sm_host=None, sm_engine=None)
    req = request_from_args(args)
    want = fabric_request(load_scenario(path))
    assert req.sm_keys == want.sm_keys and req.sm_keys["m_key"] == 0x1234
    assert req.sm_partitions == want.sm_partitions and "red" in req.sm_partitions
    assert req.sm_local_failover is False
    args.sm = "none"  # no SM: nothing for it to program
    req = request_from_args(args)
    assert not req.sm_keys and not req.sm_partitions
