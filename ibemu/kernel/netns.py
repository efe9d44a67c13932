"""Network namespaces: bulk create/delete, entering one from a thread to open sockets, and
the argv that runs a program inside one.

A socket (netlink, AF_PACKET, unix) belongs to the namespace its creating thread was in, and
keeps it after the thread leaves: ``entered(name)`` lets one process own sockets in many
namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ibemu.kernel.commands import KernelError, batch

NETNS_RUN_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_libc_held = ctypes.PyDLL(None, use_errno=True)
"""The same C library called keeping the GIL (``entered_fd``)."""


def exists(name: str) -> bool:
    return (NETNS_RUN_DIR / name).exists()


def list_names() -> list[str]:
    try:
        return sorted(p.name for p in NETNS_RUN_DIR.iterdir())
    except FileNotFoundError:
        return []


def check_free(names: Iterable[str]) -> None:
    """Raise KernelError if any of ``names`` already exists (it is not ours to reuse)."""
    clash = [n for n in names if exists(n)]
    if clash:
        raise KernelError(f"namespace {clash[0]} already exists ({len(clash)} clash): not ours to reuse")


def create(names: Iterable[str]) -> None:
    """Create namespaces (one ``ip -batch``); raises if any already exists."""
    names = list(names)
    check_free(names)
    batch("ip", [f"netns add {n}" for n in names])


def delete(names: Iterable[str]) -> list[str]:
    """Delete the namespaces that exist (their veth ends go with them); returns failures."""
    present = [n for n in names if exists(n)]
    return batch("ip", [f"netns del {n}" for n in present], force=True)


def exec_argv(ns: str, argv: Sequence[str]) -> list[str]:
    """The argv that runs ``argv`` inside namespace ``ns`` (``ip netns exec``); its first
    element is the program to exec (``os.execvp(a[0], a)``)."""
    return ["ip", "netns", "exec", ns, *argv]


def _setns(fd: int, *, hold_gil: bool = False) -> None:
    if (_libc_held if hold_gil else _libc).setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise KernelError(f"setns failed: {os.strerror(err)}")


class _Home:
    """A thread's own namespace, open for as long as the thread lives (``_inside``)."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)

    def __del__(self) -> None:  # the thread's locals go with it
        os.close(self.fd)


_where = threading.local()


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with the calling thread inside namespace ``name`` (then come back).

    Nested use for the same namespace costs nothing, so a caller opening many sockets in one
    namespace can enter it once around them all. On the trio thread only for a synchronous
    body (no await inside): the thread must be home again before another task runs.
    """
    if getattr(_where, "ns", None) == name:
        yield
        return
    target = open_fd(name)
    try:
        with _inside(target, name):
            yield
    finally:
        os.close(target)


def open_fd(name: str) -> int:
    """A descriptor of namespace ``name`` for ``entered_fd`` (the caller closes it; while it
    is open the namespace lives on, so its owner closes it before removing the namespace)."""
    try:
        return os.open(NETNS_RUN_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise KernelError(f"namespace {name} does not exist") from None


def entered_fd(fd: int) -> contextlib.AbstractContextManager[None]:
    """``entered`` for a namespace already open (``open_fd``), on a path that must not queue
    for the GIL again half-way: two ``setns`` keeping it, where ``entered`` opens the target
    too and releases the GIL in each system call, each a chance for another thread (the
    agent host's loop) to take it for up to its switch interval. 8-13 us here at a cut,
    hand-timed (the first of a thread's: ~40 us). (By descriptor: no name to nest on.)"""
    return _inside(fd, "", hold_gil=True)


@contextlib.contextmanager
def _inside(fd: int, name: str, *, hold_gil: bool = False) -> Iterator[None]:
    """The calling thread into namespace ``fd`` and back: to its own (kept open for the
    thread's life: ``_Home``), or, nested, to the one it was in (opened for the while).
    ``name``: "" for a namespace entered by descriptor."""
    outer = getattr(_where, "ns", None)
    if outer is None:
        home = getattr(_where, "home", None)
        if home is None:
            home = _where.home = _Home()
        back, opened = home.fd, False
    else:
        back, opened = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC), True
    try:
        _setns(fd, hold_gil=hold_gil)
        _where.ns = name
        try:
            yield
        finally:
            _setns(back, hold_gil=hold_gil)
            _where.ns = outer
    finally:
        if opened:
            os.close(back)


def quiet_ipv6(names: Iterable[str]) -> None:
    """Disable IPv6 in each namespace (before its interfaces exist).

    Otherwise every veth sends router and neighbour solicitations and MLD reports: frames
    nobody asked for on an IB cable. /proc/sys/net resolves to the opening thread's namespace.
    """
    for name in names:
        with entered(name):
            for scope in ("default", "all"):
                with open(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6", "w") as f:
                    f.write("1")
