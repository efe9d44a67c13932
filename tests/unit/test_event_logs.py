"""Event logs: lazy kinds (one per SMP) are written late but in order, the rest at once."""

from __future__ import annotations

import json
from pathlib import Path

from ibemu.fabric.agenthost import LAZY_KINDS, EventLog
from ibemu.sm.events import EventLog as SmEventLog


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_fabric_log_keeps_lazy_records_until_the_next_other_record_or_a_flush(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    assert "lft_set" in LAZY_KINDS and "carrier" not in LAZY_KINDS
    log.write("sw1", {"kind": "lft_set", "t_ns": 1, "block": 0})
    log.write("sw2", {"kind": "lft_programmed", "t_ns": 2})
    assert path.read_text() == ""  # not even encoded yet
    log.write("sw1", {"kind": "carrier", "t_ns": 3, "up": False})
    assert [(r["node"], r["kind"]) for r in lines(path)] == [
        ("sw1", "lft_set"), ("sw2", "lft_programmed"), ("sw1", "carrier")]  # in order
    log.write("sw3", {"kind": "lft_set", "t_ns": 4, "block": 1})
    log.flush()
    assert lines(path)[-1] == {"node": "sw3", "kind": "lft_set", "t_ns": 4, "block": 1}
    log.write("sw4", {"kind": "lft_set", "t_ns": 5, "block": 2})
    log.close()  # nothing lost on the way out
    assert lines(path)[-1]["node"] == "sw4" and log.counts == {"lft_set": 3, "lft_programmed": 1, "carrier": 1}


def test_sm_log_flushes_with_the_record_that_closes_a_pass(tmp_path: Path) -> None:
    path = tmp_path / "sm.jsonl"
    log = SmEventLog(path)
    log.emit("lft_block_acked", switch="0x1", block=0)
    log.emit("lft_block_acked", switch="0x2", block=0)
    assert path.read_text() == ""
    log.emit("lft_programmed", blocks=2)
    assert [r["kind"] for r in lines(path)] == ["lft_block_acked", "lft_block_acked", "lft_programmed"]
    log.close()
