"""The kernel forwarding plane of a switch: its LFT in a BPF map, read by one classifier.

Every port of a switch has a clsact qdisc whose ingress is the switch's shared filter block
(block 1, as ``tc.KernelLft`` builds it). In the block:

- prio 1: the u32 rule for directed-route SMPs (VL15 and the permissive DLID) that stops
  classification, until the kernel SMA (``sma``) or, where it cannot load, the DR relay
  (``dr_relay``) replaces it by its own filter at prio 3;
- prio 2: this module's program, a direct-action ``bpf`` filter (``ibemu_lft``) that reads
  the switch's LFT from a BPF array map and redirects a frame to its egress port.

An LFT change is a write into the map, which this process keeps mmapped (an array map with
BPF_F_MMAPABLE): no system call, seen by the next frame; no tc filter is written after bring-up, nothing queues, and there are no mirred actions for the
kernel to walk when the namespaces go.

The program, per frame (``skb->data`` at the Ethernet header; ``bpf_skb_load_bytes`` copies
the Ethernet type and the LRH, so a frame whose LRH is not in the linear part still works):

1. fewer than 14 + 10 bytes, an Ethernet type other than 0x88B5, a DLID of 0xC000 or above
   (multicast; the permissive DLID, so every directed-route SMP), or a PktLen that does not
   say the frame's length (PktLen * 4 + 2 bytes after the Ethernet header) -> TC_ACT_UNSPEC;
2. a VL15 frame while the flags in ``ports[0]`` have FLAG_VL15_TO_SMA (the kernel SMA
   forwards LID-routed SMPs itself, ``set_vl15_to_sma``) -> TC_ACT_UNSPEC;
3. ``port = blocks[DLID >> 6][DLID & 63]``; port 0 (no route, the switch's own LID, LID 0)
   or 0xFF -> TC_ACT_UNSPEC;
4. ``ifindex = ports[port]``; 0 (a port without a cable) -> TC_ACT_UNSPEC;
5. local failover, only when ``ifindex`` carries ``PORT_DOWN`` (the agent host marks a port
   whose carrier went down, ``set_port_up``): the LID's alternates (``alts[DLID >> 6]``,
   4 bytes per LID) are tried in order, the first whose port is cabled and not down wins
   (``stats[STAT_FAILOVER]`` += 1); alternates but none up -> ``stats[STAT_ALL_DOWN]`` += 1
   and TC_ACT_UNSPEC (not forwarded); no alternates for the LID -> ``stats[STAT_DOWN]`` += 1
   and TC_ACT_SHOT: a port without carrier sends nothing. (It used to go to the primary, for
   the veth to drop: but the map says down at the cut, from the loss of signal, while the
   kernel closes the veth only later, after an RCU grace period, and until then the veth
   delivered what the switch sent into the cut cable.) Three unrolled tries: no loop for
   the verifier;
6. ``skb->cb[0] = ifindex``, ``return bpf_redirect(ifindex, 0)``.

Partition enforcement (``ibemu.agents.forwarder``'s rules), only for data frames (not VL15)
and only while ``FLAG_PKEY`` is set in the flags slot (some port of the switch enforces;
otherwise one flag read per data frame is all it costs): before step 3 the ingress port's
entry in ``ibemu_pkey`` (by ``skb->ifindex``) and, at step 6, the egress port's are checked
(PartitionEnforcementInbound/Outbound, FilterRawInbound/Outbound, the P_KeyTable's 32
entries unrolled); a refused frame -> TC_ACT_UNSPEC, up to the switch agent, whose forwarder
refuses it too and counts it (PortRcv/XmitConstraintErrors, P_KeyViolations) and sends trap
257: the kernel never drops, so the counters and traps are the agent's.

TC_ACT_UNSPEC goes on to the next filter (the DR relay) and then up the stack to the switch
agent's packet socket, which answers its own LID and counts the rest as the spec's
PortRcvSwitchRelayErrors or PortRcvErrors, exactly as with the u32 LFT. A redirected frame
leaves unchanged, Ethernet header included, as ``mirred egress redirect`` left it (at tc
ingress both push the Ethernet header back and transmit the frame as received). LID-routed
SMPs (VL15, unicast DLID) are switched like data, as real switches do.

Maps, per switch (so a switch's program reads nothing of another's):

- ``ibemu_lft``: an array of 768 values of 64 bytes, index ``DLID >> 6``: the LFT's blocks
  as SubnSet(LinearForwardingTable) carries them, one egress port number per byte (0 = not
  forwarded). This deviates from one ``DLID -> ifindex`` entry per LID: an array map rounds
  each value up to 8 bytes, so 49,152 ifindexes would pin 384 KB per switch (123 MB for a
  k=16 fat-tree's 320 switches) where the blocks take 48 KB, and a 64-entry Set is one update.
- ``ibemu_lft_port``: an array of 256 u32, index port number -> egress ifindex in the
  switch's namespace (0 = no cable), bit 31 (``PORT_DOWN``) set while the port has no
  carrier (one map write per carrier change);
- ``ibemu_lft_alt``: a hash (no preallocation: only blocks with alternates take memory) of
  64-LID blocks, 4 bytes per LID: up to 3 alternate ports, preferred first, 0 after the
  last (the vendor attribute AlternatePorts writes 16 LIDs of it per SMP,
  ``ibemu.agents.switch.ATTR_ALTERNATES``);
- ``ibemu_lft_stat``: two u64 counters, frames sent to an alternate and frames whose
  primary and alternates were all down;
- ``ibemu_pkey``: a hash, key an ifindex of a port that enforces partitions, value its
  partition bits (u32) and its P_KeyTable's first 32 entries (wire byte order), written by
  ``set_partition`` from the agent's ``PartitionUpdate`` actions.

Deviations from the userspace forwarder (``ibemu.agents.forwarder``), all shared with the u32
LFT this replaces: the VCRC is not checked (the next receiver checks it), port states are
checked only for the egress port's carrier (a frame for a port without carrier is dropped and
counted per switch, ``counters()["down"]``, not in the port's PortXmitDiscards; the ingress
port's state is not checked: a frame a host sends into a cut cable before the kernel has
closed it is forwarded), and an entry
whose egress is the ingress port sends the frame back (a hairpin, as mirred did).
``skb->cb[0]`` (scratch space of tc programs, read by nothing else) holds the target so that
BPF_PROG_TEST_RUN shows where a frame would go.

The maps and the program are file descriptors of the process that built the fabric; the
filter keeps the program (and so the maps) alive until the switch's namespace goes.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
from collections.abc import Mapping

from ibemu.kernel import bpf, rtnl
from ibemu.kernel.bpf import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, Asm
from ibemu.kernel.commands import KernelError
from ibemu.kernel.packet import ETH_P_IB
from ibemu.kernel.tc import BLOCK as TC_BLOCK
from ibemu.kernel.tc import NO_ROUTE
from ibemu.kernel.tc_netlink import BlockFilters

ETH = 14
UNICAST_END = 0xC000
LFT_BLOCK = 64
N_BLOCKS = UNICAST_END // LFT_BLOCK
MAX_PORTS = 256
PRIO = 2
FLAGS_SLOT = 0
"""``ibemu_lft_port[0]``: port 0 is the switch itself (never an egress here), so its slot
holds the classifier's flags."""
FLAG_VL15_TO_SMA = 1
"""The classifier's priority on the block (the DR rule is at 1, the DR relay at 3)."""
PORT_DOWN = 0x80000000
"""In an ``ibemu_lft_port`` value: the port's carrier is down (the ifindex is kept)."""
MAX_ALTERNATES = 3
ALT_SLOT = 4
"""Bytes per LID in ``ibemu_lft_alt``: up to 3 alternate ports, preferred first, 0 after the
last; the fourth byte is 0."""
ALT_VALUE = LFT_BLOCK * ALT_SLOT
ALT_ATTR_LIDS = 16
"""LIDs per vendor SMP block of alternates (``ATTR_ALTERNATES``: 16 x 4 bytes = 64)."""
STAT_FAILOVER = 0
STAT_ALL_DOWN = 1
STAT_DOWN = 2
N_STATS = 3
FN_SKB_LOAD_BYTES = 26
SKB_CB0 = 48

FLAG_PKEY = 2
"""In the flags slot: some port of this switch enforces partitions (``set_partition``): data
frames are checked against ``ibemu_pkey``."""
PKEY_ENTRIES = 32
PKEY_VALUE = 4 + 2 * PKEY_ENTRIES
ENFORCE_IN, ENFORCE_OUT, FILTER_RAW_IN, FILTER_RAW_OUT = 8, 4, 2, 1
_FULL_LE = 0x80
"""The membership bit of a P_Key read as a little-endian u16 from its wire bytes."""
_BASE_LE = 0xFF7F

# stack slots (offsets from r10)
_S_HDR = -16  # Ethernet type (2 bytes) + LRH (8 bytes)
_S_KEY = -24
_S_PK = -32  # the BTH P_Key (wire bytes)
_S_CHK = -40  # data frame on a switch with enforcement: check P_Keys


def _pkey_check(a: Asm, pkey_fd: int, ifindex: int, *, inbound: bool, refused: str) -> None:
    """Partition enforcement of the port ``ifindex`` (a register holding its ifindex) on this
    frame, as ``ibemu.agents.forwarder.pkey_refuses``: jumps to ``refused`` when the port's
    PortInfo bits and P_KeyTable refuse it. Uses R0-R5 and R8."""
    done = a.fresh("pk_ok")
    has_bth = a.fresh("pk_bth")
    a.ldx(4, R2, R10, _S_CHK)
    a.jmp("jeq", R2, 0, done)
    a.stx(4, R10, _S_KEY, ifindex)
    a.map_lookup(pkey_fd, _S_KEY)
    a.jmp("jeq", R0, 0, done)
    a.mov(R8, R0)
    a.ldx(4, R5, R8, 0)  # the port's partition bits
    a.ldx(1, R2, R10, _S_HDR + 3)  # LRH byte 1: LNH in bits 1:0
    a.alu64("and", R2, 3)
    a.jmp("jge", R2, 2, has_bth)
    a.jmp("jset", R5, FILTER_RAW_IN if inbound else FILTER_RAW_OUT, refused)  # a raw packet
    a.goto(done)
    a.label(has_bth)
    a.jmp("jset", R5, ENFORCE_IN if inbound else ENFORCE_OUT, f"{done}_on")
    a.goto(done)
    a.label(f"{done}_on")
    a.movi(R3, ETH + 8 + 2)
    a.jmp("jne", R2, 3, f"{done}_lrh")
    a.movi(R3, ETH + 48 + 2)  # behind a GRH
    a.label(f"{done}_lrh")
    a.mov(R1, R6)
    a.mov(R2, R3)
    a.mov(R3, R10)
    a.alu64("add", R3, _S_PK)
    a.movi(R4, 2)
    a.call(FN_SKB_LOAD_BYTES)
    a.jmp("jne", R0, 0, refused)  # too short for its BTH: no key to admit it by
    a.ldx(2, R2, R10, _S_PK)
    a.mov(R3, R2)
    a.alu64("and", R3, _BASE_LE)
    a.jmp("jeq", R3, 0, refused)
    for i in range(PKEY_ENTRIES):
        nxt = a.fresh("pk_next")
        a.ldx(2, R4, R8, 4 + 2 * i)
        a.mov(R5, R4)
        a.alu64("and", R5, _BASE_LE)
        a.jmp("jne", R5, R3, nxt, reg=True)
        if inbound:  # the claim may not exceed the entry: a full key needs a full entry
            a.jmp("jset", R4, _FULL_LE, done)
            a.jmp("jset", R2, _FULL_LE, nxt)
            a.goto(done)
        else:  # IBA 10.9.3: one of the two a full member
            a.alu64("or", R4, R2, reg=True)
            a.jmp("jset", R4, _FULL_LE, done)
        a.label(nxt)
    a.goto(refused)
    a.label(done)


def program(blocks_fd: int, ports_fd: int, alts_fd: int, stats_fd: int, pkey_fd: int) -> bytes:
    """The classifier, bound to one switch's maps (see the module docstring)."""
    a = Asm()
    a.mov(R6, R1)
    a.st(4, R10, _S_CHK, 0)
    a.ldx(4, R2, R6, bpf.SKB_LEN)
    a.jmp("jlt", R2, ETH + 10, "pass")
    # Ethernet type and LRH onto the stack (works whatever part of the skb is linear)
    a.mov(R1, R6)
    a.movi(R2, 12)
    a.mov(R3, R10)
    a.alu64("add", R3, _S_HDR)
    a.movi(R4, 10)
    a.call(FN_SKB_LOAD_BYTES)
    a.jmp("jne", R0, 0, "pass")
    a.ldx(2, R2, R10, _S_HDR)
    a.jmp("jne", R2, 0xB588, "pass")  # 88 B5, read little-endian
    a.ldx(1, R3, R10, _S_HDR + 2 + 2)  # DLID
    a.alu64("lsh", R3, 8)
    a.ldx(1, R4, R10, _S_HDR + 2 + 3)
    a.alu64("or", R3, R4, reg=True)
    a.jmp("jge", R3, UNICAST_END, "pass")  # multicast and permissive: directed-route SMPs
    # VL15 (LID-routed SMPs): to the next filter when flags (ports[0]) say the kernel SMA
    # forwards them (``set_vl15_to_sma``)
    a.ldx(1, R4, R10, _S_HDR + 2)
    a.alu64("and", R4, 0xF0)
    a.jmp("jne", R4, 0xF0, "data")
    a.st(4, R10, _S_KEY, FLAGS_SLOT)
    a.mov(R7, R3)  # the DLID survives the call
    a.map_lookup(ports_fd, _S_KEY)
    a.mov(R3, R7)
    a.jmp("jeq", R0, 0, "data")
    a.ldx(4, R2, R0, 0)
    a.jmp("jset", R2, FLAG_VL15_TO_SMA, "pass")
    a.label("data")
    # a data frame on a switch where some port enforces partitions: checked (below)
    a.ldx(1, R4, R10, _S_HDR + 2)
    a.alu64("and", R4, 0xF0)
    a.jmp("jeq", R4, 0xF0, "len")
    a.st(4, R10, _S_KEY, FLAGS_SLOT)
    a.mov(R7, R3)
    a.map_lookup(ports_fd, _S_KEY)
    a.mov(R3, R7)
    a.jmp("jeq", R0, 0, "len")
    a.ldx(4, R2, R0, 0)
    a.alu64("and", R2, FLAG_PKEY)
    a.stx(4, R10, _S_CHK, R2)
    a.label("len")
    a.ldx(1, R4, R10, _S_HDR + 2 + 4)  # PktLen (11 bits, in 4-byte words, without the VCRC)
    a.alu64("and", R4, 7)
    a.alu64("lsh", R4, 8)
    a.ldx(1, R5, R10, _S_HDR + 2 + 5)
    a.alu64("or", R4, R5, reg=True)
    a.alu64("lsh", R4, 2)
    a.alu64("add", R4, ETH + 2)
    a.ldx(4, R2, R6, bpf.SKB_LEN)
    a.jmp("jne", R2, R4, "pass", reg=True)
    # inbound enforcement of the ingress port
    a.mov(R7, R3)
    a.ldx(4, R9, R6, bpf.SKB_IFINDEX)
    _pkey_check(a, pkey_fd, R9, inbound=True, refused="pass")
    a.mov(R3, R7)
    # port = blocks[dlid >> 6][dlid & 63]
    a.mov(R7, R3)
    a.alu64("and", R7, LFT_BLOCK - 1)
    a.alu64("rsh", R3, 6)
    a.mov(R8, R3)  # the block survives the calls (local failover reads its alternates)
    a.stx(4, R10, _S_KEY, R3)
    a.map_lookup(blocks_fd, _S_KEY)
    a.jmp("jeq", R0, 0, "pass")
    a.alu64("add", R0, R7, reg=True)
    a.ldx(1, R2, R0, 0)
    a.jmp("jeq", R2, 0, "pass")
    a.jmp("jeq", R2, NO_ROUTE, "pass")
    # ifindex = ports[port]
    a.stx(4, R10, _S_KEY, R2)
    a.map_lookup(ports_fd, _S_KEY)
    a.jmp("jeq", R0, 0, "pass")
    a.ldx(4, R1, R0, 0)
    a.jmp("jeq", R1, 0, "pass")
    a.jmp("jset", R1, PORT_DOWN, "down")
    a.label("redirect")
    a.mov(R9, R1)
    _pkey_check(a, pkey_fd, R9, inbound=False, refused="pass")  # outbound, of the egress port
    a.mov(R1, R9)
    a.stx(4, R6, SKB_CB0, R1)
    a.movi(R2, 0)
    a.call(bpf.FN_REDIRECT)
    a.exit()
    a.label("pass")
    a.movi(R0, bpf.TC_ACT_UNSPEC)
    a.exit()
    # local failover: the primary port is down
    a.label("down")
    a.mov(R9, R1)  # the primary, flagged
    a.stx(4, R10, _S_KEY, R8)  # the LFT block
    a.map_lookup(alts_fd, _S_KEY)
    a.jmp("jeq", R0, 0, "primary")  # no alternates in this block: as without failover
    a.alu64("lsh", R7, 2)
    a.alu64("add", R0, R7, reg=True)
    a.mov(R8, R0)  # this LID's alternates (ALT_SLOT bytes)
    a.ldx(1, R2, R8, 0)
    a.jmp("jeq", R2, 0, "primary")  # none for this LID: as without failover
    for i in range(MAX_ALTERNATES):
        nxt = a.fresh("alt")
        if i:
            a.ldx(1, R2, R8, i)
            a.jmp("jeq", R2, 0, "all_down")  # the list ends
        a.stx(4, R10, _S_KEY, R2)
        a.map_lookup(ports_fd, _S_KEY)
        a.jmp("jeq", R0, 0, nxt)
        a.ldx(4, R1, R0, 0)
        a.jmp("jeq", R1, 0, nxt)
        a.jmp("jset", R1, PORT_DOWN, nxt)
        a.mov(R9, R1)
        a.st(4, R10, _S_KEY, STAT_FAILOVER)
        a.goto("count")
        a.label(nxt)
    a.label("all_down")
    a.st(4, R10, _S_KEY, STAT_ALL_DOWN)
    a.movi(R9, 0)
    a.label("count")
    a.map_lookup(stats_fd, _S_KEY)
    a.jmp("jeq", R0, 0, "counted")
    a.movi(R1, 1)
    a.atomic_add(8, R0, 0, R1)
    a.label("counted")
    a.mov(R1, R9)
    a.jmp("jeq", R1, 0, "pass")
    a.goto("redirect")
    a.label("primary")  # no alternates: a port without carrier sends nothing (counted)
    a.st(4, R10, _S_KEY, STAT_DOWN)
    a.map_lookup(stats_fd, _S_KEY)
    a.jmp("jeq", R0, 0, "shot")
    a.movi(R1, 1)
    a.atomic_add(8, R0, 0, R1)
    a.label("shot")
    a.movi(R0, bpf.TC_ACT_SHOT)
    a.exit()
    return a.assemble()


class LftProgram:
    """One switch's LFT maps and its loaded classifier (not attached: see ``MapLft``)."""

    def __init__(self, ports: Mapping[int, int]) -> None:
        """``ports``: port number -> egress ifindex."""
        self.blocks = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, LFT_BLOCK, N_BLOCKS, "ibemu_lft",
                              flags=bpf.BPF_F_MMAPABLE)
        self.ports = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, 4, MAX_PORTS, "ibemu_lft_port")
        self.alts = bpf.Map(bpf.BPF_MAP_TYPE_HASH, 4, ALT_VALUE, N_BLOCKS, "ibemu_lft_alt",
                            flags=bpf.BPF_F_NO_PREALLOC)
        self.stats = bpf.Map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8, N_STATS, "ibemu_lft_stat")
        self.pkeys = bpf.Map(bpf.BPF_MAP_TYPE_HASH, 4, PKEY_VALUE, MAX_PORTS, "ibemu_pkey")
        self._flags = 0
        self._enforcing: set[int] = set()
        self._ifindex = dict(ports)
        self._down: set[int] = set()
        self._alts: dict[int, bytearray] = {}
        self.prog_fd = -1
        self._mm: mmap.mmap | None = None
        self.table = memoryview(bytearray(0))
        try:
            self._mm = mmap.mmap(self.blocks.fd, UNICAST_END, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self.table = memoryview(self._mm)
            """The map itself (mmapped): the egress port per LID (0 = not forwarded). The
            kernel SMA (``ibemu.kernel.sma``) writes it too, on the LFT Sets it answers."""
            for port, ifindex in ports.items():
                self.ports.update(struct.pack("=I", port), struct.pack("=I", ifindex))
            self.prog_fd = bpf.load_program(program(self.blocks.fd, self.ports.fd, self.alts.fd, self.stats.fd,
                                                    self.pkeys.fd), name="ibemu_lft")
        except BaseException:
            self.close()
            raise

    def set_vl15_to_sma(self, on: bool) -> None:
        """LID-routed SMPs (VL15) go on to the next filter, the kernel SMA, which forwards them
        itself with the Ethernet addresses of each cable (``ibemu.kernel.sma``), instead of
        being redirected here."""
        self._flags = (self._flags | FLAG_VL15_TO_SMA) if on else (self._flags & ~FLAG_VL15_TO_SMA)
        self.ports.update(struct.pack("=I", FLAGS_SLOT), struct.pack("=I", self._flags))

    def set_partition(self, port: int, flags: int, table: list[int]) -> bool:
        """Port ``port``'s partition enforcement bits (PortInfo, ``ENFORCE_IN`` ...) and its
        P_KeyTable (the first 32 entries; empty: the default, 0xFFFF) into ``ibemu_pkey``.
        While no port has bits set the switch's data frames are not looked at (one flag).
        False when the port has no cable here."""
        ifindex = self._ifindex.get(port)
        if not ifindex or self.prog_fd < 0:
            return False
        keys = (list(table) or [0xFFFF])[:PKEY_ENTRIES]
        keys += [0] * (PKEY_ENTRIES - len(keys))
        if flags & 0x0F:
            self.pkeys.update(struct.pack("=I", ifindex), struct.pack("=I", flags & 0x0F) + struct.pack("!32H", *keys))
            self._enforcing.add(port)
        else:
            if port in self._enforcing:
                self.pkeys.delete(struct.pack("=I", ifindex))
            self._enforcing.discard(port)
        flags_now = (self._flags | FLAG_PKEY) if self._enforcing else (self._flags & ~FLAG_PKEY)
        if flags_now != self._flags:  # (a bring-up's P_Key Sets change no flag: no write each)
            self._flags = flags_now
            self.ports.update(struct.pack("=I", FLAGS_SLOT), struct.pack("=I", self._flags))
        return True

    def set_port_up(self, port: int, up: bool) -> bool:
        """Mark ``port``'s carrier up or down for local failover: one map write (the ifindex
        stays, flagged ``PORT_DOWN``). False when the port has no cable here."""
        ifindex = self._ifindex.get(port)
        if not ifindex or self.prog_fd < 0:
            return False
        if up:
            self._down.discard(port)
        else:
            self._down.add(port)
        # the GIL kept across the system call: called from the carrier thread (``kernel.carrier``)
        self.ports.update(struct.pack("=I", port), struct.pack("=I", ifindex | (0 if up else PORT_DOWN)),
                          hold_gil=True)
        return True

    @property
    def down_ports(self) -> frozenset[int]:
        return frozenset(self._down)

    def set_alternates(self, first_lid: int, entries: bytes) -> bool:
        """Write the alternates of ``len(entries) // 4`` LIDs from ``first_lid`` (a multiple
        of 4 bytes per LID, as ``ibemu_lft_alt`` holds them: ports preferred first, 0 after
        the last). Returns whether the map changed (one update of the LID's 64-LID block)."""
        if self.prog_fd < 0:
            raise KernelError("LFT map used after close()")
        n = len(entries) // ALT_SLOT
        if len(entries) % ALT_SLOT or first_lid < 0 or first_lid + n > UNICAST_END:
            raise ValueError("alternates outside the unicast LIDs, or not 4 bytes per LID")
        changed = False
        lid = first_lid
        while lid < first_lid + n:
            block = lid // LFT_BLOCK
            upto = min(first_lid + n, (block + 1) * LFT_BLOCK)
            value = self._alts.get(block)
            if value is None:
                value = bytearray(ALT_VALUE)
            new = bytearray(value)
            src = entries[(lid - first_lid) * ALT_SLOT:(upto - first_lid) * ALT_SLOT]
            at = (lid % LFT_BLOCK) * ALT_SLOT
            new[at:at + len(src)] = src
            for i in range(at, at + len(src), ALT_SLOT):  # nothing after the first 0; no 4th byte
                ports = new[i:i + MAX_ALTERNATES]
                end = ports.find(0)
                new[i:i + ALT_SLOT] = (ports[:end] if end >= 0 else ports).ljust(ALT_SLOT, b"\0")
            if new != value or block not in self._alts:
                if any(new):
                    self.alts.update(struct.pack("=I", block), bytes(new))
                    self._alts[block] = new
                elif block in self._alts:
                    self.alts.delete(struct.pack("=I", block))
                    del self._alts[block]
                changed = changed or new != value
            lid = upto
        return changed

    @property
    def has_alternates(self) -> bool:
        return bool(self._alts)

    def failover_lids(self, port: int) -> int:
        """LIDs the LFT sends to ``port`` that have alternates (what a failure of ``port``
        moves at once): a scan of the blocks with alternates only."""
        if self.prog_fd < 0:
            return 0
        table, n = self.table, 0
        for block, value in self._alts.items():
            base = block * LFT_BLOCK
            n += sum(1 for i in range(LFT_BLOCK) if value[i * ALT_SLOT] and table[base + i] == port)
        return n

    def clear_alternates(self) -> None:
        for block in list(self._alts):
            self.alts.delete(struct.pack("=I", block))
            del self._alts[block]

    def alternates(self, lid: int) -> tuple[int, ...]:
        """The alternates the kernel map holds for ``lid``."""
        value = self.alts.lookup(struct.pack("=I", lid // LFT_BLOCK))
        if value is None:
            return ()
        at = (lid % LFT_BLOCK) * ALT_SLOT
        return tuple(p for p in value[at:at + MAX_ALTERNATES] if p)

    def counters(self) -> dict[str, int]:
        """Frames the classifier sent to an alternate (``failover``), frames whose primary
        and alternates were all down (``all_down``, not forwarded) and frames for a port
        without carrier that has no alternates (``down``, dropped)."""
        out = {}
        for name, slot in (("failover", STAT_FAILOVER), ("all_down", STAT_ALL_DOWN), ("down", STAT_DOWN)):
            value = self.stats.lookup(struct.pack("=I", slot))
            out[name] = struct.unpack("=Q", value)[0] if value is not None else 0
        return out

    @property
    def installed(self) -> dict[int, int]:
        """Every LID the map forwards and its port (a scan of the map: for clearing it)."""
        table = bytes(self.table) if self.prog_fd >= 0 else b""
        return {lid: table[lid] for lid in range(1, len(table)) if table[lid]}

    def apply(self, changes: Mapping[int, int]) -> int:
        """Install ``changes`` (LID -> port; 0/0xFF = no route) by writing the mmapped map;
        returns the 64-entry blocks that changed (what a map update per block would cost)."""
        if self.prog_fd < 0:
            raise KernelError("LFT map used after close()")
        table = self.table
        touched: set[int] = set()
        for lid, port in changes.items():
            if not 0 < lid < UNICAST_END:
                raise ValueError(f"LID {lid:#x} is not a unicast LID")
            new = 0 if port in (0, NO_ROUTE) else port
            if table[lid] != new:
                table[lid] = new
                touched.add(lid >> 6)
        return len(touched)

    def read(self, lid: int) -> int:
        """The egress port the kernel map holds for ``lid`` (0: not forwarded)."""
        value = self.blocks.lookup(struct.pack("=I", lid >> 6))
        return value[lid & (LFT_BLOCK - 1)] if value is not None else 0

    def map_ids(self) -> list[int]:
        """The kernel's ids of this program's maps (``bpf.map_ids``)."""
        return [m.id for m in (self.blocks, self.ports, self.alts, self.stats, self.pkeys)]

    def close(self) -> None:
        if self.prog_fd >= 0:
            os.close(self.prog_fd)
            self.prog_fd = -1
        if self._mm is not None:
            self.table.release()
            with contextlib.suppress(BufferError):
                self._mm.close()
            self._mm = None
        self.blocks.close()
        self.ports.close()
        self.alts.close()
        self.stats.close()
        self.pkeys.close()


class MapLft:
    """The LFT of one switch as a BPF map behind one classifier on its tc block; the same
    interface as ``tc.KernelLft`` (``setup``, ``apply``, ``installed``, ``close``)."""

    def __init__(self, ns: str, ifnames: Mapping[int, str]) -> None:
        """``ifnames`` maps each cabled port number to its interface in ``ns``."""
        self.ns = ns
        self.ifnames = dict(ifnames)
        self.ports = sorted(ifnames)
        self._prog: LftProgram | None = None

    def set_vl15_to_sma(self, on: bool) -> None:
        """See ``LftProgram.set_vl15_to_sma``."""
        if self._prog is not None:
            self._prog.set_vl15_to_sma(on)

    @property
    def installed(self) -> dict[int, int]:
        return self._prog.installed if self._prog is not None else {}

    def set_partition(self, port: int, flags: int, table: list[int]) -> bool:
        """See ``LftProgram.set_partition``."""
        return self._prog.set_partition(port, flags, table) if self._prog is not None else False

    def set_port_up(self, port: int, up: bool) -> bool:
        """See ``LftProgram.set_port_up``."""
        return self._prog.set_port_up(port, up) if self._prog is not None else False

    @property
    def down_ports(self) -> frozenset[int]:
        """See ``LftProgram.down_ports``."""
        return self._prog.down_ports if self._prog is not None else frozenset()

    def set_alternates(self, first_lid: int, entries: bytes) -> bool:
        """See ``LftProgram.set_alternates``."""
        if self._prog is None:
            raise RuntimeError("MapLft.set_alternates before setup()")
        return self._prog.set_alternates(first_lid, entries)

    @property
    def has_alternates(self) -> bool:
        return self._prog is not None and self._prog.has_alternates

    def clear_alternates(self) -> None:
        if self._prog is not None:
            self._prog.clear_alternates()

    def alternates(self, lid: int) -> tuple[int, ...]:
        return self._prog.alternates(lid) if self._prog is not None else ()

    def failover_lids(self, port: int) -> int:
        """See ``LftProgram.failover_lids``."""
        return self._prog.failover_lids(port) if self._prog is not None else 0

    def counters(self) -> dict[str, int]:
        """See ``LftProgram.counters``."""
        return self._prog.counters() if self._prog is not None else {}

    def setup(self) -> None:
        """Maps, program, then clsact on every port, the DR rule and the classifier on the
        switch's block, over netlink in one send. Blocking (enters ``ns``)."""
        index = rtnl.ifindexes(self.ns, self.ifnames.values())
        ifindex = {p: index[name] for p, name in self.ifnames.items()}
        self._prog = LftProgram(ifindex)
        filters = BlockFilters(self.ns, block=TC_BLOCK, prio=PRIO, protocol=ETH_P_IB)
        try:
            filters.setup_switch_bpf(ifindex.values(), self._prog.prog_fd, name="ibemu_lft")
        finally:
            filters.close()

    def apply(self, changes: Mapping[int, int]) -> int:
        """Install ``changes`` (LID -> port; 0/0xFF = no route); returns map updates."""
        if self._prog is None:
            raise RuntimeError("MapLft.apply before setup()")
        return self._prog.apply(changes)

    def read(self, lid: int) -> int:
        """The egress port the kernel forwards ``lid`` to (0: it does not)."""
        return self._prog.read(lid) if self._prog is not None else 0

    def map_ids(self) -> list[int]:
        """The kernel's ids of the maps this switch loaded (none before ``setup``)."""
        return self._prog.map_ids() if self._prog is not None else []

    def close(self) -> None:
        """Close the maps and the program (the filter keeps them until the namespace goes)."""
        if self._prog is not None:
            self._prog.close()
            self._prog = None


@functools.cache
def unsupported() -> str | None:
    """Why this kernel cannot run the LFT classifier (``None`` when it can): creates the maps
    and loads the program once, then remembers the answer."""
    try:
        LftProgram({}).close()
    except (OSError, KernelError) as exc:
        return str(exc).splitlines()[0]
    return None
