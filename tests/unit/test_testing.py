"""The shipped test doubles hold to the rules of the real parts (``ibemu.testing``)."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ibemu.testing.madport import InMemoryPort, NonConformance, check_mad_port
from ibemu.wire.umad import SimRequest
from tests.unit.devices.fabrics import chain


def _run(check: object) -> None:
    trio.run(check, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_in_memory_port_passes_the_mad_port_conformance_checks() -> None:
    fab = chain(3)

    async def main() -> None:
        await check_mad_port(InMemoryPort(fab, "sm"), far=(1,))
        await check_mad_port(InMemoryPort(fab, "sm"), far=(1, 3, 3), tid_base=0x1000)

    _run(main)


class _Swapping:
    """A broken MadPort: answers come back with their TID's low bits flipped."""

    def __init__(self, inner: InMemoryPort) -> None:
        self.inner = inner

    async def send(self, req: SimRequest) -> None:
        await self.inner.send(req)

    async def recv(self) -> SimRequest:
        got = await self.inner.recv()
        mad = bytearray(got.mad)
        mad[15] ^= 1  # the TID is bytes 8-15
        return SimRequest(got.dlid, got.slid, got.dqp, got.sqp, bytes(mad), got.status)


class _Losing:
    """A broken MadPort: every third request vanishes."""

    def __init__(self, inner: InMemoryPort) -> None:
        self.inner, self.n = inner, 0

    async def send(self, req: SimRequest) -> None:
        self.n += 1
        if self.n % 3:
            await self.inner.send(req)

    async def recv(self) -> SimRequest:
        return await self.inner.recv()


@pytest.mark.parametrize(("broken", "rule"), [(_Swapping, "1 local NodeInfo"), (_Losing, "3 window")])
def test_the_checks_catch_a_broken_port(broken: type, rule: str) -> None:
    fab = chain(2)

    async def main() -> None:
        with pytest.raises(NonConformance, match=rule):
            await check_mad_port(broken(InMemoryPort(fab, "sm")), timeout_s=1.0)

    _run(main)
