"""Probe frames across a live fabric: send from one host's cable, count what reaches another's."""

from __future__ import annotations

import time

from ibemu import clock
from ibemu.fabric.plan import FabricPlan
from ibemu.kernel import sockfilter
from ibemu.kernel.packet import open_packet_socket
from ibemu.wire import fast


def send_and_count(plan: FabricPlan, src: str, dst: str, src_lid: int, dst_lid: int, n: int, *,
                   size: int = 200, rdma_write: bool = False, wait_s: float = 3.0,
                   pkey: int | None = None) -> int:
    """Send ``n`` frames (SEND Only, or RDMA WRITE Only) from ``src`` to ``dst``; how many arrive.

    Raw sockets on the two hosts' cables, beside their agents: the frames cross the switches
    exactly as traffic from the hosts would. Paced (1 ms per 64 frames) to stay below what
    one Python forwarder of the user datapath can take. ``pkey``: the frames carry it, and
    only data frames with it from ``src_lid`` are counted (partition tests: nothing else may
    pass for them; a late frame of an earlier probe to the same host is not counted).
    """
    sp, dp = plan.nodes[src], plan.nodes[dst]
    out = open_packet_socket(sp.ns, sp.ports[1].ifname)
    inp = open_packet_socket(dp.ns, dp.ports[1].ifname, bpf=None if pkey is None else sockfilter.DATA_ONLY)
    try:
        tmpl = fast.NativeTemplate(slid=src_lid, dlid=dst_lid, destqp=0x42,
                                   eth=fast.ethernet_header(sp.ports[1].peer_mac, sp.ports[1].mac),
                                   pkey=0xFFFF if pkey is None else pkey)
        payload = b"\xa5" * size
        for psn in range(n):
            if rdma_write:
                out.send(tmpl.packet(0x0A, psn, payload, ext=fast.reth(0x1000, 0x77, size)))
            else:
                out.send(tmpl.packet(0x04, psn, payload))
            if psn % 64 == 63:
                time.sleep(0.001)
        got, deadline = 0, clock.monotonic() + wait_s
        while got < n and clock.monotonic() < deadline:
            try:
                while True:
                    frame = inp.recv(9000)
                    if pkey is None:
                        got += 1
                        continue
                    peek = fast.peek(frame, 14)  # this probe's frames: a late one of the last probe is not
                    got += peek.pkey == pkey and peek.slid == src_lid
            except BlockingIOError:
                time.sleep(0.01)
        return got
    finally:
        out.close()
        inp.close()


def send_bursts(plan: FabricPlan, src: str, dst: str, src_lid: int, dst_lid: int, bursts: int, burst: int, *,
                size: int = 2048, gap_s: float = 0.005, wait_s: float = 3.0) -> dict[str, int]:
    """``bursts`` bursts of ``burst`` RDMA WRITE Only frames, back to back, PSNs in order,
    ``gap_s`` (real) apart, from ``src`` to ``dst``: ``received`` and ``out_of_order`` (frames
    that arrived after a frame with a later PSN: the reordering the fabric caused, as a
    receiver of one QP sees it)."""
    sp, dp = plan.nodes[src], plan.nodes[dst]
    out = open_packet_socket(sp.ns, sp.ports[1].ifname)
    inp = open_packet_socket(dp.ns, dp.ports[1].ifname, bpf=sockfilter.DATA_ONLY)
    try:
        tmpl = fast.NativeTemplate(slid=src_lid, dlid=dst_lid, destqp=0x42,
                                   eth=fast.ethernet_header(sp.ports[1].peer_mac, sp.ports[1].mac))
        payload = b"\xa5" * size
        got = late = 0
        top = -1
        n = bursts * burst

        def drain() -> None:
            nonlocal got, late, top
            try:
                while True:
                    frame = inp.recv(9000)
                    psn = fast.peek(frame, 14).psn
                    got += 1
                    if psn < top:
                        late += 1
                    else:
                        top = psn
            except BlockingIOError:
                pass

        for b in range(bursts):
            for i in range(burst):
                psn = b * burst + i
                out.send(tmpl.packet(0x0A, psn, payload, ext=fast.reth(0x1000, 0x77, size)))
            time.sleep(gap_s)
            drain()
        deadline = time.monotonic() + wait_s  # real seconds, whatever the dilation
        while got < n and time.monotonic() < deadline:
            time.sleep(0.01)
            drain()
        return {"received": got, "out_of_order": late}
    finally:
        out.close()
        inp.close()
