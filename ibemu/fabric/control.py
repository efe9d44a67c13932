"""The fabric daemon's control channel: faults on demand, through the daemon's FaultInjector.

The daemon listens on a UNIX stream socket in its run directory (``control.sock``, mode 0600:
root only, like everything in a run). A client sends one JSON object on one line and reads
one JSON line back, then the connection closes::

    {"fault": "link_down", "link": "agg0_0:4"}            -> {"ok": true, "t_fault_ns": ...}
    {"fault": "link_up", "link": "edge0_0-agg0_0", "end": "agg0_0"}   (end: 0, 1 or a name)
    {"fault": "switch_down", "switch": "agg1_0"}          (and switch_up)
    {"fault": "smp_loss", "percent": 20, "switch": "core0"} (switch optional: every agent)
    {"fault": "corrupt", "link": "edge0_0:3", "percent": 1}
    {"ping": true}                                        -> {"ok": true}

Links are named as in scenarios (``ibemu.topo.refs``). Every fault is stamped by the
injector (a ``fault`` event in ``events.jsonl``), exactly as a scheduled one. Errors come back
as ``{"ok": false, "error": "..."}``; the channel never takes the daemon down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Protocol

import trio

from ibemu.topo.model import Link, Topology

log = logging.getLogger(__name__)

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024
LINK_FAULTS = ("link_down", "link_up", "corrupt")
FAULTS = ("link_down", "link_up", "switch_down", "switch_up", "smp_loss", "corrupt")


class ControlError(ValueError):
    """A request the daemon refuses (unknown fault, unknown link or switch, bad value)."""


class Injector(Protocol):
    """What the channel needs of :class:`ibemu.fabric.faults.FaultInjector`."""

    topo: Topology

    def link(self, link: Link, up: bool, *, end: int = 0) -> int: ...
    def switch(self, name: str, up: bool) -> int: ...
    def smp_loss(self, percent: float, switch: str | None = None) -> int: ...
    def corrupt(self, link: Link, percent: float) -> int: ...


def socket_path(run_dir: Path) -> Path:
    return Path(run_dir) / SOCKET_NAME


def _link(topo: Topology, text: object) -> Link:
    from ibemu.topo import refs
    try:
        return refs.link(topo, text)
    except refs.RefError as exc:
        raise ControlError(str(exc)) from None


def _end(link: Link, value: object) -> int:
    """Which end goes down: 0 / 1, or the end's name (``agg0_0:4`` or ``agg0_0``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return value
    for i, ep in enumerate(link.ends):
        if value in (str(ep), ep.node):
            return i
    raise ControlError(f"end must be 0, 1 or an end of {link}, not {value!r}")


def _percent(req: dict[str, Any]) -> float:
    value = req.get("percent")
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100:
        raise ControlError(f"percent must be a number within 0..100, not {value!r}")
    return float(value)


def handle(injector: Injector, req: object) -> dict[str, Any]:
    """Carry out one request (blocking: the link and switch faults talk to the kernel)."""
    from ibemu.topo import refs
    if not isinstance(req, dict):
        raise ControlError(f"expected a JSON object, got {type(req).__name__}")
    if req.get("ping"):
        return {"ok": True}
    fault = req.get("fault")
    if fault not in FAULTS:
        raise ControlError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    topo = injector.topo
    if fault in ("link_down", "link_up"):
        link = _link(topo, req.get("link"))
        end = _end(link, req.get("end", 0))
        return {"ok": True, "link": str(link), "t_fault_ns": injector.link(link, fault == "link_up", end=end)}
    if fault == "corrupt":
        link = _link(topo, req.get("link"))
        return {"ok": True, "link": str(link), "t_fault_ns": injector.corrupt(link, _percent(req))}
    if fault == "smp_loss":
        name = req.get("switch")
        if name is not None:
            try:
                refs.switch(topo, str(name))
            except refs.RefError as exc:
                raise ControlError(str(exc)) from None
        return {"ok": True, "t_fault_ns": injector.smp_loss(_percent(req), name)}
    name = str(req.get("switch"))
    try:
        refs.switch(topo, name)
    except refs.RefError as exc:
        raise ControlError(str(exc)) from None
    return {"ok": True, "switch": name, "t_fault_ns": injector.switch(name, fault == "switch_up")}


def _reply(injector: Injector, line: bytes) -> dict[str, Any]:
    try:
        return handle(injector, json.loads(line))
    except (ControlError, json.JSONDecodeError) as exc:
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # a fault that failed in the kernel: say so, keep serving
        log.exception("control request %r failed", line[:200])
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


async def _connection(stream: trio.SocketStream, injector: Injector, lock: trio.Lock) -> None:
    async with stream:
        buf = b""
        with trio.move_on_after(10):
            while b"\n" not in buf and len(buf) < MAX_REQUEST:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                buf += chunk
        if not buf.strip():
            return
        async with lock:  # one fault at a time, in the order they came
            reply = await trio.to_thread.run_sync(_reply, injector, buf.split(b"\n", 1)[0])
        with contextlib.suppress(trio.BrokenResourceError):  # the client left
            await stream.send_all(json.dumps(reply).encode() + b"\n")


async def serve_control(path: Path, injector: Injector, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on ``path`` until cancelled; the socket file is removed on the way out."""
    path = Path(path)
    path.unlink(missing_ok=True)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    os.chmod(path, 0o600)
    sock.listen(16)
    listener = trio.SocketListener(sock)
    lock = trio.Lock()
    try:
        async with trio.open_nursery() as nursery:
            task_status.started()
            log.info("control channel on %s", path)
            while True:
                stream = await listener.accept()
                nursery.start_soon(_connection, stream, injector, lock)
    finally:
        sock.close()
        path.unlink(missing_ok=True)


def request(path: Path, payload: dict[str, Any], *, timeout_s: float = 30.0) -> dict[str, Any]:
    """Send one request to a daemon's control socket and return its reply (blocking client)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(str(path))
        s.sendall(json.dumps(payload).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
    if not buf.strip():
        raise ConnectionError(f"{path}: the daemon closed the connection without a reply")
    return dict(json.loads(buf))
