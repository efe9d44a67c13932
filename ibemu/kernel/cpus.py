"""CPU placement: the agent host and the subnet manager each on a CPU of its own.

In a real fabric the switches' management firmware and the SM node have processors of their
own. On one machine the scheduler puts a process it wakes next to its waker: every MAD the
agent host hands the SM woke the SM on the agent host's CPU, where it preempted the agents,
and the two ran in turn instead of side by side (a k=8 reroute's trap -> last LFT ack took
27 ms instead of 21 ms in ``benchmarks/bench_sm.py``). With two usable CPUs or more, the
agent host's thread gets the first and the SM process the second; traffic workers get the
others when there are any (else all of them, at their lower priority).

``IBEMU_PIN=0`` turns placement off. Only the calling thread and processes ibemu started
are pinned, and a pinned thread gets its previous CPUs back (``unpin_thread``).

Awake CPUs (``awake``): a switch's firmware does not sleep between two events, but an idle
CPU of a virtual machine halts, and waking it again costs a VM exit and an interrupt: on
this machine a thread woken by another took 115 us at the median to run (hand-timed, 200
wake-ups), 54 us with the CPUs kept out of halt. A reroute is a chain of such wake-ups (the
agents' loop taking the cut, the SM taking the trap, each burst of responses), so while a
fabric runs ibemu asks the kernel to keep every CPU in its polling idle state: a PM QoS CPU
latency request of 0 us (``/dev/cpu_dma_latency``), held by an open descriptor of this
process and dropped by the kernel when it closes, at exit or a crash. On k=8
(``benchmarks/bench_sm.py``, quiet machine, the medians of two invocations without it and
three with it) fault -> trap at the SM went 1.09-1.21 -> 0.85-1.05 ms and trap -> last LFT
ack 5.44-5.55 -> 5.03-5.42 ms. The cost: an idle CPU polls instead of
halting while the fabric runs (a virtual machine's host sees its CPUs busy).
``IBEMU_CPU_IDLE=1`` lets them sleep; without the device (or root) the run says so in one
line and goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENV = "IBEMU_PIN"
IDLE_ENV = "IBEMU_CPU_IDLE"
"""``IBEMU_CPU_IDLE=1``: the CPUs may sleep while a fabric runs (no ``awake`` request)."""
PM_QOS = "/dev/cpu_dma_latency"


@contextlib.contextmanager
def awake(path: str = PM_QOS) -> Iterator[bool]:
    """Keep every CPU out of idle states deeper than polling for the block (see the module
    docstring): a PM QoS CPU latency request of 0 us, written to ``path`` and held while its
    descriptor is open. Yields whether the request is held."""
    if os.environ.get(IDLE_ENV, "0") == "1":
        yield False
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        os.write(fd, struct.pack("=i", 0))
    except OSError as exc:
        log.info("the CPUs may sleep between the fabric's events (no PM QoS request: %s)", exc)
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)


def idle_latency_us(path: str = PM_QOS) -> int | None:
    """The CPU latency the kernel holds the CPUs to now (the smallest request; 2,000,000,000
    without any), None when it cannot be read: what a benchmark says of its CPUs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        value = os.read(fd, 4)
    finally:
        os.close(fd)
    return struct.unpack("=i", value)[0] if len(value) == 4 else None


@dataclass(frozen=True)
class Placement:
    agents: frozenset[int] | None = None
    """The agent host's thread; None: not pinned."""
    sm: frozenset[int] | None = None
    """The subnet manager's process (ibemu's or OpenSM)."""
    others: frozenset[int] | None = None
    """Everything else ibemu starts for the run (traffic workers)."""
    all: frozenset[int] | None = None
    """Every usable CPU (what a thread started by the pinned one gets back)."""


def usable() -> list[int]:
    """The CPUs this process may run on (a container's or cgroup's limit included)."""
    return sorted(os.sched_getaffinity(0))


def placement(cpus: list[int] | None = None) -> Placement:
    """Where the agent host, the SM and the rest go on ``cpus`` (default: ``usable()``)."""
    if os.environ.get(ENV, "1") == "0":
        return Placement()
    cpus = usable() if cpus is None else sorted(cpus)
    if len(cpus) < 2:
        return Placement()
    rest = frozenset(cpus[2:]) if len(cpus) > 2 else frozenset(cpus)
    return Placement(agents=frozenset({cpus[0]}), sm=frozenset({cpus[1]}), others=rest, all=frozenset(cpus))


def pin_thread(cpus: frozenset[int] | None) -> set[int] | None:
    """Pin the calling thread to ``cpus``; returns the CPUs it had (for ``unpin_thread``),
    or None when nothing was changed."""
    if not cpus:
        return None
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        log.debug("cannot pin this thread to CPUs %s: %s", sorted(cpus), exc)
        return None
    return before


def unpin_thread(before: set[int] | None) -> None:
    """Give the calling thread back the CPUs ``pin_thread`` returned."""
    if before:
        try:
            os.sched_setaffinity(0, before)
        except OSError as exc:
            log.debug("cannot give this thread back CPUs %s: %s", sorted(before), exc)


@contextlib.contextmanager
def realtime(priority: int = 1) -> Iterator[bool]:
    """The calling thread at SCHED_FIFO ``priority`` (default the lowest) for the block, then
    back to its own policy: for a step that stands for hardware (a PHY's loss of signal) and
    must not wait behind the machine's other work. Yields whether it was granted (refused:
    the thread runs on as it was)."""
    before = os.sched_getscheduler(0)
    param = os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        log.debug("SCHED_FIFO refused: %s", exc)
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, before, param)


def pin_process(pid: int, cpus: frozenset[int] | None) -> None:
    """Pin process ``pid`` (one ibemu started) to ``cpus``; a process gone is left alone."""
    if not cpus:
        return
    try:
        os.sched_setaffinity(pid, cpus)
    except OSError as exc:
        log.debug("cannot pin process %d to CPUs %s: %s", pid, sorted(cpus), exc)


def release_threads(placement: Placement) -> int:
    """Give every usable CPU back to the threads of this process still pinned to the agents'
    CPU: threads the agent host's thread started while pinned inherited its CPU (trio keeps
    idle worker threads for seconds, and a process they start inherits it too). Returns how
    many threads were released."""
    if not placement.agents or not placement.all:
        return 0
    released = 0
    for name in os.listdir("/proc/self/task"):
        try:
            tid = int(name)
            if os.sched_getaffinity(tid) == placement.agents:
                os.sched_setaffinity(tid, placement.all)
                released += 1
        except (OSError, ValueError):  # the thread ended meanwhile
            continue
    return released


def model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), "" when unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
