"""The device firmware's management hot path in the kernel: one eBPF SMA for every node.

``bpf_src/sma.c`` (C, built with clang ``-target bpf`` and loaded by ``ibemu.kernel.elf``) is
a direct-action tc classifier on each switch's shared tc block (after the LFT classifier,
where the DR relay of ``dr_relay`` was) and on the ingress of each CA port (the HCA's veth in
the host's namespace, clsact created here). It subsumes the DR relay: at an intermediate
hop it relays a directed-route SMP both ways exactly as ``dr_relay`` did; at the last hop
(D=0, hp == HopCount, DrDLID permissive), or LID-routed to the port's LID, it answers
SubnGet(NodeDescription, NodeInfo, SwitchInfo, PortInfo, P_KeyTable,
LinearForwardingTable) and SubnSet(LinearForwardingTable), out of the ingress port (DR,
C14-13: D=1, hp = n, ReturnPath[n] = ingress) or by the LFT to the request's SLID
(LID-routed), with ICRC and VCRC recomputed: byte for byte what ``ibemu.agents`` answers
(``tests/integration/test_sma_bpf.py`` proves it on generated SMPs).

CRC work. A frame the program answers, relays or forwards gets the strict check of both
incoming CRCs (a failure goes up to the agent, which counts and drops it); a frame it hands
up unchanged gets none, since its receiver checks it anyway (``DeviceAgent.receive``; ibemu's
SM on its own port, ``sm.directport``): a CA port's every GetResp costs no CRC pass here. An
answer is resealed in full; a relay, which changes at most SLID, HopPointer and one
ReturnPath byte, patches the checked CRCs by table (``sma_rdelta``, :func:`relay_deltas`: the
CRCs of a fixed-length frame are linear in its bytes). Two CRC passes a relay instead of
four: ~0.8 us against ~1.1 us of BPF_PROG_TEST_RUN time (hand timing, README issue 17).

One device state. The answers come from maps the Python agent publishes
(``publish``/``DeviceAgent.sma_images``): ``sma_attr`` (dev, attribute, modifier) -> the 64
data bytes the agent's own Get handler produces (NodeInfo per ingress port; PortInfo per
port, LocalPortNum patched per ingress in the kernel; P_KeyTable per port and block). The
raw LFT of every switch is one mmapped array (``sma_lft``): the agent's ``Lft`` stores its
table *in* it (``Lft.bind``), so an LFT Set answered by the kernel is what the agent reads
at once, and the other way round. A kernel LFT Set also writes the switch's forwarding map
(``ibemu_lft`` of ``lft_map``, reached through the map of maps ``sma_fwd``) with the
entries up to LinearFDBTop, as ``LftUpdate`` would have.

LID-routed SMPs in transit. The LFT classifier of a switch (``lft_map``) redirects a frame
with the Ethernet header it came with; a port is known here by the MAC a frame is sent to
(ifindexes repeat across namespaces, and ``bpf_get_netns_cookie`` of a tc skb names the
sending socket's namespace, not the receiver's). So where this program runs, the LFT
classifier leaves VL15 to it (``MapLft.set_vl15_to_sma``) and it forwards LID-routed SMPs
itself, by the same LFT, as ``Forwarder.route`` does for VL15, with each cable's addresses:
every SMP reaches the next node addressed to the port it arrives on.

Directed-route walks. A DR SMP costs a program run and a veth crossing at every hop, both
ways: some 2-3 us of kernel time a hop (README, issue 17), on the CPU that sent it (the hop-by-hop chain runs inside
the sender's ``send``). Where the switch that relays an outward SMP first can tell that every
hop after it would relay it, and the last answer it, in the kernel, it does it all in that one
run (``walk`` in ``sma.c``): it follows the cables through the maps (``sma_out``'s far-end MAC
-> ``sma_ports`` -> the next device), checks at each hop what that hop's run would check (its
node enabled, the arriving port's link up, the relay's egress port up with carrier, InitialPath
within the switch's ports, a switch where it relays), checks the last hop's SMA answers it
(DrDLID permissive, ``answerable``, the attribute's image), applies an LFT Set there, and sends
the answer back out of its own ingress port: ReturnPath[hp..n] the ingress ports, HopPointer as
it arrived, both LIDs permissive, D=1, the CRCs recomputed, byte for byte what the hops would
have sent (``tests/integration/test_sma_walk.py`` proves it against a chain of Python agents).
Anything a hop would hand up, a path longer than ``WALK_MAX`` (8) hops, or a cable without a
walk slot, and the walk gives up before it has changed anything: the SMP is relayed one hop, as
before. OpenSM's k=8 reroute against ibsim's went from 1.55x to 1.01x and 1.27x with walks (the
twin on the fabric's CPU, ``madtwin.cpus_for``), from 1.97x to 1.45x and 1.73x with the twin
on OpenSM's CPU (README, issue 17). ``IBEMU_SMA_WALK=0`` turns walks off; where the
verifier refuses the program (its bounded loops need a kernel from 5.3), ``load`` says so in one
line and loads it built without them.

Fault notices (ibemu's vendor Trap FaultNotice 0xFF32, one hop, at a switch): after the same
checks the program tail-calls the notice programs (``sma_tail``, ``kernel.notice``), which
handle the notice in the kernel as the switch agent would and log it for the agent; where
they are not loaded, or decline (notices off, a port not facing a switch), the notice goes
up to the agent as before.

Everything else goes up to the agent unchanged (TC_ACT_UNSPEC): PortInfo/SwitchInfo/P_Key
Sets and every other attribute or method, traps, responses, PMA, LID-routed heads and tails
of DR SMPs, permissive-DLID LID-routed SMPs, bad versions, modifiers the maps lack (the
agent answers them with its error status), a failed CRC or any malformed frame (the agent
counts it), a port whose link the agent has not seen up, a disabled node.

Order. A switch routes a LID-routed response by its LFT after the attribute's handler ran
(an LFT Set may change the route back to the requester), as the agent does; without a route
then, the frame goes up and the agent repeats the (idempotent) Set and drops the response as
it would have. The agent host republishes before it sends the agent's response
(``AgentHost._serve_batch``: a batch of Sets' images with one ``BPF_MAP_UPDATE_BATCH``,
``publish_many``, then their responses), so an SM never reads an old state back from the
kernel.

Deviations (documented, deliberate):
- Kernel-answered SMPs are not in the agent's ``stats`` and produce no per-SMP events; in
  the PortCounters they count like every frame the kernel moves, from the interface
  statistics (``PortCounters.follow_link``).
- A kernel LFT Set that changed its block writes one record to the ring buffer ``sma_log``
  (:class:`SmaLog`: device, block, raw entries changed, and ``bpf_ktime_get_ns()`` taken
  after the forwarding map has the block, before the response leaves). The agent host turns
  each into the ``lft_set`` and ``lft_programmed`` events the agent and ``_program`` would
  have written, stamped with the kernel's time (late in the log, never late in time).
  ``changed`` counts the entries that changed up to LinearFDBTop, as the agent's
  ``Lft.set_block``; a Set that changes none logs nothing, as in the agent.
- M_Key: the kernel answers only SMPs that pass the agent's M_Key check without a
  decision: the port (a switch's port 0, a CA's ingress port) has M_Key 0, or the SMP carries
  it, and no lease countdown runs (``DeviceAgent.mkey_guard``, published under the private
  key ``(0x10015, port)`` with the PortInfo images). Everything else goes to the agent, which
  answers (protect bits 0/1 Gets, the key hidden at 1) or drops, counts, traps and starts the
  lease; it republishes the guard before anything it sends (``MKeyChange``), so the kernel
  never answers what the agent would refuse. Relayed and forwarded SMPs are not checked (only
  the addressed SMA checks its key). Cost: one hash lookup more per answered SMP.
- The node is enabled per node, like the DR relay: powered off or with an SMP-loss fault,
  everything goes to its agent (``set_enabled``).
- A walk crosses the cables between its first and last hop without frames. Their ends count
  it all the same: ``sma_vcnt`` (per port, by its ``out_val.slot``) has the frames each end
  would have sent and received, which the agent host adds to the interface's own totals
  (``walked``, ``PortCounters.follow_link``). A capture of a cable would not see them, so a
  cable ibemu captures (``--capture``, a scenario's ``record.capture``) is kept on the wire
  (``keep_on_wire``: no walk crosses it, both ends). A capture ibemu did not start (a
  ``tcpdump`` in a switch's namespace) is not looked for: the user datapath's way
  (``LiveLinks.check_captures``, every namespace five times a second) would put that cost on
  the agents' CPU, beside the SMPs' own; ``IBEMU_SMA_WALK=0`` shows every hop. A walk
  reads a port's carrier from ``sma_out``, which ibemu's own cuts write before the interface
  goes down (``AgentHost.set_ports``); a link set down by something else is seen when the
  kernel's notification reaches the carrier thread, and until then a walk may cross it where a
  frame would have been dropped.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import logging
import mmap
import os
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ibemu.kernel import bpf, clsact, elf, lft_map, notice
from ibemu.kernel.commands import KernelError
from ibemu.kernel.dr_relay import (
    CRC16_TABLE,
    CRC32_TABLE,
    egress_key,
    port_key,
    port_value,
)
from ibemu.kernel.dr_relay import egress_value as dr_egress_value
from ibemu.kernel.packet import ETH_P_IB
from ibemu.kernel.tc_netlink import BlockFilters
from ibemu.wire.madpacket import MAD_OFFSET, reseal

log = logging.getLogger(__name__)

SRC = os.path.join(os.path.dirname(__file__), "bpf_src", "sma.c")
LFT_BLOCKS = 768
LFT_SLOT = LFT_BLOCKS * 64
PROG_NAME = "ibemu_sma"
WALK_ENV = "IBEMU_SMA_WALK"
VCNT_SLOTS = 65536
"""``sma_vcnt``'s size: ports with a walk slot (slot 0 is none)."""

_DEV = struct.Struct("=IHBB")
_LOG_REC = struct.Struct("=QIHH")
_ATTR_KEY = struct.Struct("=III")


RELAY_BYTES = (6, 7, MAD_OFFSET + 6, *range(MAD_OFFSET + 192, MAD_OFFSET + 256))
"""The bytes a directed-route relay may change (SLID, HopPointer, ReturnPath[0..63]), in the
order of ``sma_rdelta``'s slots (sma.c's RD_*)."""


def relay_deltas(at: tuple[int, ...] = RELAY_BYTES) -> list[tuple[int, int]]:
    """``sma_rdelta``: per slot (a byte of ``at``, offsets in LRH .. VCRC) and per value x of
    that byte's old XOR new, the (ICRC, VCRC) to XOR into a management packet's (290 bytes)
    CRCs, the VCRC's part taking in the ICRC's change. CRCs of equal lengths are linear: the
    change is the packet with x there XOR the packet with 0 there, and that of x the XOR of
    its bits' changes (8 reseals a slot)."""
    base = bytearray(290)
    base[0], base[1] = 0xF0, 0x02
    zero = reseal(bytearray(base))
    z_ic, z_vc = int.from_bytes(zero[-6:-2], "little"), int.from_bytes(zero[-2:], "little")
    out: list[tuple[int, int]] = []
    for off in at:
        bits = []
        for b in range(8):
            pkt = bytearray(base)
            pkt[off] = 1 << b
            sealed = reseal(pkt)
            bits.append((int.from_bytes(sealed[-6:-2], "little") ^ z_ic, int.from_bytes(sealed[-2:], "little") ^ z_vc))
        for x in range(256):
            ic = vc = 0
            for b in range(8):
                if x >> b & 1:
                    ic ^= bits[b][0]
                    vc ^= bits[b][1]
            out.append((ic, vc))
    return out


def egress_value(ifindex: int, up: bool, peer_mac: bytes, own_mac: bytes, slot: int = 0) -> bytes:
    """An ``sma_out`` value (frame.h's ``struct out_val``): the DR relay's, and the port's walk
    slot (0: none)."""
    return dr_egress_value(ifindex, up, peer_mac, own_mac) + struct.pack("=I", slot)


def walk_enabled() -> bool:
    """Directed-route walks unless ``IBEMU_SMA_WALK=0`` (to compare, or to see every relayed SMP
    on every cable)."""
    return os.environ.get(WALK_ENV, "1") != "0"


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ibemu", "bpf")


def clang_argv(src: str, out: str, defines: tuple[str, ...] = ()) -> list[str]:
    clang = shutil.which("clang") or "clang"
    multiarch = f"/usr/include/{os.uname().machine}-linux-gnu"
    return [clang, "-O2", "-g0", "-target", "bpf", "-I/usr/include", f"-I{multiarch}", "-Wall",
            *(f"-D{d}" for d in defines), "-c", src, "-o", out]


def object_path(src: str = SRC, defines: tuple[str, ...] = ()) -> tuple[str | None, str]:
    """The compiled object for ``src`` (built next to it by ``make bpf``, else in the user's
    cache, compiled there on first use; with ``defines``, always the cache's): (path or None,
    why not)."""
    inputs = [src, *sorted(glob.glob(os.path.join(os.path.dirname(src), "*.h")))]  # and what it includes
    try:
        h = hashlib.sha256(" ".join(defines).encode())
        for path in inputs:
            with open(path, "rb") as f:
                h.update(f.read())
        digest = h.hexdigest()[:16]
        newest = max(os.path.getmtime(path) for path in inputs)
    except OSError as exc:
        return None, f"no source {src}: {exc}"
    beside = os.path.splitext(src)[0] + ".o"
    if not defines and os.path.exists(beside) and os.path.getmtime(beside) >= newest:
        return beside, ""
    cached = os.path.join(_cache_dir(), f"{os.path.basename(src)[:-2]}-{digest}.o")
    if os.path.exists(cached):
        return cached, ""
    if shutil.which("clang") is None:
        return None, "clang is not installed (scripts/setup.sh installs it)"
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    tmp = f"{cached}.{os.getpid()}.tmp"
    proc = subprocess.run(clang_argv(src, tmp, defines), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None, f"clang failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}"
    os.replace(tmp, cached)
    return cached, ""


def load(*, lft_slots: int, attr_entries: int = 131072) -> KernelSma:
    """The kernel SMA, with directed-route walks unless ``IBEMU_SMA_WALK=0`` (then no port gets
    a walk slot). Where the verifier refuses the program (its walk's bounded loops need a
    kernel from 5.3), one line says so and the program built without walks (``-DNO_WALK``) is
    loaded: SMPs then cross every cable. Raises what ``KernelSma`` raises when neither loads."""
    walk = walk_enabled()
    try:
        return KernelSma(lft_slots=lft_slots, attr_entries=attr_entries, walk=walk)
    except elf.LoadError as exc:
        if not walk:
            raise
        log.warning("directed-route SMPs are relayed hop by hop (no walks): eBPF program %s rejected (%s)\n%s",
                    exc.name, exc.reason, exc.tail)
    path, why = object_path(SRC, ("NO_WALK",))
    if path is None:
        raise KernelError(why)
    return KernelSma(lft_slots=lft_slots, attr_entries=attr_entries, obj_path=path, walk=False)


@dataclass(frozen=True, slots=True)
class LftSetRecord:
    """One kernel-answered LFT block Set that changed the block (``sma_log``)."""

    t_ns: int
    """``CLOCK_MONOTONIC`` (real) when the switch's forwarding map had the block."""
    dev: int
    block: int
    changed: int


class SmaLog(bpf.RecordRing[LftSetRecord]):
    """The agent host's reader of ``sma_log``: ``fd`` polls readable when records wait."""

    def __init__(self, ring: bpf.Map) -> None:
        super().__init__(ring, _LOG_REC.size, lambda raw: LftSetRecord(*_LOG_REC.unpack_from(raw)))


def alt_template() -> bpf.Map:
    """A map shaped like every switch's alternates (``lft_map``'s ``ibemu_lft_alt``), for
    ``sma_alt``."""
    return bpf.Map(bpf.BPF_MAP_TYPE_HASH, 4, lft_map.ALT_VALUE, lft_map.N_BLOCKS, "ibemu_alt_tmpl",
                   flags=bpf.BPF_F_NO_PREALLOC)


def lft_template() -> bpf.Map:
    """A map shaped like every switch's forwarding map (``lft_map``), for ``sma_fwd``."""
    return bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, 64, LFT_BLOCKS, "ibemu_lft_tmpl", flags=bpf.BPF_F_MMAPABLE)


class KernelSma:
    """The loaded program and its maps (see the module docstring). ``lft_slots``: how many
    switches keep their raw LFT in ``sma_lft``."""

    def __init__(self, *, lft_slots: int, attr_entries: int = 131072, obj_path: str | None = None,
                 notices: bool = True, walk: bool | None = None) -> None:
        self.walk = walk_enabled() if walk is None else walk
        """Directed-route walks (the module docstring): every port added gets a walk slot."""
        path = obj_path
        if path is None:
            path, why = object_path()
            if path is None:
                raise KernelError(why)
        with open(path, "rb") as f:
            obj = elf.parse(f.read())
        self._template = lft_template()
        self.fwd = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 16384, "sma_fwd",
                           inner_map_fd=self._template.fd)
        self._alt_template = alt_template()
        self.alt = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 16384, "sma_alt",
                           inner_map_fd=self._alt_template.fd)
        self.tail = bpf.Map(bpf.BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 2, "sma_tail")
        self.notices: elf.Loaded | None = None
        self.notices_tx: elf.Loaded | None = None
        self.notice_log: notice.NoticeLog | None = None
        self.lft = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, 64, max(1, lft_slots) * LFT_BLOCKS, "sma_lft",
                           flags=bpf.BPF_F_MMAPABLE)
        self._mm: mmap.mmap | None = None
        self.loaded: elf.Loaded | None = None
        self.lft_log: SmaLog | None = None
        try:
            self._mm = mmap.mmap(self.lft.fd, self.lft.max_entries * 64, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
            self.loaded = elf.load(obj, maps={"sma_fwd": self.fwd, "sma_lft": self.lft, "sma_tail": self.tail},
                                   sizes={"sma_attr": attr_entries})
        except BaseException:
            self.close()
            raise
        m = self.loaded.maps
        self.ports, self.out, self.dev, self.attr = m["sma_ports"], m["sma_out"], m["sma_dev"], m["sma_attr"]
        m["sma_crc"].update(b"\0\0\0\0", bpf.pack_u32s(bpf.crc_slices(CRC32_TABLE))
                            + bpf.pack_u32s(bpf.crc_slices(CRC16_TABLE)))
        m["sma_rdelta"].update_many([(struct.pack("=I", i), struct.pack("=II", ic, vc))
                                     for i, (ic, vc) in enumerate(relay_deltas())])
        if notices:
            self._load_notices(m)
        try:
            self.lft_log = SmaLog(m["sma_log"])
        except BaseException:
            self.close()
            raise
        self.prog_fd = self.loaded.prog_fd
        self.lft_slots = max(1, lft_slots)
        self._published: dict[tuple[int, int, int], bytes] = {}
        self._in: dict[tuple[int, int], tuple[bytes, int]] = {}
        self._outs: dict[tuple[int, int], tuple[int, bytes, bytes]] = {}
        self._enabled: dict[int, bool] = {}
        self._slots: dict[tuple[int, int], int] = {}
        self._up: dict[tuple[int, int], bool] = {}
        self._wire: set[tuple[int, int]] = set()
        self._out_lock = threading.Lock()  # the carrier thread and a capture's both write sma_out
        self.vcnt = m["sma_vcnt"]

    def _load_notices(self, m: Mapping[str, bpf.Map]) -> None:
        """The fault notice programs (``kernel.notice``), sharing the SMA's maps, into
        ``sma_tail``. Where they cannot load, notices stay with the agents (logged once)."""
        paths = [object_path(src) for src in (notice.SRC, notice.TX_SRC)]
        why = next((w for path, w in paths if path is None), None)
        if why is not None:
            log.warning("fault notices are handled by the Python agents only: %s", why)
            return
        shared = {name: m[name] for name in ("sma_out", "sma_dev", "sma_attr", "sma_crc")}
        shared.update({"sma_lft": self.lft, "sma_fwd": self.fwd, "sma_alt": self.alt, "sma_tail": self.tail})
        try:
            with open(str(paths[1][0]), "rb") as f:
                self.notices_tx = elf.load(elf.parse(f.read()), maps=shared)
            deltas = notice.crc_deltas()
            self.notices_tx.maps["sma_ndelta"].update_many(
                [(struct.pack("=I", v), deltas[v * 8:v * 8 + 8]) for v in range(256)])
            with open(str(paths[0][0]), "rb") as f:
                self.notices = elf.load(elf.parse(f.read()), maps=shared)
            self.notice_log = notice.NoticeLog(self.notices.maps["sma_nlog"])
            self.tail.update(struct.pack("=I", 1), struct.pack("=I", self.notices_tx.prog_fd))
            self.tail.update(struct.pack("=I", 0), struct.pack("=I", self.notices.prog_fd))
        except elf.LoadError as exc:
            log.warning("fault notices are handled by the Python agents only: eBPF program %s rejected (%s)\n%s",
                        exc.name, exc.reason, exc.tail)
            self._close_notices()
        except (OSError, KernelError) as exc:
            log.warning("fault notices are handled by the Python agents only: %s", exc)
            self._close_notices()

    def _close_notices(self) -> None:
        with contextlib.suppress(OSError):
            self.tail.delete(struct.pack("=I", 0))
        if self.notice_log is not None:
            self.notice_log.close()
            self.notice_log = None
        for loaded in (self.notices, self.notices_tx):
            if loaded is not None:
                loaded.close()
        self.notices = self.notices_tx = None

    # ------------------------------------------------------------------ devices

    def add_device(self, dev: int, *, is_switch: bool, num_ports: int, lft_slot: int | None = None,
                   lft_blocks: int = 0, fwd_map_fd: int | None = None, alt_map_fd: int | None = None) -> None:
        """Device ``dev`` (1 .. 16383). A switch with ``lft_slot`` keeps its raw LFT in the
        shared array (``lft_view``); with ``fwd_map_fd`` (its ``ibemu_lft`` map) the kernel
        answers LFT Sets too."""
        if not 0 < dev < 16384:
            raise ValueError(f"device number {dev} out of range")
        base = 0
        if lft_slot is not None:
            if not 0 <= lft_slot < self.lft_slots:
                raise ValueError(f"LFT slot {lft_slot} out of range")
            base = lft_slot * LFT_BLOCKS
        else:
            lft_blocks = 0
        if fwd_map_fd is not None and lft_blocks:
            try:
                self.fwd.update(struct.pack("=I", dev), struct.pack("=I", fwd_map_fd))
            except OSError as exc:  # a forwarding map of another shape: LFT Sets stay in Python
                log.debug("device %d: no kernel LFT Set: %s", dev, exc)
        if alt_map_fd is not None and lft_blocks:
            try:  # fault notices in the kernel (``kernel.notice``) read the alternates there
                self.alt.update(struct.pack("=I", dev), struct.pack("=I", alt_map_fd))
            except OSError as exc:
                log.debug("device %d: no alternates for the notice program: %s", dev, exc)
        self.dev.update(struct.pack("=I", dev), _DEV.pack(base, lft_blocks, int(is_switch), num_ports))

    def lft_view(self, slot: int) -> memoryview:
        """The raw LFT of the switch in ``slot``: 49,152 bytes shared with the kernel."""
        if self._mm is None or not 0 <= slot < self.lft_slots:
            raise ValueError(f"no LFT slot {slot}")
        return memoryview(self._mm)[slot * LFT_SLOT:(slot + 1) * LFT_SLOT]

    def publish(self, dev: int, images: Mapping[tuple[int, int], bytes]) -> int:
        """Write the attribute images that changed; returns how many changed."""
        return self.publish_many([(dev, images)])

    def publish_many(self, images: Iterable[tuple[int, Mapping[tuple[int, int], bytes]]]) -> int:
        """``publish`` for several devices (``(dev, images)`` each), every changed image
        written with one system call (``Map.update_many``); returns how many changed."""
        changed: dict[tuple[int, int, int], bytes] = {}
        published = self._published
        for dev, imgs in images:
            for (attr, mod), data in imgs.items():
                key = (dev, attr, mod)
                if published.get(key) != data:
                    changed[key] = data
        if changed:
            self.attr.update_many([(_ATTR_KEY.pack(*key), data) for key, data in changed.items()])
            published.update(changed)
        return len(changed)

    def forget(self, dev: int) -> None:
        """Remove every image of ``dev`` (a rebooted device publishes afresh)."""
        for key in [k for k in self._published if k[0] == dev]:
            self.attr.delete(_ATTR_KEY.pack(*key))
            del self._published[key]

    # ------------------------------------------------------------------ ports

    def add_port(self, dev: int, port: int, ifindex: int, mac: bytes, peer_mac: bytes, *, up: bool,
                 enabled: bool = True) -> None:
        self._in[(dev, port)] = (port_key(mac), ifindex)
        self._outs[(dev, port)] = (ifindex, peer_mac, mac)
        self._enabled.setdefault(dev, enabled)
        if self.walk and (dev, port) not in self._slots and len(self._slots) < VCNT_SLOTS - 1:
            self._slots[(dev, port)] = len(self._slots) + 1
        self.ports.update(port_key(mac), port_value(ifindex, dev, port, self._enabled[dev]))
        with self._out_lock:
            self._up[(dev, port)] = up
            self._write_out(dev, port)

    def _write_out(self, dev: int, port: int) -> None:
        ifindex, peer_mac, mac = self._outs[(dev, port)]
        slot = 0 if (dev, port) in self._wire else self._slots.get((dev, port), 0)
        self.out.update(egress_key(dev, port), egress_value(ifindex, self._up[(dev, port)], peer_mac, mac, slot))

    def set_carrier(self, dev: int, port: int, up: bool) -> None:
        with self._out_lock:
            if (dev, port) in self._outs:
                self._up[(dev, port)] = up
                self._write_out(dev, port)

    def keep_on_wire(self, dev: int, port: int) -> None:
        """No walk crosses this port's cable from now on: every SMP relayed over it crosses it
        as a frame (a capture of the cable sees it). Its far end must be kept so too."""
        with self._out_lock:
            self._wire.add((dev, port))
            if (dev, port) in self._outs:
                self._write_out(dev, port)

    def walked(self, dev: int, port: int) -> tuple[int, int]:
        """(frames sent, frames received) that walks moved across this port's cable without the
        cable (each ``dr_relay.FRAME_LEN`` bytes on the wire, Ethernet header included), since it was
        added: what its interface's own statistics lack."""
        slot = self._slots.get((dev, port))
        if not slot:
            return 0, 0
        raw = self.vcnt.lookup(struct.pack("=I", slot))
        return struct.unpack("=QQ", raw) if raw is not None else (0, 0)

    def set_enabled(self, dev: int, enabled: bool) -> None:
        """Answer and relay this node's SMPs in the kernel (True) or hand them all to its agent."""
        if self._enabled.get(dev) == enabled:
            return
        self._enabled[dev] = enabled
        for (d, port), (key, ifindex) in self._in.items():
            if d == dev:
                self.ports.update(key, port_value(ifindex, d, port, enabled))

    # ------------------------------------------------------------------ attach

    def attach_switch(self, ns: str, prio: int) -> None:
        """On a switch's tc block, after the LFT classifier, replacing the DR rule (as
        ``DrRelay.attach``). Blocking: enters ``ns``."""
        filters = BlockFilters(ns, block=1, prio=prio, protocol=ETH_P_IB)
        try:
            filters.replace_dr_rule_with_bpf(self.prog_fd, name=PROG_NAME, prio=prio + 1)
        finally:
            filters.close()

    def attach_ports(self, ns: str, ifnames: list[str]) -> None:
        """On the ingress of a CA's ports (clsact created here). Blocking: enters ``ns``."""
        hooks = [clsact.BpfHook(name, self.prog_fd) for name in ifnames]
        clsact.attach_bpf(ns, hooks, parent=clsact.INGRESS, prio=1, name=PROG_NAME, what="SMA filter")

    def close(self) -> None:
        """Free the program and maps (filters that use the program keep it alive)."""
        if self.lft_log is not None:
            self.lft_log.close()
            self.lft_log = None
        self._close_notices()
        if self.loaded is not None:
            self.loaded.close()
            self.loaded = None
        if self._mm is not None:
            with contextlib.suppress(BufferError):  # an agent still holds a view: it goes with that
                self._mm.close()
            self._mm = None
        for m in (self.fwd, self.lft, self._template, self.alt, self._alt_template, self.tail):
            m.close()
