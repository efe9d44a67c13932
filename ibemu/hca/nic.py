"""An HCA port's transport on its real cable: the sans-IO ``Hca`` fed from an AF_PACKET socket.

``HcaPort`` owns one packet socket on a host's cable (data QPs only: the management agent in
the agent host keeps QP0/QP1, see ``kernel.sockfilter``), runs the receive path and the
transport's timers as trio tasks, and transmits what the transport asks for::

    port = HcaPort.open(ns, "h3-1", lid=7)        # blocking: before trio or in a thread
    async with trio.open_nursery() as n:
        await n.start(port.serve)
        qp = port.hca.create_rc_qp(cq)
        ...
        port.post(qp, wrs)                        # transmit now, arm the timers
        await port.wait_progress()                # until a receive batch or a timer ran

Received frames are checked by the transport (length, CRCs, DLID, QPN, P_Key) and every
drop is counted in ``hca.stats``; nothing a cable delivers can raise here.

Timers against process scheduling: a real HCA takes every packet as it arrives; this one takes
them when its process runs. On a loaded machine the process is off the CPU for longer than a
local ACK timeout (67 ms at the streams' timeout 14), and when it runs again its timer task
could fire before the receive tasks read the ACKs that were waiting in the sockets (or, with
both ends of a flow in this process, the requests that draw those ACKs): a spurious timeout,
a go-back-N of the whole window, whose duplicates kept the next stall long enough for the
next timeout: a stream's RC QP retransmitted tens of thousands of packets without progress
until RETRY_EXC_ERR. So before a transport timer fires, every port serving in this process
reads what waits in its socket (``catch_up``, bounded: a process that cannot keep up still
fires its timers), and the timer fires only if its deadline still stands. A frame the fabric
lost never arrives, so genuine timeouts are unchanged. Deviation: the wait the timer measures
is the fabric's (and the peer's, when the peer is another process), not this process's.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable, Sequence

import trio

from ibemu import clock
from ibemu.hca.transport import Hca, RcQp, SendWr, UdQp
from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.hca import FIRST_QPN
from ibemu.kernel import sockfilter
from ibemu.kernel.packet import (
    ETH_P_IB,
    kernel_stamp,
    mac_address,
    open_packet_socket,
    stamp_received,
)
from ibemu.wire import fast

log = logging.getLogger(__name__)

ETH_LEN = 14
RECV_BATCH = 128
MAX_FRAME = 9216
CMSG_SPACE = 64
PORT_BUFFER = 32 << 20
"""Socket buffers of a host port: a window of 256 4 KiB packets per QP, several QPs."""


class HcaPort:
    """One host port: an ``Hca`` transport on a packet socket, with trio receive and timer tasks."""

    def __init__(self, sock: socket.socket, hca: Hca, peer_mac: bytes, *, name: str = "",
                 timestamps: bool = False) -> None:
        self.sock = sock
        self.hca = hca
        self.name = name or f"lid{hca.lid}"
        self.eth = fast.ethernet_header(peer_mac, mac_address(sock))
        self.tx_packets = 0
        self.tx_dropped = 0
        self.rx_frames = 0
        self.caught_up = 0
        """Frames read before a transport timer was judged (they had waited in the socket)."""
        self.rx_runts = 0
        self.on_frame: list[Callable[[int], None]] = []
        """Called after each received frame with its arrival time (monotonic ns): the kernel's
        receive stamp with ``timestamps``, else the time this process read it."""
        self.timestamps = timestamps
        self._real_minus_mono = 0
        if timestamps:
            stamp_received(sock)
            self._sync_clocks()
        self._progress = trio.Event()
        self._kick = trio.Event()
        self._timer_at: int | None = None
        self._batches = 0

    @classmethod
    def open(cls, ns: str | None, ifname: str, peer_mac: bytes, lid: int, *, mtu: int = 4096,
             port: int = 1, seed: int | None = None, name: str = "",
             qpns: tuple[int, int] | None = None, timestamps: bool = False) -> HcaPort:
        """Open the port's socket on ``ifname`` in ``ns`` (None: this namespace). Blocking.

        ``peer_mac``: the far end of the cable (the frames' Ethernet destination). ``qpns``:
        this process's QP numbers ``(first, end)`` when several processes share the port
        (the kernel gives each only its own QPs' frames); default: every data QP.
        ``timestamps``: frames carry the kernel's receive time (``on_frame``).
        """
        bpf = sockfilter.DATA_ONLY if qpns is None else sockfilter.qp_range(*qpns)
        sock = open_packet_socket(ns, ifname, ETH_P_IB, bpf=bpf, buffer_bytes=PORT_BUFFER)
        try:
            hca = Hca(lid=lid, port=port, mtu=mtu, seed=seed,
                      first_qpn=qpns[0] if qpns else FIRST_QPN)
            return cls(sock, hca, peer_mac, name=name or ifname, timestamps=timestamps)
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def _sync_clocks(self) -> None:
        """Kernel receive stamps are CLOCK_REALTIME: keep its offset from the (real) monotonic
        clock; ``clock.to_emulated_ns`` then puts a stamp on the emulated clock. (The offset
        from the emulated clock would apply the dilation twice: at dilation N the stamps ran
        N^2 times slower than real time, and a stream's deliveries all looked earlier than a
        fault, as if it never resumed.)"""
        self._real_minus_mono = clock.realtime_offset_ns()

    # -- transmit ------------------------------------------------------------------------
    def transmit(self, sends: Iterable[Send]) -> None:
        """Put the transport's packets on the cable (a full queue drops, as a wire would)."""
        eth = self.eth
        self.send_frames([eth + s.packet for s in sends])

    def send_frames(self, frames: Iterable[bytes]) -> None:
        """Whole frames onto the cable, counted; a full queue drops them, as a wire would."""
        send = self.sock.send
        n = 0
        for frame in frames:
            try:
                send(frame)
                n += 1
            except OSError:
                self.tx_dropped += 1
        self.tx_packets += n
        if n:
            self._rearm()

    def post(self, qp: RcQp | UdQp, wrs: SendWr | Sequence[SendWr]) -> None:
        """``qp.post_send(wrs)`` and transmit what it produced."""
        self.transmit(qp.post_send(wrs))

    # -- waiting -------------------------------------------------------------------------
    async def wait_progress(self) -> None:
        """Until the next receive batch or timer run on this port."""
        await self._progress.wait()

    def _signal_progress(self) -> None:
        ev = self._progress
        self._progress = trio.Event()
        ev.set()

    def _rearm(self) -> None:
        """Wake the timer task if the transport now has an earlier deadline than it sleeps to."""
        at = self._timer_at
        if at is None or at > 0:
            d = self.hca.next_deadline()
            if d is not None and (at is None or d < at):
                self._kick.set()

    # -- tasks ---------------------------------------------------------------------------
    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the receive path and the timers until cancelled."""
        ports = serving_ports()
        ports.append(self)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._receiver)
                nursery.start_soon(self._timers)
                task_status.started()
        finally:
            ports.remove(self)

    def packet_of(self, frame: bytes) -> bytes | bytearray | memoryview | None:
        """The native packet (LRH .. VCRC) a received frame carries; None (counted) if none.
        Here the frame's Ethernet header goes; a RoCE port decapsulates RoCEv2 instead."""
        if len(frame) <= ETH_LEN:
            self.rx_runts += 1
            return None
        return memoryview(frame)[ETH_LEN:]

    async def _receiver(self) -> None:
        sock = self.sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            self._drain(RECV_BATCH)
            self._signal_progress()

    def _drain(self, limit: int) -> int:
        """Read and process up to ``limit`` frames waiting in the socket (never blocks); the
        frames read."""
        sock, receive, transmit = self.sock, self.hca.receive, self.transmit
        recv, recvmsg = sock.recv, sock.recvmsg
        packet_of = self.packet_of
        frame_hooks = self.on_frame
        stamped = self.timestamps
        to_emulated = clock.to_emulated_ns  # kernel stamps are real time
        if stamped and self._batches % 1024 == 0:
            self._sync_clocks()
        self._batches += 1
        got = 0
        for _ in range(limit):
            t_ns = 0
            try:
                if stamped:
                    frame, anc, _flags, _addr = recvmsg(MAX_FRAME, CMSG_SPACE)
                    t_ns = to_emulated(_stamp(anc) - self._real_minus_mono)
                else:
                    frame = recv(MAX_FRAME)
            except BlockingIOError:
                break
            except OSError as exc:  # the interface went away (a torn-down fabric)
                log.debug("%s: recv: %s", self.name, exc)
                break
            got += 1
            pkt = packet_of(frame)
            if pkt is None:
                continue
            out = receive(pkt)
            if out:
                transmit(out)
            if frame_hooks:
                if not stamped:
                    t_ns = clock.now_ns()
                for fhook in frame_hooks:
                    fhook(t_ns)
        self.rx_frames += got
        return got

    async def _timers(self) -> None:
        hca = self.hca
        while True:
            deadline = hca.next_deadline()
            self._timer_at = deadline
            kick = self._kick = trio.Event()
            if deadline is None:
                await kick.wait()
                continue
            now = clock.now_ns()
            if deadline > now:
                with trio.move_on_after((deadline - now) / 1e9):
                    await kick.wait()
                continue
            self._timer_at = 0  # running: transmit() must not re-kick
            # Frames that reached this process's ports while it was not running are on the
            # HCA already (a real one would have processed them long ago): they go first, the
            # awaited ACK may be among them. Only then is the timer judged.
            if catch_up() and ((d := hca.next_deadline()) is None or d > clock.now_ns()):
                self._signal_progress()
                await trio.lowlevel.checkpoint()
                continue
            out = hca.tick(clock.now_ns())
            if out:
                self.transmit(out)
            self._signal_progress()
            await trio.lowlevel.checkpoint()


_SERVING: trio.lowlevel.RunVar[list[HcaPort]] = trio.lowlevel.RunVar("hca_ports_serving")
CATCH_UP_ROUNDS = 16
"""Passes over the process's ports before a transport timer fires: each pass can answer what
the previous one sent to another port of this process (a SEND, then its ACK)."""
CATCH_UP_FRAMES = 1 << 14
"""Frames read in one catch-up at most (all ports, all passes): a process that cannot keep up
still fires its timers, and its other tasks are not held up for long."""


def serving_ports() -> list[HcaPort]:
    """The ports serving in this trio run (every ``HcaPort.serve`` in progress)."""
    try:
        return _SERVING.get()
    except LookupError:
        ports: list[HcaPort] = []
        _SERVING.set(ports)
        return ports


def catch_up() -> int:
    """Process every frame waiting on the ports of this process; the frames read.

    A transport timer measures the fabric, not this process's scheduling: frames that arrived
    while the process was off the CPU (or while another task ran) are read before a timer
    fires, on every port, since the ACK a requester awaits may first need its responder on
    another port here to take the request."""
    total = 0
    ports = serving_ports()
    for _ in range(CATCH_UP_ROUNDS):
        got = 0
        for port in ports:
            n = port._drain(CATCH_UP_FRAMES - total - got)
            if n:
                port.caught_up += n
                port._signal_progress()
                got += n
        total += got
        if not got or total >= CATCH_UP_FRAMES:
            break
    if total:
        log.debug("caught up %d frames before a transport timer", total)
    return total


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive stamp of a frame (CLOCK_REALTIME ns); now when absent."""
    t = kernel_stamp(ancillary)
    return time.clock_gettime_ns(time.CLOCK_REALTIME) if t is None else t
