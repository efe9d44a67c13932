"""IB-level ``pingall`` for the Mininet adapter: every host sends to every other host's LID.

Mininet's ``pingall`` sends ICMP echoes; IB hosts have no IP. Here each ordered pair (src,
dst) gets ``count`` UD SEND frames built at src's port with SLID = src's LID and DLID = dst's
LID, sent on src's cable beside its agent (as ``fabric.probe`` does): they cross the switches
through the LFTs the subnet manager wrote, and a pair succeeds when one of them arrives on
dst's cable. The payload names the pair, so frames for other pairs or from the agents are not
counted. LIDs are asked of each host's MAD socket, so any SM (ibemu's, OpenSM) will do.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

from ibemu import clock
from ibemu.errors import IbemuError
from ibemu.fabric.plan import FabricPlan
from ibemu.kernel.packet import open_packet_socket
from ibemu.traffic.endpoints import query_lid
from ibemu.wire import fast

log = logging.getLogger(__name__)

PING_QPN = 0x4D4E  # a QP no host has: the destination's transport drops the frame after us
PING_QKEY = 0x1B0E
UD_SEND_ONLY = 0x64
_MAGIC = b"IBEMU-MN-PING"
_PAIR = struct.Struct("!13sHHI")  # magic, src index, dst index, nonce


def host_lids(plan: FabricPlan, hosts: Sequence[str]) -> dict[str, int]:
    """Each host's LID (0 when it has none: no SM, or the port is not Active)."""
    lids: dict[str, int] = {}
    for name in hosts:
        try:
            lids[name] = query_lid(plan.nodes[name].ns)
        except (OSError, IbemuError) as exc:
            log.warning("no LID for %s: %s", name, exc)
            lids[name] = 0
    return lids


def pingall(plan: FabricPlan, hosts: Sequence[str], *, count: int = 1,
            timeout_s: float = 1.0) -> dict[str, Any]:
    """``{"lids": {host: lid}, "reached": {src: {dst: bool}}}`` for every ordered pair."""
    lids = host_lids(plan, hosts)
    nonce = int(time.monotonic_ns()) & 0xFFFFFFFF
    index = {h: i for i, h in enumerate(hosts)}
    socks: dict[str, socket.socket] = {}
    reached = {s: {d: False for d in hosts if d != s} for s in hosts}
    try:
        for h in hosts:
            pp = plan.nodes[h].ports[1]
            socks[h] = open_packet_socket(plan.nodes[h].ns, pp.ifname)
        for src in hosts:
            pp = plan.nodes[src].ports[1]
            eth = fast.ethernet_header(pp.peer_mac, pp.mac)
            for dst in hosts:
                if dst == src or not lids[src] or not lids[dst]:
                    continue
                tmpl = fast.NativeTemplate(slid=lids[src], dlid=lids[dst], destqp=PING_QPN, eth=eth)
                payload = _PAIR.pack(_MAGIC, index[src], index[dst], nonce)
                for psn in range(count):
                    with contextlib.suppress(BlockingIOError):
                        socks[src].send(tmpl.packet(UD_SEND_ONLY, psn, payload,
                                                    ext=fast.deth(PING_QKEY, PING_QPN)))
        _collect(socks, hosts, nonce, reached, timeout_s)
    finally:
        for s in socks.values():
            s.close()
    return {"lids": lids, "reached": reached}


def _collect(socks: dict[str, socket.socket], hosts: Sequence[str], nonce: int,
             reached: dict[str, dict[str, bool]], timeout_s: float) -> None:
    expected = sum(len(v) for v in reached.values())
    got, deadline = 0, clock.monotonic() + timeout_s
    while got < expected and clock.monotonic() < deadline:
        idle = True
        for dst, sock in socks.items():
            with contextlib.suppress(BlockingIOError):
                while True:
                    frame = sock.recv(9000)
                    idle = False
                    at = frame.find(_MAGIC)
                    if at < 0 or len(frame) < at + _PAIR.size:
                        continue
                    _, si, di, n = _PAIR.unpack_from(frame, at)
                    if n != nonce or si >= len(hosts) or hosts[di] != dst:
                        continue
                    src = hosts[si]
                    if src != dst and not reached[src][dst]:
                        reached[src][dst] = True
                        got += 1
        if idle:
            time.sleep(0.005)
