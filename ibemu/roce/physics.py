"""The RoCE user datapath's queue settings in the link model's terms.

``ibemu.roce.queues.QueueConfig`` (what ``fabric:`` keys give the routers today) maps onto
``ibemu.physics``: ``buffer_kb`` -> ``EthConfig.buffer_bytes`` (per egress port, drop tail for
lossy priorities), ``ecn_mark_kb`` -> ``ecn_mark_bytes``, ``pfc`` -> ``lossless``,
``xoff_kb``/``xon_kb`` -> the thresholds per ingress port and priority, ``line_gbps`` -> a
:class:`~ibemu.physics.link.LinkModel` with Ethernet framing at that data rate (None without a
rate), ``delay_us`` -> its propagation. ``loss_pct`` (random loss on the cable) and
``dscp_priority`` (classification) stay the datapath's: the model takes a frame's priority as
given.
"""

from __future__ import annotations

from ibemu.physics.link import ETH_FRAMING_BYTES, LinkModel
from ibemu.physics.model import EthConfig
from ibemu.roce.queues import QueueConfig


def eth_config(cfg: QueueConfig) -> EthConfig:
    return EthConfig(buffer_bytes=int(cfg.buffer_kb * 1024), lossless=frozenset(cfg.pfc),
                     xoff_bytes=int(cfg.xoff_kb * 1024), xon_bytes=int(cfg.xon_kb * 1024),
                     ecn_mark_bytes=int(cfg.ecn_mark_kb * 1024))


def link_model(cfg: QueueConfig) -> LinkModel | None:
    """The routers' ports as the model's cable (None: no line rate, frames leave at once)."""
    if not cfg.line_gbps:
        return None
    return LinkModel(gbps=cfg.line_gbps, propagation_ns=cfg.delay_us * 1000, framing_bytes=ETH_FRAMING_BYTES)
