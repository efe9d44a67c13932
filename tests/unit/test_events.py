"""Event logs: lazy kinds (one per SMP) are written late but in order (the fabric's: unless a
long backlog waits), the rest at once; every
kind written or read anywhere in ibemu is in the one vocabulary, with the fields it lists."""

from __future__ import annotations

import ast
import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ibemu import events
from ibemu.events import LAZY, LINK_CHANGE, VOCABULARY, EventLog, FabricLog, Kind, Log, read_events

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ibemu"


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


# ---------------------------------------------------------------------------- the writer


def test_fabric_log_keeps_lazy_records_until_the_next_other_record_or_a_flush(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = FabricLog(path)
    assert "lft_set" in LAZY[Log.FABRIC] and "carrier" not in LAZY[Log.FABRIC]
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


def test_a_record_emitted_lazy_waits_for_the_next_other_record_in_order(tmp_path: Path) -> None:
    """``emit(..., lazy=True)``: a kind written at once otherwise (the SM's ``trap``,
    ``sweep_start``, ``link_down``, ``routes_computed`` of a reroute) is kept like a ``LAZY``
    kind and goes out, in order, with its own stamp, with the next record that is not lazy."""
    path = tmp_path / "sm.jsonl"
    log = EventLog(path)
    log.emit(Kind.TRAP, t_ns=10, lazy=True, issuer_lid=4)
    log.emit(Kind.SWEEP_START, t_ns=11, lazy=True, sweep=2, reason="trap")
    log.emit(Kind.LFT_BLOCK_ACKED, t_ns=12, switch="0x1", block=0)  # lazy by kind
    assert path.read_text() == ""
    assert [r["kind"] for r in log.records] == ["trap", "sweep_start", "lft_block_acked"]  # kept at once
    log.emit(Kind.LFT_PROGRAMMED, t_ns=13, blocks=1)
    assert [(r["kind"], r["t_ns"]) for r in lines(path)] == [
        ("trap", 10), ("sweep_start", 11), ("lft_block_acked", 12), ("lft_programmed", 13)]
    log.emit(Kind.TRAP, t_ns=14, issuer_lid=5)  # not lazy: at once
    assert lines(path)[-1]["t_ns"] == 14
    log.emit(Kind.LINK_DOWN, t_ns=15, lazy=True, guid="0x2", port=1, peer=None)
    log.close()  # nothing lost on the way out
    assert lines(path)[-1]["kind"] == "link_down"


def test_fabric_log_writes_a_record_at_once_past_a_long_lazy_backlog(tmp_path: Path) -> None:
    """A backlog of more than ``INLINE_MAX`` lazy records (a bring-up's) is not written ahead
    of the next other record (a fault's carrier change): that one goes out at once, the
    backlog with the next flushes, nothing lost; a short backlog still goes first, in order."""
    path = tmp_path / "events.jsonl"
    log = FabricLog(path)
    n = FabricLog.INLINE_MAX + 1
    for i in range(n):
        log.write("sw1", {"kind": "lft_set", "t_ns": i, "block": i})
    log.write("sw2", {"kind": "carrier", "t_ns": n, "port": 1, "up": False})
    assert [r["kind"] for r in lines(path)] == ["carrier"]
    log.flush(at_most=n - 1)
    log.flush()
    got = lines(path)
    assert [r["t_ns"] for r in got[1:]] == list(range(n))
    log.write("sw1", {"kind": "lft_set", "t_ns": n + 1, "block": 0})
    log.write("sw2", {"kind": "carrier", "t_ns": n + 2, "port": 1, "up": True})
    log.close()
    assert [r["t_ns"] for r in lines(path)][-2:] == [n + 1, n + 2]
    assert EventLog(tmp_path / "sm.jsonl").inline_max is None  # the SM's log: always in order


def test_sm_log_flushes_with_the_record_that_closes_a_pass(tmp_path: Path) -> None:
    path = tmp_path / "sm.jsonl"
    log = EventLog(path)
    log.emit("lft_block_acked", switch="0x1", block=0)
    log.emit("lft_block_acked", switch="0x2", block=0)
    assert path.read_text() == ""
    log.emit("lft_programmed", blocks=2)
    assert [r["kind"] for r in lines(path)] == ["lft_block_acked", "lft_block_acked", "lft_programmed"]
    log.close()


def test_a_busy_writer_keeps_lazy_records_until_the_oldest_has_waited(tmp_path: Path) -> None:
    """``flush(waited_s=...)`` (the agent host's ticker while the agents are busy) writes
    nothing until the oldest lazy record has waited that long; then all of them, in order."""
    path = tmp_path / "events.jsonl"
    log = FabricLog(path)
    log.write("sw1", {"kind": "port_state", "t_ns": 1, "port": 1})
    log.flush(waited_s=60)
    assert path.read_text() == ""
    log.write("sw2", {"kind": "lft_set", "t_ns": 2, "block": 0})
    log.flush(waited_s=1e-9)
    assert [r["node"] for r in lines(path)] == ["sw1", "sw2"]
    log.write("sw3", {"kind": "lft_set", "t_ns": 3, "block": 1})  # a new oldest: waits afresh
    log.flush(waited_s=60)
    assert len(lines(path)) == 2
    log.write("sw4", {"kind": "lft_set", "t_ns": 4, "block": 2})
    log.write("sw5", {"kind": "lft_set", "t_ns": 5, "block": 3})
    log.flush(waited_s=1e-9, at_most=2)  # the two oldest
    assert [r["node"] for r in lines(path)] == ["sw1", "sw2", "sw3", "sw4"]
    log.flush(waited_s=1e-9, at_most=2)  # the oldest has waited all along: the next piece
    assert [r["node"] for r in lines(path)][-1] == "sw5"
    log.write("sw6", {"kind": "lft_set", "t_ns": 6, "block": 4})
    log.close()
    assert [r["node"] for r in lines(path)] == ["sw1", "sw2", "sw3", "sw4", "sw5", "sw6"]


def test_encode_writes_what_json_dumps_wrote() -> None:
    """The one encoder made once gives ``json.dumps(record, default=...)``'s bytes."""
    for rec in ({"kind": Kind.LFT_SET, "t_ns": 1, "node_guid": "0x1", "block": 3, "changed": 64},
                {"kind": "suspect", "why": {"b", "a"}, "path": (1, 2), "x": Path("/p"), "f": 1.5,
                 "n": None, "u": "\u00e9\n\"", "nested": {"l": [1, {"s": frozenset({2, 1})}]}}):
        assert events.encode(rec) == json.dumps(rec, default=events._jsonable) + "\n"


def test_records_on_disk_are_the_plain_json_they_always_were(tmp_path: Path) -> None:
    sm = EventLog(tmp_path / "sm.jsonl", clock=lambda: 7)
    rec = sm.emit(Kind.SUSPECT, guid="0x1", desc="s1", why={"b", "a"})
    sm.close()
    assert (tmp_path / "sm.jsonl").read_text() == (
        '{"kind": "suspect", "t_ns": 7, "guid": "0x1", "desc": "s1", "why": ["a", "b"]}\n')
    assert rec["t_ns"] == 7 and sm.of("suspect") == [rec] and sm.counts["suspect"] == 1
    fabric = FabricLog(tmp_path / "run" / "events.jsonl")  # its directory is made
    fabric.write("fault-injector", {"kind": Kind.FAULT, "t_ns": 9, "action": "link_down", "target": "s1:1-s2:1"})
    fabric.close()
    assert (tmp_path / "run" / "events.jsonl").read_text() == (
        '{"node": "fault-injector", "kind": "fault", "t_ns": 9, "action": "link_down", "target": "s1:1-s2:1"}\n')
    assert not fabric.records  # the fabric's log keeps none


def test_append_write_all_and_read_events(tmp_path: Path) -> None:
    path = tmp_path / "faults.jsonl"
    record = {"kind": Kind.FAULT, "t_ns": 1, "action": "switch_down", "target": "r1", "source": "fault-injector"}
    events.append(path, record)
    events.append(path, record)
    assert path.read_text() == (json.dumps({**record, "kind": "fault"}) + "\n") * 2
    events.write_all(path, [{"kind": Kind.SUBNET_UP, "t_ns": 2}])
    assert path.read_text() == '{"kind": "subnet_up", "t_ns": 2}\n'
    with open(path, "a") as f:
        f.write('{"kind": "trap", "t_')  # torn by a writer still at work
    assert read_events(path) == [{"kind": "subnet_up", "t_ns": 2}]
    assert read_events(tmp_path / "none.jsonl") == [] and read_events(None) == []


# ---------------------------------------------------------------------------- the vocabulary


def test_every_kind_is_described_once_for_the_logs_that_carry_it() -> None:
    assert list(VOCABULARY) == list(Kind)
    for kind, info in VOCABULARY.items():
        assert info.meaning and info.fields, kind
        assert all(isinstance(log, Log) for log in info.fields)
        assert all("kind" not in f and "t_ns" not in f and len(set(f)) == len(f) for f in info.fields.values())
    for log, lazy in LAZY.items():
        assert all(log in VOCABULARY[Kind(k)].fields for k in lazy), log
    assert set(LINK_CHANGE.values()) == {Kind.LINK_DOWN, Kind.LINK_UP, Kind.LINK_REINIT}


MARKERS = ("kind", "emit(", "_event(", ".of(", "counts[")
"""What a module that writes or reads records has in its text (the others are not parsed)."""


@functools.cache
def _tree(path: Path) -> ast.Module | None:
    text = path.read_text()
    return ast.parse(text, str(path)) if any(m in text for m in MARKERS) else None


def _modules(*roots: Path) -> Iterator[tuple[Path, ast.Module]]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            tree = _tree(path)
            if tree is not None and path != PACKAGE / "events.py":
                yield path, tree


def _kind_of(node: ast.expr) -> str | None:
    """The kind an expression names: a literal string or ``Kind.X`` (None: neither)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and (
            (isinstance(node.value, ast.Name) and node.value.id == "Kind")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "Kind")):
        assert node.attr in Kind.__members__, f"no Kind.{node.attr}"
        return Kind[node.attr].value
    return None


def _fields(kind: str) -> set[str]:
    return {f for fields in VOCABULARY[Kind(kind)].fields.values() for f in fields}


def _written(roots: tuple[Path, ...]) -> Iterator[tuple[str, str, set[str]]]:
    """(where, kind, fields) of every record written: ``emit(kind, ...)``, an agent's
    ``_event(kind, ...)`` and record literals ``{"kind": ..., "t_ns": ...}``."""
    for path, tree in _modules(*roots):
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name not in ("emit", "_event") or not node.args:
                    continue
                arg = node.args[0]
                if isinstance(arg, ast.Subscript) and getattr(arg.value, "id", "") == "LINK_CHANGE":
                    kinds = [k.value for k in LINK_CHANGE.values()]
                else:
                    kind = _kind_of(arg)
                    assert kind is not None, f"{where}: a kind that is not named (a literal or Kind.X)"
                    kinds = [kind]
                for kind in kinds:
                    yield where, kind, {k.arg for k in node.keywords if k.arg and k.arg not in ("t_ns", "lazy")}
            elif isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
                if "kind" in keys and "t_ns" in keys:
                    kind = _kind_of(node.values[keys.index("kind")])
                    if kind is not None:
                        yield where, kind, set(keys) - {"kind", "t_ns", "node"}


def test_every_kind_written_in_ibemu_is_in_the_vocabulary_with_its_fields() -> None:
    written: set[str] = set()
    for where, kind, fields in _written((PACKAGE,)):
        assert kind in Kind.__members__.values(), f"{where}: {kind!r} is not in ibemu.events.Kind"
        assert fields <= _fields(kind), f"{where}: {kind} fields {sorted(fields - _fields(kind))} not in VOCABULARY"
        written.add(kind)
    assert written == {k.value for k in Kind}, f"never written: {sorted({k.value for k in Kind} - written)}"


def _read(path: Path, tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(where, kind) of every kind a module looks for in records: ``r["kind"] == K``,
    ``r.get("kind") == K`` (or ``!=``), ``log.of(K)``, ``log.counts[K]``, ``wait_kind(path, K)``,
    ``events_of(K)``."""
    def is_kind_key(e: ast.expr) -> bool:
        if isinstance(e, ast.Subscript):
            return isinstance(e.slice, ast.Constant) and e.slice.value == "kind"
        return (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "get"
                and bool(e.args) and isinstance(e.args[0], ast.Constant) and e.args[0].value == "kind")

    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        found: list[ast.expr] = []
        if isinstance(node, ast.Compare) and len(node.comparators) == 1:
            left, right = node.left, node.comparators[0]
            if is_kind_key(left):
                found.append(right)
            elif is_kind_key(right):
                found.append(left)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            if name in ("of", "events_of") and node.args:
                found.append(node.args[0])
            elif name == "wait_kind" and len(node.args) > 1:
                found.append(node.args[1])
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "counts":
            found.append(node.slice)
        for e in found:
            kind = _kind_of(e)
            if kind is not None:
                yield where, kind


NOT_EVENTS = {"stream", "allreduce", "training", "roce", "ib"}
"""``["kind"]`` of things that are not events (traffic flows, fabrics) compared where records
are too."""


def test_readers_only_read_known_kinds() -> None:
    read: dict[str, str] = {}
    for path, tree in _modules(PACKAGE, ROOT / "tests", ROOT / "benchmarks"):
        for where, kind in _read(path, tree):
            read.setdefault(kind, where)
    unknown = {k: w for k, w in read.items() if k not in Kind.__members__.values() and k not in NOT_EVENTS}
    assert not unknown, f"kinds read that nothing writes: {unknown}"
    for kind in ("carrier", "trap", "reroute", "lft_programmed", "subnet_up", "fabric_up", "fault"):
        assert kind in read  # the scan sees the readers that matter (measure, the SM launchers)


@pytest.mark.parametrize("kind", list(Kind))
def test_kinds_are_the_strings_on_disk(kind: Kind) -> None:
    assert json.dumps({"kind": kind}) == json.dumps({"kind": kind.value}) and kind.value == kind.name.lower()


def test_a_tick_writes_a_bounded_piece_of_the_lazy_records_busy_or_idle(tmp_path: Path) -> None:
    """The agent host's ticker (``agenthost.lazy_flush``) never writes a whole backlog at once:
    a k=8 bring-up's ~3,400 records went out in one pause at the first idle tick (~9 ms), which
    a cable cut right after SUBNET UP can meet."""
    from ibemu.fabric.agenthost import LAZY_IDLE_RECORDS, lazy_flush
    path = tmp_path / "events.jsonl"
    log = FabricLog(path)
    for i in range(3 * LAZY_IDLE_RECORDS + 5):
        log.write("sw", {"kind": "port_state", "t_ns": i, "port": 1})
    for ticks, busy in enumerate((False, False, False, False), 1):
        waited_s, at_most = lazy_flush(busy)
        log.flush(waited_s=waited_s, at_most=at_most)
        assert len(lines(path)) == min(ticks * LAZY_IDLE_RECORDS, 3 * LAZY_IDLE_RECORDS + 5)
    assert [r["t_ns"] for r in lines(path)] == list(range(3 * LAZY_IDLE_RECORDS + 5))  # in order
    waited_s, at_most = lazy_flush(True)
    assert waited_s > 0 and 0 < at_most <= 1024
    log.close()
