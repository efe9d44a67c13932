"""The out-of-band exchange of two ``ibemu perf`` processes (perftest does it over TCP).

Emulated hosts have no IP network between them (their cables carry IB frames only), so the
two sides meet on a UNIX stream socket in the run's directory, which every namespace sees:
``<run_dir>/oob/<server host>.sock``. Messages are JSON lines: the client sends its options
and QP info, the server answers with its own, and at the end the client says ``done``.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import trio

from ibemu.errors import IbemuError

log = logging.getLogger(__name__)

MAX_LINE = 1 << 20


def socket_path(run_dir: Path, host: str) -> Path:
    return run_dir / "oob" / f"{host}.sock"


class Channel:
    """One JSON-lines conversation over a trio stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._buf = b""

    async def send(self, msg: dict[str, Any]) -> None:
        await self.stream.send_all(json.dumps(msg).encode() + b"\n")

    async def recv(self) -> dict[str, Any]:
        while b"\n" not in self._buf:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise IbemuError("the other ibemu perf process went away")
            self._buf += chunk
            if len(self._buf) > MAX_LINE:
                raise IbemuError("out-of-band message too long")
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            msg = json.loads(line)
        except ValueError as exc:
            raise IbemuError(f"malformed out-of-band message: {exc}") from exc
        if not isinstance(msg, dict):
            raise IbemuError("malformed out-of-band message: not an object")
        return msg

    async def aclose(self) -> None:
        await self.stream.aclose()


async def accept_one(path: Path) -> Channel:
    """Listen on ``path`` until one client connects (the socket file is removed after)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        await sock.bind(str(path))
        sock.listen(1)
        conn, _ = await sock.accept()
    finally:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return Channel(trio.SocketStream(conn))


async def connect(path: Path, timeout_s: float = 10.0) -> Channel:
    """Connect to the server at ``path``, waiting up to ``timeout_s`` for it to listen."""
    with trio.move_on_after(timeout_s):
        while True:
            try:
                stream = await trio.open_unix_socket(str(path))
                return Channel(stream)
            except (FileNotFoundError, ConnectionRefusedError):
                await trio.sleep(0.05)
    raise IbemuError(f"no ibemu perf server at {path.stem} (start it first: "
                     f"ibemu exec {path.stem} -- ibemu perf TEST)")
