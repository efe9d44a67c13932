"""OpenSM's log (flushed line by line with ``-d2``) turned into ibemu's SM event vocabulary.

OpenSM stamps each line with the local wall clock to the microsecond
(``Dec 03 07:55:34 826097 [D288E6C0] 0x01 -> ...``). ibemu's processes stamp with the
emulated clock (``ibemu.clock``): a wall stamp is moved onto the monotonic clock (the two
are one offset apart, taken when the log is read), then onto the emulated one, so OpenSM's
steps land on the same time line as the fabric's agents and the runner's faults, to within
the microsecond resolution of the log.

On a dilated run OpenSM runs under libfaketime (``ibemu.kernel.faketime``): its wall clock is
then the emulated clock plus the realtime offset recorded in ``workdir/clock.json`` when it
was started, and a stamp is moved by that offset alone (``parse(..., faked=True)``).

Recognised lines (OpenSM 3.3.23, default log level):

- ``log_trap_info: Received Generic Notice type:1 num:128 ... from LID:13 TID:0x...`` -> ``trap``
- ``osm_ucast_mgr_process: <engine> tables configured on all switches`` -> ``routes_computed``
- ``ucast_mgr_route: <engine>: cannot build ...`` -> ``routing_fallback`` (OpenSM then
  routes with minhop, e.g. ftree on a fat-tree that lost a cable)
- ``SUBNET UP`` -> ``subnet_up``
- ``Entering MASTER state`` (STANDBY, DISCOVERING, NOT ACTIVE) -> ``sm_state`` (``new``: the
  state in lower case; the election, a takeover)

and one ``reroute`` per trap-triggered sweep: ``t_trap`` (the first trap after the previous
SUBNET UP), ``t_routed`` (its tables configured), ``t_subnet_up``. OpenSM logs no LFT ack,
so ``t_programmed`` is left to the switch agents' ``lft_programmed`` stamps.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ibemu import clock
from ibemu.events import Kind, write_all

_LINE = re.compile(r"^(\w{3}) (\d\d) (\d\d):(\d\d):(\d\d) (\d{6}) \[[0-9A-Fa-f]+\] 0x[0-9a-f]{2} -> (.*)$")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep",
                                       "Oct", "Nov", "Dec"), 1)}
_TRAP = re.compile(r"Received Generic Notice type:\d+ num:(\d+) .*from LID:(\d+) TID:(0x[0-9a-fA-F]+)")
_ROUTED = re.compile(r"osm_ucast_mgr_process: (\S+) tables configured")
_FALLBACK = re.compile(r"ucast_mgr_route: (\S+): cannot build")
_STATE = re.compile(r"Entering (MASTER|STANDBY|DISCOVERING|NOT ?ACTIVE) state")


def wall_to_monotonic_offset_ns() -> int:
    """CLOCK_REALTIME minus the monotonic clock, now."""
    return time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns()


def _wall_ns(stamp: tuple[str, ...], now: float) -> int | None:
    """Epoch ns of a local-time stamp (month, day, h, m, s, us) without a year: the year that
    puts it nearest ``now``."""
    month, day, hh, mm, ss, us = stamp
    mon = _MONTHS.get(month)
    if mon is None:
        return None
    year = time.localtime(now).tm_year
    best: float | None = None
    for y in (year - 1, year, year + 1):
        try:
            t = time.mktime((y, mon, int(day), int(hh), int(mm), int(ss), 0, 0, -1))
        except (OverflowError, ValueError):
            continue
        if best is None or abs(t - now) < abs(best - now):
            best = t
    return None if best is None else int(best) * 1_000_000_000 + int(us) * 1000


CLOCK_FILE = "clock.json"
"""Which clock OpenSM ran on (``ibemu.fabric.opensm``): absent on the real clock (dilation 1)."""


def log_clock(workdir: Path) -> dict[str, Any] | None:
    """``workdir/clock.json``: OpenSM's faked clock (``SharedStart.describe()``), or None."""
    try:
        d = json.loads((workdir / CLOCK_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return d if isinstance(d, dict) and isinstance(d.get("realtime_offset_ns"), int) else None


def parse_workdir(workdir: Path, text: str | None = None) -> list[dict[str, Any]]:
    """The events of ``workdir/opensm.log`` (or ``text``), on the clock OpenSM ran on."""
    if text is None:
        text = (workdir / "opensm.log").read_text(errors="replace")
    faked = log_clock(workdir)
    if faked is None:
        return parse(text.splitlines())
    return parse(text.splitlines(), offset_ns=faked["realtime_offset_ns"], faked=True)


def parse(lines: Iterable[str], *, offset_ns: int | None = None, now: float | None = None,
          faked: bool = False) -> list[dict[str, Any]]:
    """The events of OpenSM log ``lines`` on the emulated clock (``offset_ns``: wall - mono).

    ``faked``: the log was written on the emulated clock plus ``offset_ns`` (libfaketime);
    otherwise on the real wall clock, ``offset_ns`` (now if not given) from the monotonic one.
    """
    offset = wall_to_monotonic_offset_ns() if offset_ns is None else offset_ns
    now_s = time.time() if now is None else now
    events: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None  # the reroute being followed
    for t_ns, text in stamped(lines, offset, now_s, faked):
        if m := _TRAP.search(text):
            events.append({"kind": Kind.TRAP, "t_ns": t_ns, "trap_number": int(m.group(1)),
                           "issuer_lid": int(m.group(2)), "tid": m.group(3)})
            if pending is None:
                pending = {"kind": Kind.REROUTE, "t_ns": t_ns, "t_trap": t_ns, "t_routed": None,
                           "t_programmed": None, "t_subnet_up": None, "engine": None, "reason": "trap"}
        elif m := _ROUTED.search(text):
            events.append({"kind": Kind.ROUTES_COMPUTED, "t_ns": t_ns, "engine": m.group(1)})
            if pending is not None and pending["t_routed"] is None:
                pending["t_routed"] = t_ns
                pending["engine"] = m.group(1)
        elif m := _STATE.search(text):
            events.append({"kind": Kind.SM_STATE, "t_ns": t_ns,
                           "new": m.group(1).lower().replace(" ", "_").replace("notactive", "not_active")})
        elif m := _FALLBACK.search(text):
            events.append({"kind": Kind.ROUTING_FALLBACK, "t_ns": t_ns, "engine": m.group(1), "what": text})
        elif text.strip() == "SUBNET UP":
            events.append({"kind": Kind.SUBNET_UP, "t_ns": t_ns})
            if pending is not None:
                pending["t_subnet_up"] = t_ns
                events.append(pending)
                pending = None
    if pending is not None:  # the log ended mid-sweep
        events.append(pending)
    events.sort(key=lambda e: e["t_ns"])
    return events


def reroute_answering(events: list[dict[str, Any]], t_ns: int) -> dict[str, Any] | None:
    """The sweep that answered the first trap at or after ``t_ns`` in ``events`` (``parse``),
    once its SUBNET UP is there: the first ``reroute`` whose SUBNET UP follows that trap, its
    ``t_trap`` that trap's stamp. None while there is none.

    A sweep's ``t_trap`` is its first trap, and a trap can come before the change one waits
    for: ibemu's switches repeat a trap that found no route to the SM (~1-2 s later), and a
    repeat landing just after a SUBNET UP starts the sweep that the next change's traps join
    (OpenSM sweeps once for all of them). Such a sweep is returned with ``t_trap`` moved to
    the first trap at or after ``t_ns``, ``t_routed`` kept only if it came after it, and
    ``merged`` True."""
    trap = next((e["t_ns"] for e in events if e["kind"] == Kind.TRAP and e["t_ns"] >= t_ns), None)
    if trap is None:
        return None
    for e in events:
        if e["kind"] == Kind.REROUTE and e["t_subnet_up"] is not None and e["t_subnet_up"] >= trap:
            found = {**e, "merged": e["t_trap"] < trap}
            if found["merged"]:
                found["t_trap"] = trap
                if found["t_routed"] is not None and found["t_routed"] < trap:
                    found["t_routed"] = None
            return found
    return None


def stamped(lines: Iterable[str], offset_ns: int, now_s: float, faked: bool = False) -> Iterator[tuple[int, str]]:
    """(emulated ns, message) of each stamped line."""
    for line in lines:
        m = _LINE.match(line.rstrip("\n"))
        if m is None:
            continue  # continuation lines of a multi-line message
        wall = _wall_ns(m.groups()[:6], now_s)
        if wall is not None:
            yield (wall - offset_ns if faked else clock.to_emulated_ns(wall - offset_ns)), m.group(7)


def write_events(workdir: Path) -> Path | None:
    """``workdir/events.jsonl`` from ``workdir/opensm.log`` (None when there is no log)."""
    log_path = workdir / "opensm.log"
    if not log_path.exists():
        return None
    events = parse_workdir(workdir)
    out = workdir / "events.jsonl"
    write_all(out, events)
    return out
