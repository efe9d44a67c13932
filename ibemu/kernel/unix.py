"""Unix datagram sockets with abstract names inside a namespace (abstract names are per netns)."""

from __future__ import annotations

import socket

from ibemu.kernel import netns
from ibemu.kernel.commands import KernelError


def abstract_address(name: str | bytes) -> bytes:
    """``\\0name\\0``: ibsim's convention, where the trailing NUL is part of the name."""
    raw = name.encode() if isinstance(name, str) else name
    return b"\0" + raw + b"\0"


def open_abstract_dgram(ns: str | None, name: str | bytes) -> socket.socket:
    """A non-blocking AF_UNIX/SOCK_DGRAM socket bound to an abstract name in ``ns``.

    ``ns=None`` binds in the caller's own namespace.
    """
    def make() -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(abstract_address(name))
        except OSError as exc:
            sock.close()
            raise KernelError(f"bind unix socket {name!r} in {ns or 'this namespace'}: {exc}") from exc
        return sock

    if ns is None:
        sock = make()
    else:
        with netns.entered(ns):
            sock = make()
    sock.setblocking(False)
    return sock
