"""Receive steering of a veth's far end: the kernel's share of what a process sends on a
cable runs on other CPUs than the sender's.

A frame written to a veth is received by its peer in the sender's own system call: the peer's
``netif_rx`` queues it on the *current* CPU's backlog and the softirq that follows, still in
that call, runs everything behind it (the far namespace's tc programs, the next cables, an
eBPF SMA's answer coming back). For the SM that is a whole directed-route or LID-routed round
trip, ~60-100 us per SMP on this machine, inside each ``send``. RPS (``rps_cpus`` of the
peer's receive queues) makes ``netif_rx`` queue the frame on another CPU's backlog instead and
return: the sender goes on framing the next SMP while another CPU carries the last one.

Frames of ethertype 0x88B5 have no flow keys the kernel knows, so they all hash alike: the
mask should name the CPUs to use, not the ones to avoid.

``peer_of`` finds the far end (namespace and name) from the near end's link attributes;
``set_rps`` writes the mask of every receive queue of an interface (in its namespace, through
``ip netns exec``, which mounts that namespace's sysfs); ``RpsControl`` keeps one shell there
to change it often and at once. The setting goes with the interface.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable

from ibemu.kernel import commands
from ibemu.kernel.commands import KernelError

log = logging.getLogger(__name__)

ENV = "IBEMU_SM_STEER"
"""``IBEMU_SM_STEER=0`` turns the SM's steering off."""


def peer_of(ns: str | None, ifname: str) -> tuple[str | None, str]:
    """(namespace, name) of the far end of veth ``ifname`` in ``ns`` (None: this namespace).

    From ``ip -d -o link`` as text: its JSON gives the peer's namespace only as an id."""
    argv = ["ip", *(["-n", ns] if ns else []), "-o", "-d", "link", "show", "dev", ifname]
    text = commands.run(argv, timeout=10).stdout
    head = re.match(r"\d+: ([^:@\s]+)@([^:\s]+):", text)
    if head is None or not re.search(r"\bveth\b", text):
        raise KernelError(f"{ns}/{ifname} is not a veth")
    link = head.group(2)
    other = re.search(r"\blink-netns (\S+)", text)
    if other is None:
        if re.search(r"\blink-netnsid\b", text):
            raise KernelError(f"{ns}/{ifname}: the peer's namespace has no name")
        return ns, link  # same namespace: ip names the peer
    where = other.group(1)
    index = re.fullmatch(r"if(\d+)", link)
    if index is None:
        raise KernelError(f"{ns}/{ifname}: peer {link!r} not understood")
    out = commands.run(["ip", "-n", where, "-o", "link", "show"], timeout=10).stdout
    for line in out.splitlines():
        m = re.match(r"(\d+): ([^:@\s]+)[@:]", line)
        if m and int(m.group(1)) == int(index.group(1)):
            return where, m.group(2)
    raise KernelError(f"{ns}/{ifname}: peer ifindex {index.group(1)} not found in {where}")


def mask(cpus: Iterable[int]) -> str:
    """The hex CPU mask sysfs takes (``rps_cpus``)."""
    value = 0
    for cpu in cpus:
        if cpu < 0:
            raise ValueError(f"CPU {cpu}")
        value |= 1 << cpu
    return f"{value:x}"


def set_rps(ns: str | None, ifname: str, cpus: Iterable[int]) -> int:
    """Steer what ``ifname`` receives to ``cpus`` (empty: no steering); returns the queues set."""
    if "/" in ifname or ifname in (".", ".."):
        raise ValueError(f"interface name {ifname!r}")
    script = ('n=0; for f in /sys/class/net/"$1"/queues/rx-*/rps_cpus; do echo "$2" > "$f" || exit 1; '
              'n=$((n+1)); done; echo $n')
    argv = ["sh", "-c", script, "sh", ifname, mask(cpus)]
    out = commands.run(["ip", "netns", "exec", ns, *argv] if ns else argv, timeout=10).stdout
    return int(out.strip().splitlines()[-1])


def other_cpus(own: Iterable[int] | None = None) -> list[int]:
    """The CPUs this machine lets the process use, less ``own`` (default: the calling thread's)."""
    mine = set(os.sched_getaffinity(0) if own is None else own)
    every = _online()
    return sorted(every - mine)


def _online() -> set[int]:
    try:
        with open("/sys/devices/system/cpu/online") as f:
            text = f.read().strip()
    except OSError:
        return set(range(os.cpu_count() or 1))
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def steer_peer(ns: str | None, ifname: str, cpus: Iterable[int]) -> tuple[str | None, str, int]:
    """``set_rps`` on the far end of veth ``ifname``: (its namespace, its name, queues set)."""
    where, peer = peer_of(ns, ifname)
    return where, peer, set_rps(where, peer, cpus)


def _which(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise KernelError(f"`{name}` not found")
    return path


class RpsControl:
    """Turns the steering of one interface on and off at once, as often as asked: one shell
    in the interface's namespace (``ip netns exec``, started once) writes each mask it is
    given (~0.1 ms a change instead of ~20 ms for a new process). ``close`` ends it."""

    def __init__(self, ns: str | None, ifname: str) -> None:
        if "/" in ifname or ifname in (".", ".."):
            raise ValueError(f"interface name {ifname!r}")
        script = ('while read -r m; do n=0; for f in /sys/class/net/"$1"/queues/rx-*/rps_cpus; do '
                  'echo "$m" > "$f" || break; n=$((n+1)); done; echo "$n"; done')
        argv = ["sh", "-c", script, "sh", ifname]
        argv = ["ip", "netns", "exec", ns, *argv] if ns else argv
        argv[0] = _which(argv[0])
        self.where = f"{ns}/{ifname}"
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.cpus: tuple[int, ...] | None = None

    def set(self, cpus: Iterable[int]) -> int:
        """Steer to ``cpus`` (empty: no steering); returns the queues set."""
        want = tuple(sorted(cpus))
        if self.proc.stdin is None or self.proc.stdout is None or self.proc.poll() is not None:
            raise KernelError(f"steering of {self.where}: its shell is gone")
        try:
            self.proc.stdin.write(mask(want) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError as exc:
            raise KernelError(f"steering of {self.where}: {exc}") from None
        if not line.strip().isdigit() or not int(line):
            raise KernelError(f"steering of {self.where}: no receive queue written")
        self.cpus = want
        return int(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stdin):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
