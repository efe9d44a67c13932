"""The IB user datapath's frames into the link model, one loop per batch, compiled.

``LinkPlane.submit``'s per-frame work (a :class:`~ibemu.physics.model.Frame` from the frame's
bytes, then ``LivePlane.arrive``) as a function of its own, so that it is compiled with the
model (``ibemu.native``: one mypyc group, so the call into ``arrive`` is a C call and the loop
runs no bytecode); ``LinkPlane`` itself stays interpreted (its base class, the IO shared with
RoCE, is). Without the compiled twins this runs as it reads.
"""

from __future__ import annotations

from typing import Final

from ibemu.physics.live import LivePlane
from ibemu.physics.model import Frame

ETH_LEN: Final = 14


def hand_in(plane: LivePlane, switch: str, in_port: int, out: dict[int, list[bytes]], now: int,
            batch: set[int]) -> None:
    """Every frame of ``out`` (egress port -> frames with their Ethernet header), received on
    ``switch:in_port``, into ``plane`` at ``now``; their ids into ``batch``. A frame's size
    is LRH .. VCRC, its SL the LRH's, VL15 by its VL nibble, its key on the cable its LRH
    from the DLID on and its BTH (``linkplane.match_key``), its ``meta`` the frame itself."""
    for egress, frames in out.items():
        for f in frames:
            batch.add(id(f))
            fr = Frame(len(f) - ETH_LEN, f[ETH_LEN + 1] >> 4, egress, f[ETH_LEN + 2:ETH_LEN + 20],
                       False, False, f[ETH_LEN] >> 4 == 15, f)
            plane.arrive(switch, in_port, fr, now)
