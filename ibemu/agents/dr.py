"""Directed-route SMP processing (IBA C14-9 outgoing, C14-13 returning), as Linux smi.c does it.

All functions work in place on a bytearray holding the MAD (``m`` = its offset) and return
a verdict ``(kind, value)``: ``CONSUME`` (the local SMA takes a request, or the local SM
client a response), ``PORT`` (send on physical port ``value``), ``LID`` (LID-route to
``value`` through the LFT) or ``DISCARD`` (``value`` = a reason string for the stats).

Hop pointers seen on the wire (n = HopCount): a request crossing the k-th link of its path
carries HopPointer k, and so does the response crossing that link back. On receipt:

- outgoing (D=0): 1 <= hp < n at a switch: ReturnPath[hp] = ingress, hp += 1, send on
  InitialPath[hp]; hp == n: ReturnPath[n] = ingress, hp = n+1, consume if DrDLID is
  permissive, else (switch) LID-route the rest to DrDLID; hp == n+1: the LID-routed tail
  arrived, consume; hp == 0 < n at a switch reached by LID: the LID-routed head ended,
  start the directed part (hp = 1, send on InitialPath[1]).
- returning (D=1): hp == n+1 at a switch reached by LID: hp = n, send on ReturnPath[n];
  2 <= hp <= n at a switch: hp -= 1, send on ReturnPath[hp]; hp == 1: hp = 0 and deliver
  (DrSLID permissive, at a CA) or LID-route to DrSLID (switch); hp == 0: arrived by LID at
  the SM's CA, deliver.
- HopCount >= 64, a CA asked to relay, ports 0 or beyond NumPorts, anything else: discard.
"""

from __future__ import annotations

from ibemu.wire.madpacket import (
    INITIAL_PATH,
    M_DR_DLID,
    M_DR_SLID,
    M_HOP_COUNT,
    M_HOP_POINTER,
    M_STATUS,
    PERMISSIVE_LID,
    RETURN_PATH,
)

CONSUME = 0
PORT = 1
LID = 2
DISCARD = 3

MAX_HOPS = 63

Verdict = tuple[int, int | str]


def direction(buf: bytearray | bytes, m: int) -> int:
    return buf[m + M_STATUS] >> 7


def _dr_lids(buf: bytearray | bytes, m: int) -> tuple[int, int]:
    return ((buf[m + M_DR_SLID] << 8) | buf[m + M_DR_SLID + 1],
            (buf[m + M_DR_DLID] << 8) | buf[m + M_DR_DLID + 1])


def on_receive(buf: bytearray, m: int, ingress: int, *, is_switch: bool, num_ports: int,
               lid_routed: bool) -> Verdict:
    """Apply the receive rules to a DR SMP that arrived on ``ingress``.

    ``lid_routed``: the packet's LRH DLID was this node's LID (not the permissive LID).
    """
    hp = buf[m + M_HOP_POINTER]
    n = buf[m + M_HOP_COUNT]
    if n > MAX_HOPS:
        return DISCARD, "hop_count"
    if n == 0 and not lid_routed:
        return DISCARD, "hop_count_zero_on_wire"
    dr_slid, dr_dlid = _dr_lids(buf, m)
    if not buf[m + M_STATUS] & 0x80:  # outgoing
        if hp == 0:
            if not (is_switch and lid_routed and n > 0):
                return DISCARD, "hop_pointer"
            buf[m + M_HOP_POINTER] = 1
            return _egress(buf[m + INITIAL_PATH + 1], num_ports)
        if hp < n:
            if not is_switch:
                return DISCARD, "ca_relay"
            buf[m + RETURN_PATH + hp] = ingress
            hp += 1
            buf[m + M_HOP_POINTER] = hp
            return _egress(buf[m + INITIAL_PATH + hp], num_ports)
        if hp == n:
            buf[m + RETURN_PATH + n] = ingress
            buf[m + M_HOP_POINTER] = n + 1
            if dr_dlid == PERMISSIVE_LID:
                return CONSUME, 0
            if not is_switch:
                return DISCARD, "dr_dlid_at_ca"
            return LID, dr_dlid
        if hp == n + 1 and lid_routed:
            return CONSUME, 0
        return DISCARD, "hop_pointer"
    # returning
    if n > 0 and hp == n + 1:
        if not (is_switch and lid_routed):
            return DISCARD, "hop_pointer"
        buf[m + M_HOP_POINTER] = n
        return _egress(buf[m + RETURN_PATH + n], num_ports)
    if 2 <= hp <= n:
        if not is_switch:
            return DISCARD, "ca_relay"
        hp -= 1
        buf[m + M_HOP_POINTER] = hp
        return _egress(buf[m + RETURN_PATH + hp], num_ports)
    if hp == 1:
        buf[m + M_HOP_POINTER] = 0
        if dr_slid == PERMISSIVE_LID:
            return (DISCARD, "no_local_sm") if is_switch else (CONSUME, 0)
        if not is_switch:
            return DISCARD, "dr_slid_at_ca"
        return LID, dr_slid
    if hp == 0 and lid_routed and not is_switch:
        return CONSUME, 0
    return DISCARD, "hop_pointer"


def on_respond(buf: bytearray, m: int, *, num_ports: int, request_lid_routed: bool,
               request_slid: int) -> Verdict:
    """Turn a consumed request into a response's route: sets D=1, then C14-13:1.

    A request that reached us LID-routed (its LID-routed tail) is answered LID-routed to the
    request's LRH SLID with the hop pointer untouched (n+1); otherwise hp = n and the
    response leaves on ReturnPath[n]. ``on_receive`` must have accepted the request.
    """
    buf[m + M_STATUS] |= 0x80
    n = buf[m + M_HOP_COUNT]
    if request_lid_routed:
        return LID, request_slid
    buf[m + M_HOP_POINTER] = n
    return _egress(buf[m + RETURN_PATH + n], num_ports)


def on_originate(buf: bytearray, m: int, port: int) -> Verdict:
    """An SMP from a local client about to leave on ``port`` (C14-9:1 / C14-13:1 at the source).

    Outgoing with DrSLID permissive: hp 0 -> 1, InitialPath[1] must be ``port``. Outgoing
    with a LID-routed head (DrSLID set): unchanged, LID-routed by the caller. HopCount 0:
    for the local SMA (``CONSUME``). Returning (a local SM answering): hp n+1 -> n,
    ReturnPath[n] must be ``port``.
    """
    hp = buf[m + M_HOP_POINTER]
    n = buf[m + M_HOP_COUNT]
    if n > MAX_HOPS:
        return DISCARD, "hop_count"
    dr_slid, _dr_dlid = _dr_lids(buf, m)
    if not buf[m + M_STATUS] & 0x80:
        if hp != 0:
            return DISCARD, "hop_pointer"
        if n == 0:
            return CONSUME, 0
        if dr_slid != PERMISSIVE_LID:
            return LID, 0
        buf[m + M_HOP_POINTER] = 1
        return (PORT, port) if buf[m + INITIAL_PATH + 1] == port else (DISCARD, "initial_path")
    if n > 0 and hp == n + 1:
        buf[m + M_HOP_POINTER] = n
        return (PORT, port) if buf[m + RETURN_PATH + n] == port else (DISCARD, "return_path")
    return DISCARD, "hop_pointer"


def local_response(buf: bytearray, m: int) -> None:
    """A HopCount-0 request answered by the local SMA: D=1, hp ends at 0 (C14-13:3)."""
    buf[m + M_STATUS] |= 0x80
    buf[m + M_HOP_POINTER] = 0


def _egress(port: int, num_ports: int) -> Verdict:
    if 1 <= port <= num_ports:
        return PORT, port
    return DISCARD, "bad_port"
