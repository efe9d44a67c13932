"""The IB user datapath's frames into the link model and out of it, one loop per batch, compiled.

``LinkPlane.submit``'s per-frame work (a :class:`~ibemu.physics.model.Frame` from the frame's
bytes, then ``LivePlane.arrive``) and ``LinkPlane._hand_over``'s (each departure onto its cable:
handed to the next switch in memory, or kept for the veth) as functions of their own, so that
they are compiled with the model (``ibemu.native``: one mypyc group, so the call into
``arrive`` is a C call and the loops run no bytecode); ``LinkPlane`` itself stays interpreted
(its base class, the IO shared with RoCE, is). Without the compiled twins this runs as it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from ibemu.kernel.linkio import cable_way
from ibemu.physics.live import Departure, LivePlane
from ibemu.physics.model import Frame

ETH_LEN: Final = 14


def hand_in(plane: LivePlane, switch: str, in_port: int, out: dict[int, list[bytes]], now: int) -> int:
    """Every frame of ``out`` (egress port -> frames with their Ethernet header), received on
    ``switch:in_port``, into ``plane`` at ``now``; how many. A frame's size
    is LRH .. VCRC, its SL the LRH's, VL15 by its VL nibble, its key on the cable its LRH
    from the DLID on and its BTH (``linkplane.match_key``), its ``meta`` the frame itself."""
    n = 0
    for egress, frames in out.items():
        n += len(frames)
        for f in frames:
            fr = Frame(len(f) - ETH_LEN, f[ETH_LEN + 1] >> 4, egress, f[ETH_LEN + 2:ETH_LEN + 20],
                       False, False, f[ETH_LEN] >> 4 == 15, f)
            plane.arrive(switch, in_port, fr, now)
    return n


def hand_over(due: list[Departure], peers: dict[tuple[str, int], tuple[str, int]],
              local: dict[tuple[str, int], list[bytes]], captured: set[tuple[str, int]],
              carrier: Callable[[str, int], bool], powered: Callable[[str], bool],
              heads: Callable[[str, int], bytes]) -> tuple[list[Departure], int]:
    """``LinkPlane._hand_over`` (``LiveLinks._hand_over``'s loop for IB): each departure of
    ``due`` whose port's way (``linkio.cable_way``) is a switch of the plane goes into ``local``
    (the peer switch port -> frames, with the Ethernet header the veth would carry: ``heads``),
    or nowhere when its switch is off; the others come back, for the veth. Also: how many were
    handed over."""
    rest: list[Departure] = []
    handed = 0
    # this call's verdict per sending port: (the peer's list, the header); True: the veth;
    # False: dropped (the switch is off)
    ways: dict[tuple[str, int], tuple[list[bytes], bytes] | bool] = {}
    for d in due:
        end = (d.switch, d.port)
        way = ways.get(end)
        if way is None:
            to = cable_way(end, peers, captured, carrier, powered)
            if isinstance(to, bool):
                way = to
            else:
                frames = local.get(to)
                if frames is None:
                    frames = local[to] = []
                way = (frames, heads(d.switch, d.port))
            ways[end] = way
        if way is True:
            rest.append(d)
        elif way is not False:
            assert isinstance(way, tuple)
            frames, head = way
            data: bytes = d.frame.meta
            frames.append(head + data[len(head):] if head else bytes(data))
            handed += 1
    return rest, handed
