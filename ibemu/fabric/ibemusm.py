"""Run ibemu's own subnet manager (``python -m ibemu.sm``) on an emulated host, owned by a run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ibemu import clock
from ibemu.errors import IbemuError


def start(ns: str, workdir: Path, *, engine: str = "minhop", extra: list[str] | None = None,
          keep_events: bool = False) -> subprocess.Popen[bytes]:
    """The SM process, attached to the MAD socket in ``ns``; events in ``workdir/events.jsonl``,
    OpenSM-format dumps (``opensm-subnet.lst``, ``opensm-lfts.dump``, ``guid2lid``) beside them.

    A previous SM's event log in ``workdir`` is set aside (``events.jsonl.prev``): its
    ``subnet_up`` must not pass for this one's; with ``keep_events`` (the same SM restarted in
    a run, fault ``sm_up``) the new process appends to it. Its LID state is kept (LIDs stay stable).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / "events.jsonl"
    if events.exists() and not keep_events:
        events.replace(workdir / "events.jsonl.prev")
    argv = [sys.executable, "-m", "ibemu.sm", "--ns", ns, "--engine", engine,
            "--events", str(workdir / "events.jsonl"), "--state", str(workdir / "state.json"),
            "--dump-dir", str(workdir), *(extra or [])]
    return subprocess.Popen(argv, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(workdir / "sm.err", "wb"), env=clock.child_env())


def key_args(keys: Mapping[str, int]) -> list[str]:
    """``python -m ibemu.sm`` options for an SM's M_Key settings (``SMSpec.keys``)."""
    if not keys.get("m_key"):
        return []
    return ["--m-key", f"{keys['m_key']:#x}", "--m-key-protect", str(keys.get("m_key_protect", 0)),
            "--m-key-lease", str(keys.get("m_key_lease_s", 0))]


def election_args(priority: int, poll_interval_ms: int, poll_retries: int) -> list[str]:
    """``python -m ibemu.sm`` options for its place in the election (``SMSpec.election``)."""
    return ["--priority", str(priority), "--poll-interval", f"{poll_interval_ms / 1000:g}",
            "--poll-retries", str(poll_retries)]


def wait_state(proc: subprocess.Popen[bytes], workdir: Path, state: str, timeout_s: float = 60.0) -> None:
    """Until the SM's log says it entered SMInfo ``state`` (``sm_state`` event: ``standby``,
    ``master``)."""
    _wait_for(proc, workdir, timeout_s, "sm_state", lambda r: r.get("new") == state, f"state {state}")


def wait_subnet_up(proc: subprocess.Popen[bytes], workdir: Path, timeout_s: float = 60.0) -> float:
    """Seconds the SM reported for its bring-up (its ``subnet_up`` event)."""
    record = _wait_for(proc, workdir, timeout_s, "subnet_up", lambda r: True, "SUBNET UP")
    return float(record.get("seconds", 0.0))


def _wait_for(proc: subprocess.Popen[bytes], workdir: Path, timeout_s: float, kind: str,
              match: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    """The first record of ``kind`` that ``match``es in the SM's event log, as it is written."""
    events = workdir / "events.jsonl"
    deadline = clock.monotonic() + timeout_s
    offset, partial = 0, b""
    while True:
        if events.exists():
            with open(events, "rb") as f:  # read only what was appended since the last look
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                if kind.encode() not in line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("kind") == kind and match(record):
                    return dict(record)
        if proc.poll() is not None:
            err = (workdir / "sm.err").read_text(errors="replace")[-2000:] if (workdir / "sm.err").exists() else ""
            raise IbemuError(f"ibemu's SM exited ({proc.returncode}) before {what}:\n{err}")
        if clock.monotonic() > deadline:
            raise IbemuError(f"no {what} from ibemu's SM in {timeout_s:.0f} s")
        time.sleep(0.02)
