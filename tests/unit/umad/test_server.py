"""The trio server on real abstract unix sockets in this namespace (no root needed)."""

from __future__ import annotations

import os
import secrets
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import pytest
import trio

from ibemu.hca.umad_server import UmadServer, serve
from ibemu.kernel.commands import KernelError
from ibemu.wire.umad import (
    CTL_LEN,
    MAX_CLIENTS,
    ClientInfo,
    CtlMessage,
    CtlType,
    Delivery,
    SimRequest,
    unpack_port,
)
from tests.unit.umad.fakes import LID, LocalSma, PyClient, abstract

pytestmark = pytest.mark.trio
T = TypeVar("T")


def sockname() -> str:
    return f"ibemu-test-{os.getpid()}-{secrets.token_hex(3)}"


@asynccontextmanager
async def running(backend: LocalSma, **kwargs: object) -> AsyncIterator[UmadServer]:
    async with trio.open_nursery() as nursery:
        server = UmadServer(backend, None, sockname(), **kwargs)  # type: ignore[arg-type]
        await nursery.start(server.serve)
        backend.deliver = server.deliver
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


async def in_thread(fn: Callable[[], T]) -> T:
    with trio.fail_after(5):
        return await trio.to_thread.run_sync(fn)


async def wait_for(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.01)


async def test_serve_starts_with_the_server_and_stops_on_cancel() -> None:
    backend = LocalSma()
    name = sockname()
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve, backend, None, name)
        assert isinstance(server, UmadServer) and server.sockname == name
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        probe.connect(abstract(f"{name}:ctl"))
        with pytest.raises(ConnectionRefusedError):
            probe.connect(abstract(f"{name}:out9"))  # data sockets are bound at CONNECT
        probe.close()
        nursery.cancel_scope.cancel()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with pytest.raises(ConnectionRefusedError):
        probe.connect(abstract(f"{name}:ctl"))  # sockets closed on the way out
    probe.close()


async def test_name_clash_is_a_clear_error() -> None:
    backend = LocalSma()
    async with running(backend) as server:
        with pytest.raises(KernelError, match="ctl"):
            await UmadServer(backend, None, server.sockname).serve()


async def test_session_like_umad2sim() -> None:
    backend = LocalSma()
    async with running(backend) as server:
        client = PyClient(server.sockname)
        try:
            reply = await in_thread(client.connect)
            assert reply.type == CtlType.CONNECT and client.slot == 0
            assert ClientInfo.unpack(reply.data).nodeid == "h1"
            assert (await in_thread(lambda: client.call(CtlType.GET_VENDOR, bytes(24)))).type == 4
            nodeinfo = await in_thread(lambda: client.call(CtlType.GET_NODEINFO, bytes(64)))
            assert nodeinfo.data == backend.node_info()
            port = await in_thread(lambda: client.call(CtlType.GET_PORT, bytes(4)))
            assert unpack_port(port.data) == (LID, 4)
            await in_thread(lambda: client.call(CtlType.SET_ISSM, struct.pack("<i", 1)))
            assert backend.issm_calls == [True]
            tid = 0x1111_0002_0000_0007
            resp = await in_thread(lambda: client.query(0x0011, tid))
            assert resp.is_response and resp.status == 0 and resp.tid == tid
            assert resp.mad[64:128] == backend.node_info()
            assert backend.sent[-1].tid == 0x0000_0002_0000_0007  # slot 0 in bits 48-63
            assert (await in_thread(client.disconnect)).type == CtlType.DISCONNECT
            assert len(server.session.clients) == 0 and backend.issm_calls == [True, False]
        finally:
            client.close()


async def test_undeliverable_request_comes_back_with_status_110() -> None:
    backend = LocalSma()
    async with running(backend) as server:
        client = PyClient(server.sockname)
        try:
            await in_thread(client.connect)
            back = await in_thread(lambda: client.query(0x0012, 0x77))  # SwitchInfo: not a CA's
            assert back.status == 110 and not back.is_response and back.tid == 0x77
        finally:
            client.close()


async def test_killed_client_slot_freed_on_send_failure() -> None:
    backend = LocalSma(answer=False)
    async with running(backend, reap_interval=None) as server:
        dead = PyClient(server.sockname, pid=1_000_001)
        await in_thread(dead.connect)
        await in_thread(lambda: dead.send(SimRequest(0xFFFF, 0xFFFF, 0, 0, bytes([1, 0x81, 1, 1]) + bytes(252))))
        await wait_for(lambda: len(backend.sent) == 1)
        dead.close()  # killed: no DISCONNECT
        assert len(server.session.clients) == 1
        assert server.deliver(backend.respond(backend.sent[0])) is Delivery.CLIENT_GONE
        assert len(server.session.clients) == 0 and server.stats["client_gone"] == 1
        alive = PyClient(server.sockname, pid=1_000_002)
        try:
            backend.answer = True
            await in_thread(alive.connect)
            assert alive.slot == 0
            assert (await in_thread(lambda: alive.query(0x0011, 5))).status == 0
        finally:
            alive.close()


async def test_killed_client_reaped_periodically_and_issm_cleared() -> None:
    backend = LocalSma()
    async with running(backend, reap_interval=0.05) as server:
        sm = PyClient(server.sockname, pid=1_000_003)
        await in_thread(lambda: sm.connect(issm=True))
        assert backend.issm_calls == [True]
        sm.close()
        await wait_for(lambda: len(server.session.clients) == 0)
        assert backend.issm_calls == [True, False]


async def test_connect_when_full_reaps_dead_clients() -> None:
    backend = LocalSma()
    async with running(backend, reap_interval=None) as server:
        clients = [PyClient(server.sockname, pid=2_000_000 + i) for i in range(MAX_CLIENTS)]
        extra = PyClient(server.sockname, pid=2_000_100)
        try:
            for c in clients:
                assert (await in_thread(c.connect)).type == CtlType.CONNECT
            assert (await in_thread(extra.connect)).type == CtlType.ERROR
            clients[4].close()
            clients[7].close()
            assert (await in_thread(extra.connect)).type == CtlType.CONNECT
            assert extra.slot == 4 and len(server.session.clients) == MAX_CLIENTS - 1
            assert server.stats["client_gone"] == 2
        finally:
            for c in [*clients, extra]:
                c.close()


async def test_connect_without_a_data_socket_is_refused() -> None:
    backend = LocalSma()
    async with running(backend) as server:
        client = PyClient(server.sockname, pid=3_000_000)
        client.data.close()  # never bound an in<pid> socket
        try:
            reply = await in_thread(client.connect)
            assert reply.type == CtlType.ERROR and len(server.session.clients) == 0
            assert server.stats["connect_no_data_socket"] == 1
        finally:
            client.ctl.close()


async def test_malformed_datagrams_answered_and_server_keeps_going() -> None:
    backend = LocalSma()
    async with running(backend) as server:
        client = PyClient(server.sockname)
        try:
            for junk in (b"", b"\x01" * 79, b"\xff" * 80, b"\0" * 500):
                reply = await in_thread(lambda junk=junk: client.ctl_raw(junk))  # type: ignore[misc]
                assert len(reply) == CTL_LEN and CtlMessage.unpack(reply).type == CtlType.ERROR
            await in_thread(client.connect)
            for junk in (b"", b"\x01" * 287, b"\x02" * 289):
                client.data.send(junk)
            assert (await in_thread(lambda: client.query(0x0010, 9))).status == 0
            assert server.stats["ctl_bad_size"] == 3 and server.stats["ctl_bad_magic"] == 1
            assert server.stats["data_bad_size"] == 3
        finally:
            client.close()


async def test_slow_client_gets_a_backlog_in_order_then_drops() -> None:
    backend = LocalSma(answer=False)
    async with running(backend, backlog=64) as server:
        client = PyClient(server.sockname)
        try:
            await in_thread(lambda: client.connect(issm=True))
            results = []
            for i in range(2000):  # far more than a unix datagram queue holds
                results.append(server.deliver(SimRequest(1, 2, 0, 0, _trap(i))))
            assert results[0] is Delivery.DELIVERED
            assert Delivery.QUEUED in results and Delivery.DROPPED in results
            expected = [i for i, r in enumerate(results) if r is not Delivery.DROPPED]

            def drain() -> list[int]:
                return [client.recv().tid for _ in expected]
            assert await in_thread(drain) == expected
            await wait_for(lambda: not server._backlog[0])
        finally:
            client.close()


async def test_unsolicited_trap_reaches_only_the_sm_client() -> None:
    backend = LocalSma()
    async with running(backend) as server:
        plain, sm = PyClient(server.sockname, pid=4_000_001), PyClient(server.sockname, pid=4_000_002)
        try:
            await in_thread(plain.connect)
            assert server.deliver(SimRequest(1, 2, 0, 0, _trap(1))) is Delivery.NO_CLIENT
            await in_thread(lambda: sm.connect(issm=True))
            assert server.deliver(SimRequest(1, 2, 0, 0, _trap(2))) is Delivery.DELIVERED
            got = await in_thread(sm.recv)
            assert got.tid == 2 and (got.dlid, got.slid) == (1, 2)
            plain.data.settimeout(0.05)
            with pytest.raises(TimeoutError):
                plain.recv()
        finally:
            plain.close()
            sm.close()


def _trap(tid: int) -> bytes:
    mad = bytearray(256)
    mad[0:4] = bytes([1, 0x01, 1, 0x05])
    struct.pack_into(">QH", mad, 8, tid, 0x0002)
    return bytes(mad)


async def test_liveness_checks_lose_nothing_under_traffic() -> None:
    backend = LocalSma(keep_sent=False)
    async with running(backend, reap_interval=0.001) as server:
        client = PyClient(server.sockname)
        try:
            await in_thread(client.connect)

            def traffic() -> list[int]:
                return [client.query(0x0011, i).tid for i in range(500)]
            assert await in_thread(traffic) == list(range(500))
            assert len(server.session.clients) == 1 and server.stats["client_gone"] == 0
        finally:
            client.close()


async def test_deliver_when_not_running_drops() -> None:
    server = UmadServer(LocalSma(), None, sockname())
    assert server.deliver(SimRequest(1, 2, 0, 0, _trap(1))) is Delivery.DROPPED
