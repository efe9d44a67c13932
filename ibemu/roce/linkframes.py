"""The RoCE user datapath's frames into the link model, one loop per batch, compiled.

``RoceLinks.submit``'s per-frame work (a :class:`~ibemu.physics.model.Frame` from the frame's
bytes, then ``LivePlane.arrive``) as a function of its own, so that it is compiled with the
model (``ibemu.native``: one mypyc group, so the call into ``arrive`` is a C call), as the IB
user datapath's ``fabric.linkframes.hand_in`` is; ``RoceLinks`` itself stays interpreted (its
base class, the IO shared with IB, is). Without the compiled twins this runs as it reads.
"""

from __future__ import annotations

from typing import Final

from ibemu.physics.live import LivePlane
from ibemu.physics.model import Frame

FCS: Final = 4
"""The Ethernet FCS, which the veth does not carry and the cable does."""
MIN_FRAME: Final = 64


def match_key(frame: bytes | bytearray) -> bytes:
    """What identifies a RoCE frame on a cable at both ends: IP ID, addresses, UDP header and
    BTH (``frame`` with its Ethernet header); what a router rewrites is left out."""
    return bytes(frame[18:20]) + bytes(frame[26:54])


def hand_in(plane: LivePlane, router: str, in_port: int, out: dict[int, list[bytes | bytearray]], now: int,
            prio: bytes) -> None:
    """Every frame of ``out`` (egress port -> rewritten frames), received on
    ``router:in_port``, into ``plane`` at ``now``. A frame's model size is its bytes plus the
    FCS (at least 64), its priority ``prio[TOS]``, ECN-capable for ECT(0) and ECT(1), its key on
    the cable :func:`match_key`, its ``meta`` the frame itself."""
    for egress, frames in out.items():
        for f in frames:
            tos = f[15]
            ecn = tos & 3
            n = len(f) + FCS
            fr = Frame(n if n > MIN_FRAME else MIN_FRAME, prio[tos], egress, bytes(f[18:20]) + bytes(f[26:54]),
                       ecn == 1 or ecn == 2, False, False, f)
            plane.arrive(router, in_port, fr, now)
