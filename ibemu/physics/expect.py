"""Analytic expectations of the model: what a measurement of it should give, by formula.

- One saturating flow: frames back to back at the data rate, so frame bytes arrive at
  ``gbps * size / (size + framing)``; over a finite run the first frame's path latency is
  lost once (:func:`flow_rate_gbps`).
- A store-and-forward path: every cable costs serialization + propagation, every switch its
  latency (:func:`path_latency_ns`); one hop, switch + serialization + propagation
  (:func:`hop_latency_ns`).
- N:1 incast into one port at line rate: each sender gets 1/N of the port (IB: the VL's FIFO
  serves arrivals in order, the senders' credits come back in turn; Ethernet: the same share
  of the frames that were not dropped); without PFC an Ethernet fabric drops (N - 1)/N of what
  the senders offer beyond the buffer, IB drops nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ibemu.physics.link import LinkModel
from ibemu.physics.qos import CREDIT_BYTES, blocks


def wire_efficiency(size: int, link: LinkModel) -> float:
    """Share of the data rate that frame bytes get (the rest is framing)."""
    return size / (size + link.framing_bytes)


def flow_rate_gbps(size: int, frames: int, link: LinkModel, path_ns: float) -> float:
    """Frame bytes per ns (Gb/s) of ``frames`` frames sent back to back, measured from the
    first frame's start to the last one's arrival (``path_ns``: one frame's path latency)."""
    ser = link.frame_ns(size)
    return frames * size * 8 / ((frames - 1) * ser + path_ns)


def hop_latency_ns(size: int, link: LinkModel, switch_latency_ns: float) -> float:
    """One switch hop: the switch's latency, then serialization and propagation on its egress."""
    return switch_latency_ns + link.frame_ns(size) + link.propagation


def path_latency_ns(size: int, links: Sequence[LinkModel], switch_latencies: Sequence[float]) -> float:
    """An unloaded store-and-forward path: each cable's serialization + propagation, each switch's
    latency (``len(links) == len(switch_latencies) + 1``)."""
    if len(links) != len(switch_latencies) + 1:
        raise ValueError("a path of n switches has n + 1 cables")
    return sum(lk.frame_ns(size) + lk.propagation for lk in links) + sum(switch_latencies)


def incast_share(senders: int) -> float:
    return 1.0 / senders


def credit_limited_gbps(size: int, buffer_bytes: int, link: LinkModel, switch_latency_ns: float) -> float:
    """One flow through one switch whose input buffer per VL is ``buffer_bytes``: a credit
    spent at the sender's start comes back after the frame's serialization and propagation in,
    the switch latency, its serialization out, and the propagation back, so at most
    ``buffer / frame`` frames are in that loop: min(line, frames x size / loop time)."""
    fit = (buffer_bytes // CREDIT_BYTES) // blocks(size)
    loop = 2 * (link.frame_ns(size) + link.propagation) + switch_latency_ns
    return min(link.gbps * wire_efficiency(size, link), fit * size * 8 / loop)


def incast_drops(senders: int, frames_each: int, size: int, buffer_bytes: int) -> int:
    """Frames a drop-tail port drops when ``senders`` send ``frames_each`` frames of ``size``
    into it at line rate each: while they all send, it forwards one frame in ``senders`` and
    keeps a full buffer; everything else is dropped."""
    return max(0, (senders - 1) * frames_each - buffer_bytes // size)
