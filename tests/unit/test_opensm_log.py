"""OpenSM's flushed log turned into SM events on the monotonic clock."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ibemu.fabric import opensm_log

LOG = """\
Dec 03 07:55:28 796201 [D088A6C0] 0x02 -> SUBNET UP
Dec 03 07:55:34 826097 [D288E6C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state change) Producer:2 (Switch) from LID:13 TID:0x0000004000000001
Dec 03 07:55:34 826155 [D288E6C0] 0x02 -> SM class trap 128: Directed Path Dump of 2 hop path: Path = 0,1,3
Dec 03 07:55:34 908533 [D088A6C0] 0x01 -> fabric_validate_topology: ERR AB0A: Different number of downward port groups on switches:
       GUID 0x0a1be00100000000, LID 2, Index 0.0.0 - 4 port groups
Dec 03 07:55:34 908546 [D088A6C0] 0x01 -> ucast_mgr_route: ftree: cannot build lid matrices
Dec 03 07:55:34 908647 [D088A6C0] 0x02 -> osm_ucast_mgr_process: minhop tables configured on all switches
Dec 03 07:55:34 956068 [D088A6C0] 0x02 -> SUBNET UP
Dec 03 07:55:41 818339 [D288E6C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state change) Producer:2 (Switch) from LID:13 TID:0x0000004000000002
Dec 03 07:55:41 820504 [D308F6C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state change) Producer:2 (Switch) from LID:4 TID:0x0000001000000002
Dec 03 07:55:41 999999 [D088A6C0] 0x02 -> osm_ucast_mgr_process: ftree tables configured on all switches
"""


def _at(stamp: tuple[int, ...]) -> float:
    return time.mktime((*stamp, 0, 0, -1))


def test_traps_sweeps_and_reroutes_on_the_monotonic_clock() -> None:
    now = _at((2026, 12, 3, 8, 0, 0))
    offset = 5_000_000_000  # wall - monotonic
    events = opensm_log.parse(LOG.splitlines(), offset_ns=offset, now=now)
    kinds = [e["kind"] for e in events]
    assert kinds.count("trap") == 3 and kinds.count("subnet_up") == 2
    assert kinds.count("routing_fallback") == 1 and kinds.count("reroute") == 2
    trap = next(e for e in events if e["kind"] == "trap")
    wall = int(_at((2026, 12, 3, 7, 55, 34))) * 10**9 + 826_097_000
    assert trap["t_ns"] == wall - offset and trap["issuer_lid"] == 13 and trap["trap_number"] == 128
    first, second = (e for e in events if e["kind"] == "reroute")
    assert first["t_routed"] - first["t_trap"] == 82_550_000  # 34.908647 - 34.826097
    assert first["t_subnet_up"] - first["t_trap"] == 129_971_000 and first["engine"] == "minhop"
    # The second sweep had two traps and the log ended before its SUBNET UP.
    assert second["t_trap"] == wall - offset + 6_992_242_000 and second["t_subnet_up"] is None
    assert second["engine"] == "ftree" and second["t_programmed"] is None


def test_a_stamp_from_last_december_seen_in_january_keeps_its_year() -> None:
    now = _at((2027, 1, 1, 0, 0, 5))
    (up,) = opensm_log.parse(["Dec 31 23:59:59 500000 [AB] 0x02 -> SUBNET UP"], offset_ns=0, now=now)
    assert up["t_ns"] == int(_at((2026, 12, 31, 23, 59, 59))) * 10**9 + 500_000_000


def test_write_events_next_to_the_log(tmp_path: Path) -> None:
    assert opensm_log.write_events(tmp_path) is None
    (tmp_path / "opensm.log").write_text(LOG + "garbage \x00 line\nDec 99 xx\n")
    out = opensm_log.write_events(tmp_path)
    assert out is not None
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 10 and records == sorted(records, key=lambda r: r["t_ns"])


def test_a_log_on_the_dilated_clock_moves_by_the_recorded_offset_alone(tmp_path: Path) -> None:
    """OpenSM under libfaketime stamps with the emulated clock plus the realtime offset of its
    start (``clock.json``): at dilation 4 the stamps are not divided again."""
    from ibemu import clock

    now = _at((2026, 12, 3, 8, 0, 0))
    offset = 5_000_000_000
    wall = int(_at((2026, 12, 3, 7, 55, 34))) * 10**9 + 826_097_000
    clock.configure(4, epoch_ns=10**12)
    try:
        events = opensm_log.parse(LOG.splitlines(), offset_ns=offset, now=now, faked=True)
        trap = next(e for e in events if e["kind"] == "trap")
        assert trap["t_ns"] == wall - offset
        real = opensm_log.parse(LOG.splitlines(), offset_ns=offset, now=now)  # a real-clock log: divided by 4
        assert next(e for e in real if e["kind"] == "trap")["t_ns"] == clock.to_emulated_ns(wall - offset)
    finally:
        clock.configure(1)
    (tmp_path / "opensm.log").write_text(LOG)
    assert opensm_log.log_clock(tmp_path) is None
    (tmp_path / "clock.json").write_text(json.dumps({"clock": "libfaketime", "realtime_offset_ns": 123}))
    assert opensm_log.log_clock(tmp_path) == {"clock": "libfaketime", "realtime_offset_ns": 123}
    (up, *_) = (e for e in opensm_log.parse_workdir(tmp_path) if e["kind"] == "subnet_up")
    assert up["t_ns"] == int(_at((2026, 12, 3, 7, 55, 28))) * 10**9 + 796_201_000 - 123


def test_state_changes_of_a_standby_that_takes_over() -> None:
    lines = ["Dec 04 18:04:32 871547 [F7] 0x80 -> Entering DISCOVERING state",
             "Dec 04 18:04:32 970905 [F4] 0x80 -> Entering STANDBY state",
             "Dec 04 18:04:38 231662 [F4] 0x80 -> Entering MASTER state",
             "Dec 04 18:04:38 347960 [F4] 0x02 -> SUBNET UP"]
    now = time.mktime((2026, 12, 4, 18, 5, 0, 0, 0, -1))
    events = opensm_log.parse(lines, offset_ns=0, now=now)
    assert [(e["kind"], e.get("new")) for e in events] == [
        ("sm_state", "discovering"), ("sm_state", "standby"), ("sm_state", "master"), ("subnet_up", None)]
    assert events[3]["t_ns"] - events[2]["t_ns"] == 116_298_000


RESTORE_AFTER_A_REPEAT = """\
Dec 05 03:29:50 743808 [70EC66C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state change) Producer:2 (Switch) from LID:119 TID:0x0000019000000001
Dec 05 03:29:50 913290 [6EEC26C0] 0x02 -> SUBNET UP
Dec 05 03:29:50 913367 [70EC66C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state change) Producer:2 (Switch) from LID:3 TID:0x0000010000000001
Dec 05 03:29:50 927111 [716C76C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state change) Producer:2 (Switch) from LID:171 TID:0x000001d000000002
Dec 05 03:29:50 927335 [70EC66C0] 0x01 -> log_trap_info: Received Generic Notice type:1 num:128 (Link state change) Producer:2 (Switch) from LID:119 TID:0x0000019000000002
Dec 05 03:29:51 050000 [6EEC26C0] 0x02 -> osm_ucast_mgr_process: minhop tables configured on all switches
Dec 05 03:29:51 076476 [6EEC26C0] 0x02 -> SUBNET UP
"""


def test_the_sweep_answering_a_change_that_an_earlier_repeated_trap_began() -> None:
    """A repeated trap of an earlier change (LID 3, 14 us after a SUBNET UP: ibemu's switches
    repeat a trap that found no route) starts the sweep that the restore's traps (LIDs 171 and
    119, after the restore at 50.920) join: OpenSM sweeps once. The sweep answering the restore
    is that one, timed from the restore's first trap (bench_opensm_ibsim.py stopped on such a
    log: it looked for a sweep whose first trap came after the restore)."""
    now = _at((2026, 12, 5, 3, 30, 0))
    offset = 7_000_000_000
    events = opensm_log.parse(RESTORE_AFTER_A_REPEAT.splitlines(), offset_ns=offset, now=now)
    second = int(_at((2026, 12, 5, 3, 29, 50))) * 10**9 - offset
    t_restore = second + 920_000_000
    assert not [e for e in events if e["kind"] == "reroute" and e["t_trap"] >= t_restore]
    found = opensm_log.reroute_answering(events, t_restore)
    assert found is not None and found["merged"]
    assert found["t_trap"] == second + 927_111_000
    assert found["t_subnet_up"] == second + 1_076_476_000
    assert found["t_routed"] == second + 1_050_000_000 and found["engine"] == "minhop"
    # the cut before it: its own sweep, not merged
    cut = opensm_log.reroute_answering(events, second + 700_000_000)
    assert cut is not None and not cut["merged"] and cut["t_trap"] == second + 743_808_000
    assert cut["t_subnet_up"] == second + 913_290_000
    # nothing yet: no trap after, or its SUBNET UP not in the log
    assert opensm_log.reroute_answering(events, second + 2_000_000_000) is None
    head = RESTORE_AFTER_A_REPEAT.splitlines()[:5]
    assert opensm_log.reroute_answering(opensm_log.parse(head, offset_ns=offset, now=now), t_restore) is None
