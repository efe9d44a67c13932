#!/usr/bin/env python3
"""MAD socket figures: sim_request round trips through the server, control-message latency.

The server (trio, this process) serves a trivial backend that answers every MAD at once;
the client is a separate process speaking the protocol on the same abstract unix sockets
(this namespace, no root needed). Figures: round trips per second, one in flight and with
a window of outstanding MADs; control-message latency (GET_PORT, CONNECT+DISCONNECT). Each is
measured with client and server pinned to the same CPU and to two CPUs: on a VM the
cross-CPU wake-up, not the server, dominates the one-in-flight latency.
Run: .venv/bin/python benchmarks/bench_umad.py [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import struct
import sys
import time
from dataclasses import replace

import trio

from ibemu.hca.umad_server import UmadServer
from ibemu.wire.umad import (
    ClientInfo,
    CtlMessage,
    CtlType,
    Delivery,
    SimRequest,
)


class EchoBackend:
    """Answers every request at once: GetResp, addresses swapped."""

    node_guid = 0x0008F10403960558
    gid_prefix = 0xFE80000000000000
    node_name = "bench"

    def __init__(self) -> None:
        self.deliver: object = None

    def node_info(self) -> bytes:
        return bytes(64)

    def port_info(self, port: int) -> bytes:
        return bytes(64)

    def pkeys(self) -> bytes:
        return b"\xff\xff" + bytes(62)

    def port_lid_state(self) -> tuple[int, int]:
        return 1, 4

    def vendor(self) -> tuple[int, int, int, int]:
        return 0x02C9, 0x1017, 0, 1

    def set_issm(self, on: bool) -> None:
        pass

    def send_mad(self, req: SimRequest) -> None:
        mad = req.mad[:3] + bytes([req.mad[3] | 0x80]) + req.mad[4:]
        resp = replace(req, dlid=req.slid, slid=req.dlid, dqp=req.sqp, sqp=req.dqp, mad=mad)
        result = self.deliver(resp)  # type: ignore[operator]
        assert result is Delivery.DELIVERED or result is Delivery.QUEUED, result


def _abstract(name: str) -> bytes:
    return b"\0" + name.encode() + b"\0"


def client(sockname: str, seconds: float) -> dict[str, float]:
    """The client side (its own process): returns the figures."""
    pid = os.getpid()
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ctl.bind(_abstract(f"{sockname}:ctl{pid}"))
    ctl.connect(_abstract(f"{sockname}:ctl"))
    data = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    data.bind(_abstract(f"{sockname}:in{pid}"))

    def call(type_: int, payload: bytes = b"", slot: int = 0) -> CtlMessage:
        ctl.send(CtlMessage(type_, slot, payload, len(payload)).pack())
        return CtlMessage.unpack(ctl.recv(128))

    def connect() -> int:
        reply = call(CtlType.CONNECT, ClientInfo(pid).pack())
        assert reply.type == CtlType.CONNECT
        return ClientInfo.unpack(reply.data).id

    out: dict[str, float] = {}
    # CONNECT + DISCONNECT latency
    lat = []
    deadline = time.perf_counter() + seconds / 4
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        slot = connect()
        call(CtlType.DISCONNECT, slot=slot)
        lat.append(time.perf_counter() - t0)
    out["connect_disconnect_us"] = statistics.median(lat) * 1e6
    slot = connect()
    data.connect(_abstract(f"{sockname}:out{slot}"))
    lat = []
    deadline = time.perf_counter() + seconds / 4
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        call(CtlType.GET_PORT, bytes(4), slot)
        lat.append(time.perf_counter() - t0)
    lat.sort()
    out["get_port_median_us"] = statistics.median(lat) * 1e6
    out["get_port_p99_us"] = lat[int(len(lat) * 0.99)] * 1e6

    mad = bytearray(256)
    mad[0:4] = bytes([1, 0x81, 1, 0x01])
    struct.pack_into(">H", mad, 16, 0x0011)
    template = SimRequest(0xFFFF, 0xFFFF, 0, 0, bytes(mad)).pack()

    def request(i: int) -> bytes:
        return template[:40] + struct.pack(">Q", i) + template[48:]

    # one in flight
    n, t0 = 0, time.perf_counter()
    lat = []
    while (now := time.perf_counter()) - t0 < seconds / 4:
        data.send(request(n))
        got = data.recv(512)
        lat.append(time.perf_counter() - now)
        assert struct.unpack_from(">Q", got, 40)[0] & 0xFFFFFFFF == n & 0xFFFFFFFF
        n += 1
    out["rtt_per_s"] = n / (time.perf_counter() - t0)
    out["rtt_median_us"] = statistics.median(lat) * 1e6
    # a window of outstanding MADs (the unix queue holds 10 datagrams by default)
    window = 8
    sent = recvd = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds / 4:
        while sent - recvd < window:
            data.send(request(sent))
            sent += 1
        data.recv(512)
        recvd += 1
    while recvd < sent:
        data.recv(512)
        recvd += 1
    out["window8_per_s"] = recvd / (time.perf_counter() - t0)
    call(CtlType.DISCONNECT, slot=slot)
    return out


async def run_server(seconds: float, cpus: tuple[int, int] | None) -> dict[str, float]:
    if cpus is not None:
        os.sched_setaffinity(0, {cpus[0]})  # this (the trio) thread
    backend = EchoBackend()
    sockname = f"ibemu-bench-{os.getpid()}-{secrets.token_hex(3)}"
    async with trio.open_nursery() as nursery:
        server = UmadServer(backend, None, sockname, reap_interval=None)
        await nursery.start(server.serve)
        backend.deliver = server.deliver
        argv = [sys.executable, __file__, "--client", sockname, "--seconds", str(seconds)]
        if cpus is not None:
            argv += ["--cpu", str(cpus[1])]
        res = await trio.run_process(argv, capture_stdout=True)
        nursery.cancel_scope.cancel()
    figures: dict[str, float] = json.loads(res.stdout)
    figures["server_mads"] = server.stats["data_sent"]
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="total measuring time")
    ap.add_argument("--client", metavar="SOCKNAME", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        if args.cpu is not None:
            os.sched_setaffinity(0, {args.cpu})
        print(json.dumps(client(args.client, args.seconds)))
        return
    allowed = sorted(os.sched_getaffinity(0))
    placements: list[tuple[str, tuple[int, int] | None]] = [("same CPU", (allowed[0], allowed[0]))]
    if len(allowed) > 1:
        placements.append(("two CPUs", (allowed[0], allowed[1])))
    print("MAD socket (ibsim client protocol), one client process, trivial backend")
    for label, cpus in placements:
        f = trio.run(run_server, args.seconds / len(placements), cpus)
        os.sched_setaffinity(0, allowed)
        print(f"[{label}]")
        print(f"  sim_request round trips, 1 in flight : {f['rtt_per_s']:>10,.0f} /s"
              f"  (median {f['rtt_median_us']:.1f} us)")
        print(f"  sim_request round trips, 8 in flight : {f['window8_per_s']:>10,.0f} /s")
        print(f"  control GET_PORT latency             : {f['get_port_median_us']:>10.1f} us median,"
              f" {f['get_port_p99_us']:.1f} us p99")
        print(f"  CONNECT + DISCONNECT                 : {f['connect_disconnect_us']:>10.1f} us median")
        print(f"  MADs through the server              : {f['server_mads']:>10,.0f}")


if __name__ == "__main__":
    main()
