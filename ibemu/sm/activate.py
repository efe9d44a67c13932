"""Writing the SM's decisions into ports and switches: LIDs, P_Keys, SwitchInfo, port states.

All SubnSets go directly routed, in parallel within the transport's window, starting from
the attribute as last read (``Discovery.port_info`` / ``switch_info``), which the response
then replaces. Port states move one step per Set: every port to Armed first, then every
port to Active, so both ends of a link are within one step of each other.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable
from typing import NamedTuple

import trio

from ibemu.sm.discovery import (
    ATTR_PKEY_TABLE,
    ATTR_PORT_INFO,
    ATTR_SWITCH_INFO,
    PHYS_LINK_UP,
    STATE_ACTIVE,
    STATE_ARMED,
    STATE_INIT,
    Discovery,
    End,
)
from ibemu.sm.transport import Request
from ibemu.wire import madcodec as mb

log = logging.getLogger(__name__)

DEFAULT_PKEY = 0xFFFF  # the default partition, full member


async def _set_port(disc: Discovery, end: End, data: bytes, *, lid_routed: bool = False) -> bool:
    """PortInfo Set of ``end``; ``lid_routed``: to the node's LID through the LFTs first
    (cheaper per hop than directed route), directed route if that goes unanswered."""
    node = disc.graph.nodes.get(end[0])
    if node is None:
        return False
    path = node.dr_path if node.is_switch else node.ports[end[1]].dr_path
    r = None
    lid = node.ports[0].lid if node.is_switch else node.ports[end[1]].lid
    if lid_routed and lid:
        r = await disc.transport.request(Request(mb.lr_smp(mb.SET, ATTR_PORT_INFO, modifier=end[1], data=data),
                                                 dlid=lid))
        if r is None:
            disc.transport.stats["lid_routed_fallback"] += 1
    if r is None:
        r = await disc.transport.request(mb.dr_smp(mb.SET, ATTR_PORT_INFO, path=list(path),
                                                   modifier=end[1], data=data))
    if r is None or not r.ok:
        log.warning("PortInfo Set %#x:%d failed (%s)", end[0], end[1],
                    "timeout" if r is None else f"status {r.status:#x}")
        return False
    disc.store_port_info(node, end[1], r.data)
    return True


def lid_ends(disc: Discovery) -> list[End]:
    """Ports that carry a LID: switch port 0 and every CA port."""
    out: list[End] = []
    for node in disc.graph.nodes.values():
        if node.is_switch:
            out.append((node.guid, 0))
        else:
            out += [(node.guid, num) for num in node.ports]
    return out


class MKeys(NamedTuple):
    """The M_Key state the SM gives every port that holds one."""

    m_key: int
    protect: int
    lease_s: int

    def held_by(self, pi: bytes) -> bool:
        """Does PortInfo ``pi`` (read with the key) already say so?"""
        return (struct.unpack_from("!Q", pi, 0)[0] == self.m_key and pi[34] >> 6 == self.protect
                and struct.unpack_from("!H", pi, 26)[0] == self.lease_s)


async def set_lids(disc: Discovery, sm_lid: int, ends: Iterable[End] | None = None, *,
                   keys: MKeys | None = None) -> int:
    """PortInfo Set LID / MasterSMLID (and ``keys``) where the port does not have them yet;
    returns Sets done."""
    todo: list[tuple[End, bytes]] = []
    for end in lid_ends(disc) if ends is None else ends:
        node = disc.graph.nodes.get(end[0])
        pi = disc.port_info.get(end)
        if node is None or pi is None or end[1] not in node.ports:
            continue
        want = node.ports[end[1]].lid
        have_lid, have_sm = struct.unpack_from("!HH", pi, 16)
        if want and (have_lid != want or have_sm != sm_lid or (keys is not None and not keys.held_by(pi))):
            if keys is None:
                todo.append((end, mb.port_info_set(pi, lid=want, sm_lid=sm_lid)))
            else:
                todo.append((end, mb.port_info_set(pi, lid=want, sm_lid=sm_lid, m_key=keys.m_key,
                                                   m_key_protect=keys.protect, m_key_lease_s=keys.lease_s)))
    ok = 0

    async def one(end: End, data: bytes) -> None:
        nonlocal ok
        done_ok = await _set_port(disc, end, data)
        ok += done_ok

    async with trio.open_nursery() as n:
        for end, data in todo:
            n.start_soon(one, end, data)
    return ok


def link_ends(disc: Discovery) -> list[End]:
    """Ports of live links (both ends of every cable the graph knows)."""
    out: list[End] = []
    for node in disc.graph.nodes.values():
        for num, p in node.ports.items():
            if p.peer is not None and (num or not node.is_switch):
                out.append((node.guid, num))
    return out


async def set_state(disc: Discovery, state: int, ends: Iterable[End] | None = None, *,
                    lid_routed: bool = False) -> int:
    """Move each port one step towards ``state`` (Armed or Active); returns Sets done.

    A port already there, not LinkUp, or (for Active) not yet Armed is left alone.
    """
    todo: list[tuple[End, bytes]] = []
    for end in link_ends(disc) if ends is None else ends:
        pi = disc.port_info.get(end)
        if pi is None or pi[33] >> 4 != PHYS_LINK_UP:
            continue
        cur = pi[32] & 0x0F
        if cur >= state:
            continue
        if state == STATE_ARMED and cur != STATE_INIT:
            continue
        if state == STATE_ACTIVE and cur != STATE_ARMED:
            continue
        todo.append((end, mb.port_info_set(pi, port_state=state)))
    ok = 0

    async def one(end: End, data: bytes) -> None:
        nonlocal ok
        done_ok = await _set_port(disc, end, data, lid_routed=lid_routed)
        ok += done_ok

    async with trio.open_nursery() as n:
        for end, data in todo:
            n.start_soon(one, end, data)
    return ok


async def activate(disc: Discovery, ends: Iterable[End] | None = None, *, lid_routed: bool = False) -> int:
    """Init -> Armed -> Active for ``ends`` (default: every live link); returns Sets done.

    ``lid_routed``: the LFTs are known good (just programmed, nothing failed since).
    """
    chosen = list(link_ends(disc) if ends is None else ends)
    n = await set_state(disc, STATE_ARMED, chosen, lid_routed=lid_routed)
    return n + await set_state(disc, STATE_ACTIVE, chosen, lid_routed=lid_routed)


async def set_switch_info(disc: Discovery, guids: Iterable[int], *, top: int | None,
                          clear_change: bool = True) -> int:
    """SwitchInfo Set: LinearFDBTop (None = keep) and clear PortStateChange (write 1)."""
    done = 0

    async def one(guid: int) -> None:
        nonlocal done
        node = disc.graph.nodes.get(guid)
        si = disc.switch_info.get(guid)
        if node is None or si is None:
            return
        data = mb.switch_info_set(si, linear_fdb_top=top, clear_port_state_change=clear_change)
        r = await disc.transport.request(mb.dr_smp(mb.SET, ATTR_SWITCH_INFO, path=list(node.dr_path),
                                                   data=data))
        if r is not None and r.ok:
            disc.switch_info[guid] = r.data
            done += 1
        else:
            log.warning("SwitchInfo Set %#x failed", guid)

    async with trio.open_nursery() as n:
        for guid in guids:
            n.start_soon(one, guid)
    return done


def fdb_top(disc: Discovery, guid: int) -> int:
    si = disc.switch_info.get(guid)
    return struct.unpack_from("!H", si, 6)[0] if si else 0


async def set_pkeys(disc: Discovery) -> int:
    """Put the default partition (0xFFFF) in entry 0 of every CA port that lacks it."""
    done = 0

    async def one(end: End, block: bytes) -> None:
        nonlocal done
        node = disc.graph.nodes[end[0]]
        data = struct.pack("!H", DEFAULT_PKEY) + block[2:64]
        r = await disc.transport.request(mb.dr_smp(mb.SET, ATTR_PKEY_TABLE, path=list(node.ports[end[1]].dr_path),
                                                   modifier=0, data=data))
        if r is not None and r.ok:
            disc.pkeys[end] = r.data
            done += 1

    async with trio.open_nursery() as n:
        for end, block in list(disc.pkeys.items()):
            if end[0] in disc.graph.nodes and struct.unpack_from("!H", block, 0)[0] != DEFAULT_PKEY:
                n.start_soon(one, end, block)
    return done
