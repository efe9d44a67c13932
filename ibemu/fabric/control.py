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

Links are named as in scenarios (``ibemu.topo.refs``). The faults it takes, and how each is
carried out, are those of ``ibemu.fabric.faults.FAULT_ACTIONS`` with ``on_demand``; one that
does not apply to the fabric's kind is refused with the registry's reason. Every fault is
stamped by the injector (a ``fault`` event in ``events.jsonl``), exactly as a scheduled one.
Errors come back as ``{"ok": false, "error": "..."}``; the channel never takes the daemon down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import trio

from ibemu import clock
from ibemu.fabric.faults import FAULT_ACTIONS, Injector, on_demand
from ibemu.topo.model import Link, Topology

log = logging.getLogger(__name__)

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 * 1024
FAULTS = on_demand()


class ControlError(ValueError):
    """A request the daemon refuses (unknown fault, unknown link or switch, bad value)."""


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


class _Request:
    """One request's arguments, parsed as an action asks for them (``faults.Request``)."""

    def __init__(self, topo: Topology, req: dict[str, Any]) -> None:
        self.topo = topo
        self.req = req

    def link(self) -> Link:
        return _link(self.topo, self.req.get("link"))

    def end(self, link: Link) -> int:
        return _end(link, self.req.get("end", 0))

    def percent(self) -> float:
        return _percent(self.req)

    def switch(self) -> str:
        return _switch(self.topo, str(self.req.get("switch")))

    def optional_switch(self) -> str | None:
        name = self.req.get("switch")
        return None if name is None else _switch(self.topo, str(name))


def _switch(topo: Topology, name: str) -> str:
    from ibemu.topo import refs
    try:
        refs.switch(topo, name)
    except refs.RefError as exc:
        raise ControlError(str(exc)) from None
    return name


def handle(injector: Injector, req: object) -> dict[str, Any]:
    """Carry out one request (blocking: the link and switch faults talk to the kernel)."""
    if not isinstance(req, dict):
        raise ControlError(f"expected a JSON object, got {type(req).__name__}")
    if req.get("ping"):
        return {"ok": True}
    fault = req.get("fault")
    action = FAULT_ACTIONS.get(fault) if isinstance(fault, str) else None
    if action is None or action.on_demand is None:
        raise ControlError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    if injector.fabric_kind not in action.fabrics:
        raise ControlError(f"{fault}: {action.refusal}")
    return {"ok": True, **action.on_demand(injector, _Request(injector.topo, req))}


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
        s.settimeout(clock.real_s(timeout_s))  # emulated seconds
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
