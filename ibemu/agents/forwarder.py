"""The userspace forwarding decision of a switch: packet + ingress port -> egress or drop.

Sans-IO and deterministic: ``decide()`` looks at the LRH only (DLID, VL; the VCRC is
checked per hop unless ``verify_vcrc`` is off), consults the switch's ``Lft`` and port
states, updates the PMA counters of the ports it touches, and applies the injected
impairments of the egress port with a seeded RNG. Rules:

- Directed-route SMPs (VL15, permissive DLID) and packets for the switch's own LID go to the
  SMA (``Reason.TO_SMA``); LID-routed VL15 packets are switched by the LFT (Init ports too).
- Ingress must be Armed/Active, egress Active (Init ports carry only VL15).
- No route (LFT 0xFF, DLID above LinearFDBTop, LID 0), multicast and permissive DLIDs,
  and egress == ingress: PortRcvSwitchRelayErrors on the ingress port.
- Egress link not Active: PortXmitDiscards on the egress port, unless local failover
  takes the packet (below).
- Bad length or VCRC: PortRcvErrors on the ingress port.
- Injected loss drops silently (lost on the wire); injected corruption flips one bit
  (the next receiver's VCRC check catches it).

Local failover (``alternates``: the switch's AlternatePorts blocks, 16 LIDs of 4 bytes each,
up to 3 ports preferred first, 0 after the last, as ``SwitchAgent.alternates`` keeps them
from the SM's vendor SMPs): when the LFT's egress for a DLID cannot carry the packet (link not
up, or for data not Active), the first alternate that can, other than the ingress port, takes
it (``stats["local_failover"]`` += 1); a DLID with alternates of which none can:
``Reason.ALTERNATES_DOWN``, PortXmitDiscards on the LFT's port (not forwarded, counted); a
DLID without alternates: exactly as before. As the kernel classifier (``kernel.lft_map``) does,
with two differences that follow from the rules above: the kernel fails over on carrier loss
only (it checks no port states, so a port in Init carries data there), and it does not skip
the ingress port (it hairpins; here egress == ingress is a relay loop, so that alternate is
passed over).

Adaptive routing (``adaptive``, an :class:`AdaptiveRouting`; ``fabric.adaptive_routing``):
a data packet whose DLID has alternates may leave by any port of its group (the LFT's port
and its alternates, the ports the SM proved together free of credit loops), not only the
LFT's. ``adapt`` takes the decision when the packet reaches the switch in the link model
(``physics.live``: the IB user datapath), not when the real frame is read (for a frame from a
host that is before the HCA's queue): the group's port that can carry it (not the ingress)
with the least load, as the model says (``load(port)``: bytes queued, on the wire and in the
pipeline for it, and held in the next switch's input buffer, i.e. credits in use); ties are
broken round robin (a pointer per switch, advanced at every decision, says which port of the
group is looked at first: idle ports share the packets instead of the LFT's port taking them
all; in the packet-level model this lifted a k=8 random permutation from 92.3% to 94.0%:
``benchmarks/bench_bisection.py``). Per packet (every packet chooses) or
per flowlet (a flow, SLID + DLID + destination QP, keeps its port while its packets follow
each other within ``flowlet_gap_ns``; a longer gap, or its port unable to carry, and it
chooses again). What ``forward_run``/``decide`` counted on the LFT's port moves to the port
chosen (XmitPkts/XmitData); ``stats``: ``ar_decisions``, ``ar_moved`` (left by another port
than the one the frame was decided for). VL15 is never moved.

RcvPkts/RcvData count every packet taken in, XmitPkts/XmitData every packet forwarded.

Partition enforcement (IBA 10.9, switch external ports; OpenSM sets it on ports facing CAs):
with PartitionEnforcementInbound set in the ingress port's PortInfo, a data packet whose BTH
P_Key matches no entry of that port's P_KeyTable is dropped (``Reason.PKEY_INBOUND``,
PortRcvConstraintErrors and P_KeyViolations of the ingress port); with
PartitionEnforcementOutbound set on the egress port, likewise after the route is found
(``Reason.PKEY_OUTBOUND``, PortXmitConstraintErrors of the egress port). FilterRawInbound /
Outbound drop raw packets (LNH 0/1, no BTH) the same way. Outbound, a key matches an entry
when their low 15 bits are equal and not 0, and at least one of the two is a full member
(bit 15 set): a limited member's packet passes only a full member's entry (``pkey_matches``,
IBA 10.9.3). Inbound, the port's table is the CA's own membership (OpenSM, and ibemu's SM,
copy the CA's table to the switch port facing it) and the key what the CA claims: the same
partition, and a full key only where the entry is full. (Applying the outbound rule inbound
too would drop every packet of a limited member at its own switch port, e.g. all of a stock
OpenSM subnet's CAs, limited members of 0x7fff; this reading is ibemu's.) VL15
(SMPs, QP0) is exempt, and so is a packet for the switch itself (its SMA/PMA, behind port 0,
checks nothing here). Each drop is queued in ``pkey_drops`` (bounded); the switch agent
turns them into trap 257 (Bad P_Key) on its ``tick``, rate-limited per port. An empty
P_KeyTable (never set) is the default one: 0xFFFF in entry 0.

``forward_run`` is the fast twin of ``decide`` for a user datapath's batches: it takes a run
of received frames, forwards the common ones itself (a data packet, good length and VCRC, for
a unicast LID the LFT routes elsewhere, ingress Armed/Active, egress Active or, when it is
not, the first alternate that is, no impairment on the port used:
the same checks in the same order, the same counter and ``stats`` updates, no object made) and stops at the first frame that is anything else, which the caller hands
to ``decide`` (the reference) before going on. Stopping there keeps the order in which frames
see the switch's state: an SMP handed to the SMA may change the LFT or a port before the next
frame. ``tests/unit/devices/test_forwarder_fast.py`` proves the two equal on generated frames.

The VCRC check is a quarter of the fast path's time on 1 KiB frames. Between two switches of
one user datapath it cannot fail: the sender checked the frame (or its SMA built it) and
nothing between them alters bytes, unless the sender's port corrupts on purpose. So the IO
layer may vouch for frames from such a neighbour (``vouches_for``: the neighbour checks VCRCs
and its port never had injected corruption) and ``forward_run`` skips the check for them;
frames from hosts, and from a port that corrupts or ever did, are always checked. (A frame
written into an inter-switch cable by a tool outside ibemu would go unchecked.)
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, NamedTuple

from ibemu.agents.lft import NO_ROUTE, Lft
from ibemu.agents.port import PhysState, Port, PortState
from ibemu.wire import crc as _crc

_vcrc = _crc.vcrc_calc
ALT_LIDS: Final = 16
"""LIDs per block of alternates (the vendor attribute AlternatePorts' modifier is LID >> 4)."""
ALT_SLOT: Final = 4
"""Bytes per LID in a block: up to ``MAX_ALTERNATES`` ports, preferred first, 0 after the last."""
MAX_ALTERNATES: Final = 3
_RX_OK = (PortState.ARMED, PortState.ACTIVE)
AR_MODES = ("packet", "flowlet")
DEFAULT_FLOWLET_GAP_NS: Final = 2_000
"""A flowlet ends after this much emulated silence: longer than the delay differences of a
fat-tree's equal paths under light load, so a new flowlet rarely overtakes the last one."""
MAX_FLOWLETS: Final = 4096
"""Flows remembered per switch; beyond it, those idle longer than the gap are forgotten."""


@dataclass(frozen=True, slots=True)
class AdaptiveRouting:
    """How a switch spreads a destination's packets over its group (module docstring)."""

    mode: str = "packet"
    flowlet_gap_ns: int = DEFAULT_FLOWLET_GAP_NS

    def __post_init__(self) -> None:
        if self.mode not in AR_MODES:
            raise ValueError(f"adaptive routing mode must be one of {', '.join(AR_MODES)}, not {self.mode!r}")
        if self.flowlet_gap_ns < 0:
            raise ValueError(f"flowlet gap must be >= 0 ns, not {self.flowlet_gap_ns}")

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "flowlet_gap_ns": self.flowlet_gap_ns}

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> AdaptiveRouting:
        return cls(str(d.get("mode", "packet")), int(d.get("flowlet_gap_ns", DEFAULT_FLOWLET_GAP_NS)))  # type: ignore[call-overload]


class Reason(StrEnum):
    TO_SMA = "to_sma"
    MALFORMED = "malformed"
    BAD_VCRC = "bad_vcrc"
    INGRESS_NOT_ACTIVE = "ingress_not_active"
    MULTICAST = "multicast"
    PERMISSIVE = "permissive"
    NO_ROUTE = "no_route"
    LOOP = "loop"
    EGRESS_DOWN = "egress_down"
    INJECTED_LOSS = "injected_loss"
    ALTERNATES_DOWN = "alternates_down"
    PKEY_INBOUND = "pkey_inbound"
    PKEY_OUTBOUND = "pkey_outbound"


ENFORCE_IN: Final = 8
ENFORCE_OUT: Final = 4
FILTER_RAW_IN: Final = 2
FILTER_RAW_OUT: Final = 1
"""PortInfo PartitionEnforcementInbound/Outbound, FilterRawInbound/Outbound (``Port.partition_flags``)."""
_IN_FLAGS: Final = ENFORCE_IN | FILTER_RAW_IN
_OUT_FLAGS: Final = ENFORCE_OUT | FILTER_RAW_OUT
_DEFAULT_TABLE = (0xFFFF,)
MAX_PKEY_DROPS: Final = 256
"""Drops remembered for the agent's traps between two ticks (older ones are forgotten)."""


def pkey_matches(entry: int, pkey: int) -> bool:
    """IBA 10.9.3: the same partition (low 15 bits, not 0), and one of the two a full member."""
    low = pkey & 0x7FFF
    return low != 0 and (entry & 0x7FFF) == low and bool((entry | pkey) & 0x8000)


def table_admits(table: Sequence[int], pkey: int, inbound: bool = False) -> bool:
    """A packet with ``pkey`` passes a port whose P_KeyTable is ``table`` (empty: the default).

    Outbound (and at a CA): some entry ``pkey_matches``. Inbound at a switch port facing a CA,
    the table is the CA's own membership (the SM copies it there) and the packet's key what
    the CA claims: the claim must not exceed it (a full key needs a full entry; a limited key
    passes a limited or full entry)."""
    low = pkey & 0x7FFF
    if not low:
        return False
    full = pkey & 0x8000
    for entry in table or _DEFAULT_TABLE:
        if (entry & 0x7FFF) == low and (entry & 0x8000 or (not full if inbound else full)):
            return True
    return False


def packet_pkey(packet: bytes | bytearray | memoryview, offset: int = 0) -> int | None:
    """The BTH P_Key of the packet at ``offset``; None for a raw packet (LNH 0/1) or one too
    short for its BTH."""
    lnh = packet[offset + 1] & 3
    if lnh < 2:
        return None
    at = offset + (8 if lnh == 2 else 48) + 2
    if len(packet) < at + 2:
        return None
    return (packet[at] << 8) | packet[at + 1]


def pkey_refuses(p: Port, packet: bytes | bytearray | memoryview, offset: int, inbound: bool) -> bool:
    """``p``'s partition enforcement (inbound or outbound, by its PortInfo flags) refuses the
    packet at ``offset`` (no side effect)."""
    flags = p.partition_flags & (_IN_FLAGS if inbound else _OUT_FLAGS)
    lnh = packet[offset + 1] & 3
    if lnh < 2:  # raw: no BTH
        return bool(flags & (FILTER_RAW_IN | FILTER_RAW_OUT))
    if not flags & (ENFORCE_IN | ENFORCE_OUT):
        return False
    at = offset + (10 if lnh == 2 else 50)
    if len(packet) < at + 2:  # too short for its BTH: no key to admit it by
        return True
    return not table_admits(p.pkeys, (packet[at] << 8) | packet[at + 1], inbound)


class PkeyDrop(NamedTuple):
    """A packet a port's partition enforcement dropped (for trap 257)."""

    port: int
    inbound: bool
    pkey: int
    slid: int
    dlid: int
    sl: int
    dest_qp: int


class Verdict(NamedTuple):
    """``port`` > 0: send ``packet`` there. ``port`` == 0: dropped or for the SMA (``reason``)."""

    port: int
    packet: bytes
    reason: Reason | None


@dataclass(slots=True)
class Impairment:
    """Loss and corruption probabilities (0..1) applied to packets leaving one port."""

    loss: float = 0.0
    corrupt: float = 0.0

    def __post_init__(self) -> None:
        for name in ("loss", "corrupt"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} probability must be within 0..1, not {value}")


class _Sends:
    """What one ``forward_run`` sends by one egress port: the list its frames go to, and how
    many and how many bytes (added to the port's counters once, at the end of the run)."""

    def __init__(self, port: Port, frames: list[bytes]) -> None:
        self.port = port
        self.frames = frames
        self.pkts = 0
        self.octets = 0


class Forwarder:
    """Forwarding plane of one switch over its ``Lft`` and ``ports`` (index 0 = management)."""

    def __init__(self, lft: Lft, ports: Mapping[int, Port], *, seed: int = 0,
                 verify_vcrc: bool = True, alternates: Mapping[int, bytes] | None = None) -> None:
        self.lft = lft
        self.ports = ports
        self.alternates: Mapping[int, bytes] = alternates if alternates is not None else {}
        """Alternate ports per LID (block = LID >> 4 -> 64 bytes, module docstring); read,
        never written: the switch agent's own dict."""
        self.verify_vcrc = verify_vcrc
        self.rng = random.Random(seed)
        self.impairments: dict[int, Impairment] = {}
        self.corrupting: set[int] = set()
        """Ports that have had injected corruption at some time (what they sent may be bad)."""
        self.stats: Counter[str] = Counter()
        self.pkey_drops: deque[PkeyDrop] = deque(maxlen=MAX_PKEY_DROPS)
        """Partition enforcement drops not yet seen by the agent (``SwitchAgent.tick``)."""
        self.adaptive: AdaptiveRouting | None = None
        """Adaptive routing over the alternates' groups (None: the LFT's port only)."""
        self._ar_turn = 0
        """Adaptive routing's round-robin pointer for ties."""
        self._flowlets: dict[tuple[int, int, int], tuple[int, int]] = {}
        """(SLID, DLID, destination QP) -> (port, emulated ns of its last packet)."""

    def _pkey_refused(self, p: Port, packet: bytes | bytearray | memoryview, offset: int,
                      inbound: bool) -> bool:
        """``p``'s partition enforcement (inbound or outbound, per its flags) drops the
        packet: counted in P_KeyViolations and the constraint counter, queued for trap 257."""
        if not pkey_refuses(p, packet, offset, inbound):
            return False
        pkey = packet_pkey(packet, offset)
        c = p.counters
        if inbound:
            c.port_rcv_constraint_errors += 1
        else:
            c.port_xmit_constraint_errors += 1
        p.p_key_violations = min(p.p_key_violations + 1, 0xFFFF)
        reason = Reason.PKEY_INBOUND if inbound else Reason.PKEY_OUTBOUND
        self.stats[reason] += 1
        o = offset
        qp = 0
        if pkey is not None:
            bth = o + (8 if packet[o + 1] & 3 == 2 else 48)
            qp = (packet[bth + 5] << 16) | (packet[bth + 6] << 8) | packet[bth + 7] if len(packet) >= bth + 8 else 0
        self.pkey_drops.append(PkeyDrop(p.num, inbound, 0 if pkey is None else pkey,
                                        (packet[o + 6] << 8) | packet[o + 7], (packet[o + 2] << 8) | packet[o + 3],
                                        packet[o + 1] >> 4, qp))
        return True

    def set_impairment(self, port: int, *, loss: float = 0.0, corrupt: float = 0.0) -> None:
        """Impair packets leaving ``port`` (both zero removes the impairment)."""
        if port not in self.ports or port == 0:
            raise ValueError(f"no external port {port}")
        if corrupt:
            self.corrupting.add(port)
        if loss or corrupt:
            self.impairments[port] = Impairment(loss, corrupt)
        else:
            self.impairments.pop(port, None)

    def decide(self, packet: bytes, ingress: int, *, count_traffic: bool = True) -> Verdict:
        """Where ``packet`` (LRH .. VCRC) received on ``ingress`` goes."""
        ports = self.ports
        pin = ports.get(ingress)
        if pin is None or ingress == 0:
            self.stats[Reason.MALFORMED] += 1
            return Verdict(0, packet, Reason.MALFORMED)
        n = len(packet)
        if count_traffic:
            pin.counters.add_rx(n)
        if n < 10 or ((packet[4] & 7) << 8 | packet[5]) * 4 + 2 != n:
            pin.counters.port_rcv_errors += 1
            pin.counters.port_malformed_packet_errors += 1
            self.stats[Reason.MALFORMED] += 1
            return Verdict(0, packet, Reason.MALFORMED)
        if self.verify_vcrc and _vcrc(packet[:-2]) != packet[-2] | (packet[-1] << 8):
            pin.counters.port_rcv_errors += 1
            pin.counters.port_local_physical_errors += 1
            self.stats[Reason.BAD_VCRC] += 1
            return Verdict(0, packet, Reason.BAD_VCRC)
        dlid = (packet[2] << 8) | packet[3]
        vl15 = packet[0] >> 4 == 15
        # Directed-route SMPs (permissive DLID) and anything for this switch go to its SMA;
        # LID-routed SMPs are switched through the LFT like data, on VL15, as in hardware.
        if (vl15 and dlid == 0xFFFF) or ports[0].owns_lid(dlid):
            return Verdict(0, packet, Reason.TO_SMA)
        if not vl15 and pin.state not in _RX_OK:
            self.stats[Reason.INGRESS_NOT_ACTIVE] += 1
            return Verdict(0, packet, Reason.INGRESS_NOT_ACTIVE)
        if not vl15 and pin.partition_flags & _IN_FLAGS and self._pkey_refused(pin, packet, 0, True):
            return Verdict(0, packet, Reason.PKEY_INBOUND)
        egress, reason = self.route(dlid, ingress, vl15=vl15)
        if reason is not None:
            return Verdict(0, packet, reason)
        pout = ports[egress]
        if not vl15 and pout.partition_flags & _OUT_FLAGS and self._pkey_refused(pout, packet, 0, False):
            return Verdict(0, packet, Reason.PKEY_OUTBOUND)
        imp = self.impairments.get(egress)
        if imp is not None:
            if imp.loss and self.rng.random() < imp.loss:
                self.stats[Reason.INJECTED_LOSS] += 1
                if count_traffic:
                    ports[egress].counters.add_tx(n)  # it left; the wire lost it
                return Verdict(0, packet, Reason.INJECTED_LOSS)
            if imp.corrupt and self.rng.random() < imp.corrupt:
                bit = self.rng.randrange(n * 8)
                buf = bytearray(packet)
                buf[bit >> 3] ^= 1 << (bit & 7)
                packet = bytes(buf)
                self.stats["injected_corrupt"] += 1
        if count_traffic:
            ports[egress].counters.add_tx(n)
        self.stats["forwarded"] += 1
        return Verdict(egress, packet, None)

    def vouches_for(self, port: int) -> bool:
        """Every packet this switch sent out of ``port`` had a good VCRC: it checks the VCRC
        of what it forwards, and ``port`` never had injected corruption."""
        return self.verify_vcrc and port not in self.corrupting

    def forward_run(self, frames: Sequence[bytes], start: int, ingress: int, offset: int,
                    out: dict[int, list[bytes]], *, vcrc_known_good: bool = False) -> int:
        """Forward ``frames[start:]`` (each ``offset`` bytes of framing, then LRH .. VCRC)
        received on ``ingress`` while they are plain data packets ``decide`` would forward
        unimpaired: the frame itself is appended to ``out[egress]`` (no copy: the caller
        sends it with the egress port's framing in place of its first ``offset`` bytes).
        Returns the index of the first frame left for ``decide`` (``len(frames)`` when none is).

        ``vcrc_known_good``: the caller vouches for the frames' VCRC (they come from a
        neighbour switch of the same datapath whose ``vouches_for`` its port holds): the
        check could not fail, and is skipped."""
        ports = self.ports
        pin = ports.get(ingress)
        end = len(frames)
        if pin is None or ingress == 0 or start >= end:
            return start
        if pin.state not in _RX_OK:  # the first frame would stop there (nothing below changes it)
            return start
        own = ports[0]
        own_lid, lmc = own.lid, own.lmc
        in_flags = pin.partition_flags & _IN_FLAGS
        lft = self.lft
        impairments = self.impairments
        vcrc = _vcrc if self.verify_vcrc and not vcrc_known_good else None
        active = PortState.ACTIVE
        link_up = PhysState.LINK_UP
        alternates = self.alternates
        # Per egress port of the run, its frames and counts (added to its counters once at the
        # end); ``clear`` by the LFT's port when that port takes a frame as it stands (up,
        # Active, unimpaired, no outbound enforcement): the checks per frame are then the
        # frame's own. Nothing these checks read changes during the run.
        sends: dict[int, _Sends] = {}
        clear: dict[int, _Sends] = {}
        rcv_pkts = rcv_octets = 0
        i = start
        done = 0
        failovers = 0
        while i < end:
            frame = frames[i]
            n = len(frame) - offset
            if n < 10 or ((frame[offset + 4] & 7) << 8 | frame[offset + 5]) * 4 + 2 != n:
                break
            if vcrc is not None and vcrc(memoryview(frame)[offset:-2]) != frame[-2] | (frame[-1] << 8):
                break
            if frame[offset] >> 4 == 15:
                break
            dlid = (frame[offset + 2] << 8) | frame[offset + 3]
            if dlid >= 0xC000 or (own_lid != 0 and (dlid >> lmc) == (own_lid >> lmc)):
                break
            if in_flags and pkey_refuses(pin, frame, offset, True):
                break  # decide drops and counts it
            egress = lft.lookup(dlid)
            e = clear.get(egress)
            if e is None:
                routed = egress
                if egress in (NO_ROUTE, 0, ingress) or egress in impairments:
                    break
                pout = ports.get(egress)
                if pout is None:
                    break
                failed_over = False
                if pout.phys != link_up or pout.state != active:
                    block = alternates.get(dlid >> 4) if alternates else None
                    if block is None:
                        break
                    j = (dlid & 15) * ALT_SLOT
                    pout = None
                    for alt in block[j : j + MAX_ALTERNATES]:
                        if alt == 0:
                            break
                        palt = ports.get(alt) if alt != ingress else None
                        if palt is not None and palt.phys == link_up and palt.state == active:
                            egress, pout = alt, palt
                            break
                    if pout is None or egress in impairments:
                        break  # none up (counted by ``decide``), or an impaired one
                    failovers += 1
                    failed_over = True
                out_flags = pout.partition_flags & _OUT_FLAGS
                if out_flags and pkey_refuses(pout, frame, offset, False):
                    break
                e = sends.get(egress)
                if e is None:
                    q = out.get(egress)
                    if q is None:
                        q = out[egress] = []
                    e = sends[egress] = _Sends(pout, q)
                if not failed_over and not out_flags:
                    clear[routed] = e
            rcv_pkts += 1
            rcv_octets += n
            e.pkts += 1
            e.octets += n
            e.frames.append(frame)
            done += 1
            i += 1
        if done:
            rx = pin.counters
            rx.rcv_pkts += rcv_pkts
            rx.rcv_octets += rcv_octets
            for e in sends.values():
                tx = e.port.counters
                tx.xmit_pkts += e.pkts
                tx.xmit_octets += e.octets
            self.stats["forwarded"] += done
            if failovers:
                self.stats["local_failover"] += failovers
        return i

    def route(self, dlid: int, ingress: int, *, vl15: bool) -> tuple[int, Reason | None]:
        """Egress port for ``dlid`` by the LFT, with the relay checks and error counters.

        ``vl15``: a management packet, which may leave on any port whose link is up (Init
        included); data needs an Active egress port. ``ingress`` 0 = generated by the SMA.
        """
        ports = self.ports
        pin = ports.get(ingress)
        if dlid >= 0xC000:
            reason = Reason.PERMISSIVE if dlid == 0xFFFF else Reason.MULTICAST
            if pin is not None:
                pin.counters.port_rcv_switch_relay_errors += 1
            self.stats[reason] += 1
            return 0, reason
        egress = self.lft.lookup(dlid)
        if egress == NO_ROUTE or egress == 0 or egress not in ports:
            if pin is not None:
                pin.counters.port_rcv_switch_relay_errors += 1
            self.stats[Reason.NO_ROUTE] += 1
            return 0, Reason.NO_ROUTE
        if egress == ingress:
            pin_ = ports[ingress]
            pin_.counters.port_rcv_switch_relay_errors += 1
            self.stats[Reason.LOOP] += 1
            return 0, Reason.LOOP
        pout = ports[egress]
        if not self._can_carry(pout, vl15):
            alts = self.alternates_of(dlid)
            if not alts:
                pout.counters.port_xmit_discards += 1
                self.stats[Reason.EGRESS_DOWN] += 1
                return 0, Reason.EGRESS_DOWN
            for alt in alts:
                q = ports.get(alt)
                if alt != ingress and q is not None and self._can_carry(q, vl15):
                    self.stats["local_failover"] += 1
                    return alt, None
            pout.counters.port_xmit_discards += 1
            self.stats[Reason.ALTERNATES_DOWN] += 1
            return 0, Reason.ALTERNATES_DOWN
        return egress, None

    @staticmethod
    def _can_carry(port: Port, vl15: bool) -> bool:
        """``port``'s link is up and its state lets the packet out (data: Active; VL15: not Down)."""
        return port.link_is_up and (port.state == PortState.ACTIVE or (vl15 and port.state != PortState.DOWN))

    def alternates_of(self, dlid: int) -> tuple[int, ...]:
        """The alternate ports of ``dlid`` (preferred first; empty: none)."""
        block = self.alternates.get(dlid // ALT_LIDS) if self.alternates else None
        if block is None:
            return ()
        i = (dlid % ALT_LIDS) * ALT_SLOT
        ports = block[i : i + MAX_ALTERNATES]
        end = ports.find(0)
        return tuple(ports[:end] if end >= 0 else ports)

    def adapt(self, packet: bytes | bytearray | memoryview, offset: int, ingress: int, egress: int,
              now_ns: int, load: Callable[[int], int]) -> int:
        """Adaptive routing (module docstring): the port of the DLID's group that ``packet``
        (``offset`` bytes of framing, then LRH ..), decided for ``egress``, leaves by at
        ``now_ns`` (emulated). ``egress`` itself when adaptive routing is off, the packet is
        VL15, the DLID has no alternates, or ``egress`` is not in its group (a relay the
        group does not cover)."""
        ar = self.adaptive
        if ar is None or not self.alternates or len(packet) < offset + 20 or packet[offset] >> 4 == 15:
            return egress
        dlid = (packet[offset + 2] << 8) | packet[offset + 3]
        alts = self.alternates_of(dlid)
        if not alts:
            return egress
        primary = self.lft.lookup(dlid)
        group = (primary, *alts)
        if egress not in group:
            return egress
        ports = self.ports
        key = (0, 0, 0)
        flowlet = ar.mode == "flowlet"
        if flowlet:
            o = offset + (8 if packet[offset + 1] & 3 == 2 else 48)
            key = ((packet[offset + 6] << 8) | packet[offset + 7], dlid,
                   (packet[o + 5] << 16) | (packet[o + 6] << 8) | packet[o + 7])
            last = self._flowlets.get(key)
            if last is not None and now_ns - last[1] <= ar.flowlet_gap_ns:
                q = ports.get(last[0])
                if q is not None and last[0] != ingress and self._can_carry(q, False):
                    self._flowlets[key] = (last[0], now_ns)
                    return self._moved(packet, offset, egress, last[0])
        best, best_load = 0, -1
        turn = self._ar_turn % len(group)
        self._ar_turn += 1
        for p in group[turn:] + group[:turn]:
            q = ports.get(p)
            if p == ingress or q is None or not self._can_carry(q, False):
                continue
            lp = load(p)
            if best_load < 0 or lp < best_load:
                best, best_load = p, lp
        if not best:
            return egress  # none can carry it: the model discards it on its port
        self.stats["ar_decisions"] += 1
        if flowlet:
            flows = self._flowlets
            if len(flows) >= MAX_FLOWLETS:
                for k in [k for k, v in flows.items() if now_ns - v[1] > ar.flowlet_gap_ns]:
                    del flows[k]
                if len(flows) >= MAX_FLOWLETS:
                    flows.clear()
            flows[key] = (best, now_ns)
        return self._moved(packet, offset, egress, best)

    def _moved(self, packet: bytes | bytearray | memoryview, offset: int, egress: int, port: int) -> int:
        """``port`` takes the packet decided for ``egress``: the transmit count moves with it."""
        if port != egress:
            n = len(packet) - offset
            a, b = self.ports[egress].counters, self.ports[port].counters
            a.xmit_pkts = max(0, a.xmit_pkts - 1)
            a.xmit_octets = max(0, a.xmit_octets - n)
            b.xmit_pkts += 1
            b.xmit_octets += n
            self.stats["ar_moved"] += 1
        return port
