"""How many frame-hops per second the user datapath sustains on this machine (for ``dilation: auto``).

The measurement runs the user datapath's per-frame work in isolation, in this process, for
``SECONDS`` (the best of ``ROUNDS`` rounds: the machine is shared, and the figure wanted is the
datapath's speed when it has a core): what ``AgentHost._user_switch_reader`` does for each frame (``recv`` from a
socket, the switch's ``Forwarder.decide`` with its VCRC check, LFT lookup and counters, the
egress Ethernet header prepended, the link model's work for the frame: ``fabric.linkplane``
puts it into ``physics.live.LivePlane`` and takes it out when due, when ``physics``: the IB
user datapath's case; RoCE and the kernel datapath are measured without it, ``send``). A fixed population of frames circulates between
two datagram socket pairs, so every ``recv`` + ``decide`` + ``send`` is one frame-hop and
nothing else is timed. Deviations from a live fabric: Unix datagram sockets instead of
packet sockets on veths (no veth transmit), one process alone on its core (a run shares the
cores: ``ibemu.scenario.autodilation.HEADROOM`` discounts for that), no trio wake-ups (the
reader drains up to a batch per wake-up). It needs no root and no namespaces.

The result is cached in ``cache_path()`` (``IBEMU_CALIBRATION``, else ``calibration.json`` in
ibemu's state directory, ``/run/ibemu``: per machine and per boot), keyed by ibemu's version,
the datapath, the frame size and the machine (CPU model and count); ``--recalibrate`` style
callers pass ``refresh=True``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ibemu.agents.forwarder import Forwarder
from ibemu.agents.lft import Lft
from ibemu.agents.port import PhysState, Port, PortState
from ibemu.kernel import cpus, ownership
from ibemu.physics.link import SWITCH_MODELS
from ibemu.physics.live import LivePlane
from ibemu.physics.model import Frame
from ibemu.physics.plan import build_nodes
from ibemu.topo import generate
from ibemu.wire import fast

SECONDS = 1.0
POPULATION = 16
ROUNDS = 3
"""Frames in flight around the two socket pairs (a batch per wake-up, as a busy port has)."""
DATAPATH = "ib-user"
"""The cache key's datapath; with the link model (the IB user datapath's switches),
``ib-user-physics``: the model costs several times the rest of a frame-hop."""


@dataclass(frozen=True, slots=True)
class Calibration:
    frame_hops_per_s: float
    frame_bytes: int
    key: str
    cached: bool
    measured_at: str

    physics: bool = False

    def note(self) -> str:
        how = "cached" if self.cached else "measured"
        return f"{_datapath(self.physics)} datapath, {self.frame_bytes} B frames, {how} {self.measured_at}"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ibemu")
    except Exception:  # not installed as a distribution (a source checkout)
        return "source"


def _machine() -> str:
    return f"{platform.machine()} {cpus.model()} x{os.cpu_count()}"


def _datapath(physics: bool) -> str:
    # "8vl": measured with eight VLs operated (a cached figure from one VL is not reused)
    return f"{DATAPATH}-physics-8vl" if physics else DATAPATH


def cache_key(frame_bytes: int, physics: bool = False) -> str:
    return f"ibemu {_version()} | {_datapath(physics)} | {frame_bytes} B | {_machine()}"


def cache_path() -> Path:
    env = os.environ.get("IBEMU_CALIBRATION")
    return Path(env) if env else ownership.STATE_DIR / "calibration.json"


def measure(frame_bytes: int = 1024, seconds: float = SECONDS, *, physics: bool = False) -> float:
    """Frame-hops/s of the user datapath's per-frame work here (see the module docstring)."""
    up = {"state": PortState.ACTIVE, "phys": PhysState.LINK_UP}
    ports = {0: Port(0, is_switch=True, lid=1, **up),  # type: ignore[arg-type]
             1: Port(1, is_switch=True, **up),  # type: ignore[arg-type]
             2: Port(2, is_switch=True, **up)}  # type: ignore[arg-type]
    lft = Lft()
    block = bytearray([0xFF] * 64)
    block[2] = 2  # DLID 2 leaves on port 2
    lft.set_block(0, bytes(block))
    lft.top = 63  # LinearFDBTop, as an SM sets it
    decide = Forwarder(lft, ports).decide
    # eight data VLs, as the agents' ports operate them from the start (OperationalVLs = VLCap)
    plane = LivePlane(build_nodes(generate("single-switch", hosts=2), kind="ib", switch=SWITCH_MODELS["ib-edr"],
                                  data_vls=8))
    arrive, run = plane.arrive, plane.run
    eth = fast.ethernet_header(b"\x02\0\0\0\0\x01", b"\x02\0\0\0\0\x02")
    payload = max(0, frame_bytes - fast_overhead())
    frame = fast.NativeTemplate(slid=3, dlid=2, destqp=0x11, eth=eth).packet(
        0x0A, 0, b"\0" * payload, ext=fast.reth(0, 0, payload))
    eth_len = len(eth)
    a = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for s in (*a, *b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 21)
        s.setblocking(False)
    try:
        for _ in range(POPULATION):
            a[0].send(frame)
        # hop: recv on one pair's far end, forward onto the other pair, and back
        legs = ((a[1], b[0]), (b[1], a[0]))
        best = 0.0
        now = 0
        step = 1_000_000  # each frame through an idle switch: the same model events as in a flow
        for _ in range(ROUNDS):  # the best round: the datapath's speed when it has a core
            hops = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds / ROUNDS
            while True:
                for rx, tx in legs:
                    for _ in range(POPULATION):
                        f = rx.recv(9216)
                        verdict = decide(f[eth_len:], 1)
                        if not verdict.port:
                            raise RuntimeError(f"calibration frame not forwarded: {verdict.reason}")
                        if not physics:
                            tx.send(eth + verdict.packet)
                            continue
                        now += step
                        arrive("sw0", 1, Frame(len(f) - eth_len, dst=2, flow=f[16:34], meta=f), now)
                        for d in run(now + step):  # its departure (due a hop later) at once
                            tx.send(eth + d.frame.meta[eth_len:])
                    hops += POPULATION
                t1 = time.perf_counter()
                if t1 >= deadline:
                    break
            best = max(best, hops / (t1 - t0))
        return best
    finally:
        for s in (*a, *b):
            s.close()


def fast_overhead() -> int:
    """Bytes of a data frame besides its payload (Ethernet, LRH, BTH, RETH, ICRC, VCRC)."""
    eth = fast.ethernet_header(b"\x02\0\0\0\0\x01", b"\x02\0\0\0\0\x02")
    return len(fast.NativeTemplate(slid=3, dlid=2, destqp=0x11, eth=eth).packet(0x0A, 0, b"", ext=fast.reth(0, 0, 0)))


def calibration(frame_bytes: int = 1024, *, refresh: bool = False, seconds: float = SECONDS,
                physics: bool = False) -> Calibration:
    """The cached calibration for ``frame_bytes`` frames, else a new measurement (cached);
    ``physics``: with the link model's work (the IB user datapath)."""
    frame_bytes = max(256, min(4096 + 64, int(frame_bytes)))
    key = cache_key(frame_bytes, physics)
    path = cache_path()
    cache: dict[str, dict[str, object]] = {}
    try:
        loaded = json.loads(path.read_text())
        if isinstance(loaded, dict):
            cache = loaded
    except (OSError, ValueError):
        pass
    hit = cache.get(key)
    if not refresh and isinstance(hit, dict) and isinstance(hit.get("frame_hops_per_s"), (int, float)):
        return Calibration(float(hit["frame_hops_per_s"]), frame_bytes, key, True,  # type: ignore[arg-type]
                           str(hit.get("measured_at", "?")), physics)
    rate = measure(frame_bytes, seconds, physics=physics)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    cache[key] = {"frame_hops_per_s": rate, "measured_at": stamp, "seconds": seconds}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass  # not cached: measured again next time
    return Calibration(rate, frame_bytes, key, False, stamp, physics)
