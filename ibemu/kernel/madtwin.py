"""The C twin of a MAD-socket slot's hot path (``c_src/madtwin.c``): started, owned, read.

OpenSM reaches the fabric through its host's MAD socket (``hca.umad_server``), and every SMP
it sends costs the agent host some 100 us of Python: the sim_request read and parsed, the CA
agent's framing, the send (whose kernel work runs the SMP's round trip through the switches'
eBPF SMA), the response checked and written back. ``madtwin`` does that for one slot in C, as
the HCA's kernel path would: directed-route SMPs that leave the host are framed there and
written to the host's HCA veth; their responses come back on a packet socket with the
``TWIN_REPLIES`` filter, are checked, get the client's TID back and go straight to the
client. Everything else it forwards, unchanged, to the agent host over a socketpair, which
handles it as if read from the slot. The program's header comment has the exact rules.

``Twin.start`` hands the process the slot's data socket (a descriptor of the server's own
socket: the agent host keeps writing its replies to it), its socketpair end, the packet
socket (opened here, in the host's namespace, the filter attached before it is bound) and a
memfd page of counters (``COUNTERS``) that both map: ``Twin.counters`` reads them live. The
process ends when its socketpair closes (``Twin.stop``, or the agent host ending in any way:
its end is close-on-exec, held by no other process; not PR_SET_PDEATHSIG, which fires when
the worker thread that started it is retired), is ended by PID on ``stop``, and is claimed in
the run's state so that ``ibemu clean RUN`` ends it by PID.

``madtwin`` is built by ``make native`` (scripts/setup.sh does it); without it the MAD socket
stays on the Python path and says so once (``notice_if_missing``). ``IBEMU_MADTWIN=0`` turns
it off, to compare.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import socket
import struct
import subprocess
from pathlib import Path

from ibemu.kernel import cpus, sockfilter
from ibemu.kernel.packet import ETH_P_IB, open_packet_socket

log = logging.getLogger(__name__)

BINARY = Path(__file__).parent / "c_src" / "madtwin"
ENV = "IBEMU_MADTWIN"
CPU_ENV = "IBEMU_MADTWIN_CPU"
"""``fabric`` (the default) or ``sm``: the CPU the twin runs on (``cpus_for``)."""
COUNTERS = ("sent", "answered", "timed_out", "bad_frame", "not_pending", "dr_discard",
            "forwarded", "no_carrier", "client_dropped", "send_error", "pending", "rtt_ns", "rtt_max_ns")
"""``struct twin_stats``'s counters, in its order (after magic and pid)."""
STATS_MAGIC = 0x6E69777464616D
_STATS = struct.Struct(f"<QQ{len(COUNTERS)}Q")
_FWD_BUFFER = 1 << 20
MEMFD_NAME = "madtwin-stats"

_ETH = 14
_MAD = _ETH + 28
TWIN_REPLIES: list[sockfilter.Insn] = [
    (0x30, 0, 0, _ETH + 1),                    # 0: ldb LRH byte 1
    (0x54, 0, 0, 3),                           # 1: A &= 3 (LNH)
    (0x15, 0, 10, 2),                          # 2: LNH 2 (no GRH) -> 3 else reject
    (0x20, 0, 0, _ETH + 12),                   # 3: ld BTH word 1
    (0x54, 0, 0, 0xFFFFFF),                    # 4: A = DestQP
    (0x15, 0, 7, 0),                           # 5: QP0 -> 6 else reject
    (0x30, 0, 0, _MAD + 1),                    # 6: ldb management class
    (0x15, 0, 5, 0x81),                        # 7: directed-route SMP -> 8 else reject
    (0x30, 0, 0, _MAD + 3),                    # 8: ldb method
    (0x15, 0, 3, 0x81),                        # 9: GetResp -> 10 else reject
    (0x28, 0, 0, _MAD + 8),                    # 10: ldh TID bits 63..48
    (0x15, 0, 1, sockfilter.SM_OWN_TID_TAG),   # 11: the twin's tag -> accept else reject
    (0x06, 0, 0, sockfilter.ACCEPT),           # 12: accept
    (0x06, 0, 0, 0),                           # 13: reject
]
"""Directed-route SMP GetResps to QP0 carrying TID tag ``SM_OWN_TID_TAG``: the responses to
the twin's requests (``sockfilter.CA_MANAGEMENT`` keeps them from the CA agent)."""

_noticed = False


def available() -> bool:
    return os.access(BINARY, os.X_OK)


def enabled() -> bool:
    """Built and not turned off (``IBEMU_MADTWIN=0``)."""
    return os.environ.get(ENV, "1") != "0" and available()


def cpus_for(placement: cpus.Placement) -> frozenset[int] | None:
    """The CPUs the twin runs on: the fabric's (the agent host's), where ibsim runs beside
    OpenSM too, so that OpenSM's CPU carries OpenSM alone, as a real SM host whose HCA frames and
    carries its SMPs; ``IBEMU_MADTWIN_CPU=sm`` puts it on OpenSM's CPU, to compare. There the
    twin's work (its system calls, and the kernel SMA's run inside each send) took about as
    much of that CPU as OpenSM itself (CPU samples over a reroute). OpenSM's k=8 reroute
    against ibsim's, ``benchmarks/bench_opensm_ibsim.py --twin-cpu both`` (README, issue 17):
    1.01x and 1.27x here against 1.45x and 1.73x on OpenSM's CPU; 1.55x against 1.97x with
    the kernel SMA's walks off."""
    return placement.sm if os.environ.get(CPU_ENV, "fabric") == "sm" else placement.agents


def notice_if_missing() -> None:
    """One line, once per process, when the twin is wanted but not built."""
    global _noticed
    if _noticed or os.environ.get(ENV, "1") == "0" or available():
        return
    _noticed = True
    log.warning("%s is not built (make native): OpenSM's SMPs take the agent host's Python path", BINARY)


def process_name(pid: int) -> str:
    """The command name of process ``pid`` (``/proc/PID/comm``); empty when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Twin:
    """One running ``madtwin serve`` for one slot; ``fwd`` is the agent host's socketpair end
    (non-blocking: read it as the slot's data)."""

    def __init__(self, proc: subprocess.Popen[bytes], fwd: socket.socket, stats: mmap.mmap) -> None:
        self.proc = proc
        self.fwd = fwd
        self._stats = stats
        self._final: dict[str, int] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, data_sock: socket.socket, ns: str | None, ifname: str, peer_mac: bytes, *,
              port: int = 1, timeout_ns: int = 500_000_000,
              cpus: frozenset[int] | None = None) -> Twin:
        """``madtwin`` serving the slot whose server data socket is ``data_sock``, sending on
        ``ifname`` in ``ns`` to the cable's far end ``peer_mac``; ``timeout_ns`` real time."""
        if len(peer_mac) != 6:
            raise ValueError("a MAC address is 6 bytes")
        if not available():
            raise FileNotFoundError(f"{BINARY} is not built (make native)")
        pkt = open_packet_socket(ns, ifname, ETH_P_IB, bpf=TWIN_REPLIES)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        memfd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC)
        try:
            os.ftruncate(memfd, mmap.PAGESIZE)
            stats = mmap.mmap(memfd, mmap.PAGESIZE)
            for s in (ours, theirs):
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _FWD_BUFFER)
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _FWD_BUFFER)
            eth = peer_mac + bytes(pkt.getsockname()[4]) + ETH_P_IB.to_bytes(2, "big")
            fds = (data_sock.fileno(), theirs.fileno(), pkt.fileno(), memfd)
            argv = [str(BINARY), "serve", f"--data-fd={fds[0]}", f"--fwd-fd={fds[1]}",
                    f"--pkt-fd={fds[2]}", f"--stats-fd={fds[3]}", f"--eth={eth.hex()}",
                    f"--ifname={ifname}", f"--port={port}", f"--timeout-ns={timeout_ns}"]
            proc = subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            pkt.close()
            os.close(memfd)
        if cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(proc.pid, cpus)
        ours.setblocking(False)
        log.info("madtwin %d serves the MAD-socket slot on %s/%s", proc.pid, ns or "-", ifname)
        return cls(proc, ours, stats)

    def counters(self) -> dict[str, int]:
        """The twin's counters now (after ``stop``: their last values)."""
        if self._final is not None:
            return dict(self._final)
        return _unpack(self._stats)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> dict[str, int]:
        """End the process (by its PID) and close the socketpair; returns the last counters."""
        if self._final is not None:
            return dict(self._final)
        self.fwd.close()  # end of file: the program returns by itself
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(2)
        self._final = self.counters() if not self._stats.closed else dict.fromkeys(COUNTERS, 0)
        self._final["pending"] = 0
        log.info("madtwin %d ended: %s", self.pid, self._final)
        self._stats.close()
        return dict(self._final)


def _unpack(buf: bytes | mmap.mmap) -> dict[str, int]:
    magic, _pid, *values = _STATS.unpack_from(buf, 0)
    if magic != STATS_MAGIC:  # not started yet
        return dict.fromkeys(COUNTERS, 0)
    return dict(zip(COUNTERS, values, strict=True))


def read_counters(pid: int) -> dict[str, int]:
    """The counters of the running twin ``pid``, from outside its agent host (root: through
    ``/proc/PID/fd``, the memfd it maps); ``ProcessLookupError`` when there is none."""
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        for fd in fd_dir.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(f"/memfd:{MEMFD_NAME}"):
                    return _unpack(fd.read_bytes()[:_STATS.size])
    except OSError:
        pass
    raise ProcessLookupError(f"no madtwin with pid {pid}")


def run_test_mode(mode: str, data: bytes, *, port: int = 1, timeout_s: float = 30.0) -> list[str]:
    """``madtwin frame|reply`` over ``data`` (stdin): its output lines (hex or ``-``)."""
    if mode not in ("frame", "reply"):
        raise ValueError(f"test mode {mode!r}: frame or reply")
    out = subprocess.run([str(BINARY), mode, f"--port={port}"], input=data, capture_output=True,
                         timeout=timeout_s, check=True)
    return out.stdout.decode().splitlines()
