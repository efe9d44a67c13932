"""MAD ports for tests, and the conformance checks every ``MadPort`` implementation passes.

A ``MadPort`` (``ibemu.sm.transport.MadPort``) is where an SM's MADs go in and out: ``send`` a
``SimRequest``, ``recv`` the next one. ibemu has two: ``UmadPort`` (a live host's MAD socket,
what ``python -m ibemu.sm`` attaches with) and ``InMemoryPort`` below (a CA of an
``InMemoryFabric``, for unit tests). ``check_mad_port`` holds either to the same rules, so a
unit test on the double says something about the live port: ``tests/unit/test_testing.py``
runs it on ``InMemoryPort``, ``tests/integration/test_agent_host.py`` on ``UmadPort`` over a
live fabric.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

import trio

from ibemu.testing.wiring import InMemoryFabric
from ibemu.wire import madcodec as mb
from ibemu.wire.umad import SimRequest

NODE_INFO = 0x11
NODE_TYPE_CA, NODE_TYPE_SWITCH = 1, 2
ST_BAD_METHOD_ATTR = 0x000C
UNKNOWN_ATTR = 0xFF7E  # in the vendor range no emulated device implements
LOW32 = 0xFFFFFFFF


class MadPortLike(Protocol):
    async def send(self, req: SimRequest) -> None: ...

    async def recv(self) -> SimRequest: ...


class EchoPort:
    """A ``MadPort`` that answers every request at once, as if every SMP reached a device
    that agreed: the request back as its GetResp (same TID; a directed route's direction bit
    set), queued for ``recv``. ``sent`` counts the requests. For measuring an SM's own cost
    per SMP and for tests that need answers without a fabric; no device state behind it."""

    def __init__(self) -> None:
        self._tx, self._rx = trio.open_memory_channel[SimRequest](1 << 20)
        self.sent = 0

    def send_nowait(self, req: SimRequest) -> None:
        self.sent += 1
        mad = bytearray(req.mad)
        mad[3] = 0x81
        if mad[1] == 0x81:
            mad[4] |= 0x80  # DR: the direction bit of a response
        self._tx.send_nowait(SimRequest(req.slid, req.dlid, 0, 0, bytes(mad)))

    async def send(self, req: SimRequest) -> None:
        self.send_nowait(req)
        await trio.lowlevel.checkpoint()

    async def recv(self) -> SimRequest:
        return await self._rx.receive()


class InMemoryPort:
    """A ``MadPort`` on CA ``name`` port ``port`` of an ``InMemoryFabric``.

    ``send`` hands the MAD to the CA agent and runs the fabric to quiet; what the CA
    delivered is queued for ``recv``. Call ``pump()`` after acting on the fabric yourself
    (a link down, ``advance``) so traps it produced reach the SM. ``fab.delivered[name]``
    is consumed (cleared) as it is read.
    """

    def __init__(self, fab: InMemoryFabric, name: str, port: int = 1) -> None:
        self.fab, self.name, self.port = fab, name, port
        self.agent = fab.agents[name]
        self._queue: deque[SimRequest] = deque()
        self._wake = trio.Event()

    async def send(self, req: SimRequest) -> None:
        send_mad = getattr(self.agent, "send_mad")  # noqa: B009 - a CA agent
        self.fab.handle(self.name, send_mad(self.port, req.dlid, req.dqp, req.sqp, req.mad))
        self.fab.run()
        self.pump()
        await trio.lowlevel.checkpoint()

    def pump(self) -> int:
        got = self.fab.delivered[self.name]
        n = 0
        for d in got:
            if d.port == self.port:
                self._queue.append(SimRequest(d.dlid, d.slid, d.dqp, d.sqp, d.mad, d.status))
                n += 1
        got.clear()
        if n:
            self._wake.set()
        return n

    async def recv(self) -> SimRequest:
        while not self._queue:
            self._wake = trio.Event()
            await self._wake.wait()
        return self._queue.popleft()


class NonConformance(AssertionError):
    """A ``MadPort`` broke one of the rules of ``check_mad_port``; the message names it."""


def _dr_get(attr: int, path: Sequence[int], tid: int) -> SimRequest:
    return SimRequest(dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0,
                      mad=mb.dr_smp(mb.GET, attr, path=list(path), tid=tid))


async def _answers(port: MadPortLike, requests: list[SimRequest], rule: str, timeout_s: float) -> dict[int, bytes]:
    """Send every request, then collect one response per TID (low 32 bits)."""
    want = {mb.tid(r.mad) & LOW32 for r in requests}
    for r in requests:
        await port.send(r)
    got: dict[int, bytes] = {}
    with trio.move_on_after(timeout_s):
        while len(got) < len(want):
            resp = await port.recv()
            key = mb.tid(resp.mad) & LOW32
            if key not in want:
                raise NonConformance(f"{rule}: a response with TID {key:#x}, which no request had")
            if key in got:
                raise NonConformance(f"{rule}: TID {key:#x} answered twice")
            if resp.status:
                raise NonConformance(f"{rule}: TID {key:#x} came back undeliverable (status {resp.status})")
            got[key] = resp.mad
    if len(got) < len(want):
        raise NonConformance(f"{rule}: {len(want) - len(got)} of {len(want)} requests unanswered "
                             f"after {timeout_s:g} s")
    return got


def _node_type(mad: bytes, rule: str) -> int:
    if mad[3] != mb.GET_RESP or mb.status(mad):
        raise NonConformance(f"{rule}: method {mad[3]:#x} status {mb.status(mad):#06x}, "
                             "not a GetResp with status 0")
    return mb.parse_node_info(mb.smp_data(mad)).node_type


async def check_mad_port(port: MadPortLike, *, far: Sequence[int] = (1,), window: int = 16,
                         tid_base: int = 0x5EED0000, timeout_s: float = 5.0) -> None:
    """Hold ``port`` (a CA port cabled to a switch) to the rules every ``MadPort`` keeps.

    ``far``: a directed route from the port to a switch (``(1,)``: the switch on its cable).
    Raises ``NonConformance`` naming the first rule broken:

    1. a directed-route Get(NodeInfo) of the local port is answered, TID kept, by a CA;
    2. one along ``far`` crosses the cable and is answered by a switch;
    3. ``window`` requests in flight at once are each answered exactly once, matched by TID;
    4. a Get of an attribute no device implements is answered with status 0x000C.
    """
    tid = tid_base
    rule = "1 local NodeInfo"
    mad = (await _answers(port, [_dr_get(NODE_INFO, (), tid)], rule, timeout_s))[tid & LOW32]
    if _node_type(mad, rule) != NODE_TYPE_CA:
        raise NonConformance(f"{rule}: answered by node type {_node_type(mad, rule)}, not a CA")
    tid += 1
    rule = f"2 NodeInfo along {list(far)}"
    mad = (await _answers(port, [_dr_get(NODE_INFO, far, tid)], rule, timeout_s))[tid & LOW32]
    if _node_type(mad, rule) != NODE_TYPE_SWITCH:
        raise NonConformance(f"{rule}: answered by node type {_node_type(mad, rule)}, not a switch")
    tid += 1
    rule = f"3 window of {window}"
    batch = [_dr_get(NODE_INFO, far if i % 2 else (), tid + i) for i in range(window)]
    got = await _answers(port, batch, rule, timeout_s)
    for i, req in enumerate(batch):
        expect = NODE_TYPE_SWITCH if i % 2 else NODE_TYPE_CA
        if _node_type(got[mb.tid(req.mad) & LOW32], rule) != expect:
            raise NonConformance(f"{rule}: TID {mb.tid(req.mad):#x} answered by the wrong node")
    tid += window
    rule = "4 unknown attribute"
    mad = (await _answers(port, [_dr_get(UNKNOWN_ATTR, far, tid)], rule, timeout_s))[tid & LOW32]
    if mb.status(mad) != ST_BAD_METHOD_ATTR:
        raise NonConformance(f"{rule}: status {mb.status(mad):#06x}, not {ST_BAD_METHOD_ATTR:#06x}")
