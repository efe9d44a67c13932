"""Ownership of everything a run creates: a run id, a prefix, and a state file written ahead.

Every namespace and process ibemu creates is recorded in the run's state file *before* it is
created, so that ``ibemu clean`` can remove exactly what ibemu made after any crash — and
nothing else: it never matches by name pattern alone. Processes are recorded with their start
time, so a recycled PID is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ibemu.kernel import netns

log = logging.getLogger(__name__)

STATE_DIR = Path(os.environ.get("IBEMU_STATE_DIR", "/run/ibemu"))
PREFIX = "ibemu"


def new_run_id() -> str:
    """Short random id; namespace names are ``ibemu-<run>-<node>``."""
    return secrets.token_hex(3)


def ns_name(run_id: str, node: str) -> str:
    return f"{PREFIX}-{run_id}-{node}"


def process_start_time(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a live process, None if it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # Fields after the parenthesised command name (which may contain spaces): state is the
    # first, starttime the 20th. A zombie has finished: it counts as gone.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass
class OwnedProcess:
    pid: int
    start_time: int
    role: str

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time


@dataclass
class RunState:
    """What one run owns. Persisted as JSON in ``STATE_DIR/<run_id>.json``."""

    run_id: str
    created: float = field(default_factory=time.time)
    owner_pid: int = field(default_factory=os.getpid)
    scenario: str | None = None
    status: str = "building"
    namespaces: list[str] = field(default_factory=list)
    processes: list[OwnedProcess] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    shared_memory: list[str] = field(default_factory=list)
    """Files in /dev/shm the run made (libfaketime's shared start time of a dilated tool)."""

    @property
    def path(self) -> Path:
        return STATE_DIR / "runs" / f"{self.run_id}.json"

    @property
    def run_dir(self) -> Path:
        """Scratch files of the run (daemon log, event log, tool work dirs); removed with it."""
        return STATE_DIR / "runs" / self.run_id

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    def claim_namespaces(self, names: Iterable[str]) -> None:
        """Record namespaces about to be created (write-ahead)."""
        self.namespaces.extend(n for n in names if n not in self.namespaces)
        self.save()

    def claim_shared_memory(self, paths: Iterable[str]) -> None:
        """Record files about to be created in /dev/shm (write-ahead)."""
        for p in paths:
            if not p.startswith("/dev/shm/") or "/" in p[len("/dev/shm/"):]:
                raise ValueError(f"not a file of /dev/shm: {p}")
            if p not in self.shared_memory:
                self.shared_memory.append(p)
        self.save()

    def claim_process(self, pid: int, role: str) -> OwnedProcess:
        start = process_start_time(pid)
        if start is None:
            raise ProcessLookupError(f"process {pid} ({role}) is not running")
        proc = OwnedProcess(pid, start, role)
        self.processes.append(proc)
        self.save()
        return proc

    @classmethod
    def load(cls, path: Path) -> RunState:
        data = json.loads(path.read_text())
        data["processes"] = [OwnedProcess(**p) for p in data.get("processes", [])]
        return cls(**data)


def list_runs() -> list[RunState]:
    runs = []
    for path in sorted((STATE_DIR / "runs").glob("*.json")):
        try:
            runs.append(RunState.load(path))
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring unreadable run state %s: %s", path, exc)
    return runs


def stop_processes(procs: Iterable[OwnedProcess], grace_s: float = 3.0) -> None:
    """SIGTERM the live ones (checked by start time), then SIGKILL what is left. Each SIGTERM
    is followed by SIGCONT, as a shell's ``kill`` does for a stopped job, so that a stopped
    process acts on it now rather than being killed after ``grace_s``."""
    live = [p for p in procs if p.alive() and p.pid != os.getpid()]
    for p in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGTERM)
            os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        time.sleep(0.02)
        live = [p for p in live if p.alive()]
    for p in live:
        log.warning("process %d (%s) ignored SIGTERM: killing it", p.pid, p.role)
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGKILL)


def teardown(state: RunState, grace_s: float = 30.0) -> list[str]:
    """Remove everything ``state`` owns; returns problems (empty when all went).

    Processes go first (a fabric daemon tears its own fabric down on SIGTERM, within
    ``grace_s``); whatever namespaces remain are then deleted.
    """
    stop_processes(state.processes, grace_s)
    for path in state.shared_memory:  # only the files this run recorded, each in /dev/shm
        if path.startswith("/dev/shm/") and "/" not in path[len("/dev/shm/"):]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    problems = netns.delete(state.namespaces)
    left = [n for n in state.namespaces if netns.exists(n)]
    if left:
        problems.append(f"namespaces still present: {', '.join(left[:5])}")
    if not problems:
        with contextlib.suppress(FileNotFoundError):
            state.path.unlink()
        shutil.rmtree(state.run_dir, ignore_errors=True)
    return problems

