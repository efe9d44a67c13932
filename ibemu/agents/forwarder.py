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

RcvPkts/RcvData count every packet taken in, XmitPkts/XmitData every packet forwarded.

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
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from ibemu.agents.lft import NO_ROUTE, Lft
from ibemu.agents.port import PhysState, Port, PortState
from ibemu.wire import crc as _crc

_vcrc = _crc.vcrc_calc
ALT_LIDS = 16
"""LIDs per block of alternates (the vendor attribute AlternatePorts' modifier is LID >> 4)."""
ALT_SLOT = 4
"""Bytes per LID in a block: up to ``MAX_ALTERNATES`` ports, preferred first, 0 after the last."""
MAX_ALTERNATES = 3
_RX_OK = (PortState.ARMED, PortState.ACTIVE)


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
        egress, reason = self.route(dlid, ingress, vl15=vl15)
        if reason is not None:
            return Verdict(0, packet, reason)
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
        own = ports[0]
        lft = self.lft
        lookup = lft.lookup
        impairments = self.impairments
        vcrc = _vcrc if self.verify_vcrc and not vcrc_known_good else None
        rx = pin.counters
        active = PortState.ACTIVE
        link_up = PhysState.LINK_UP
        alternates = self.alternates
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
            if frame[offset] >> 4 == 15 or pin.state not in _RX_OK:
                break
            dlid = (frame[offset + 2] << 8) | frame[offset + 3]
            if dlid >= 0xC000 or (own.lid != 0 and (dlid >> own.lmc) == (own.lid >> own.lmc)):
                break
            egress = lookup(dlid)
            if egress in (NO_ROUTE, 0, ingress) or egress in impairments:
                break
            pout = ports.get(egress)
            if pout is None:
                break
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
            rx.rcv_pkts += 1
            rx.rcv_octets += n
            tx = pout.counters
            tx.xmit_pkts += 1
            tx.xmit_octets += n
            q = out.get(egress)
            if q is None:
                q = out[egress] = []
            q.append(frame)
            done += 1
            i += 1
        if done:
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
