"""The RoCE user datapath's queue settings in the link model's terms.

``ibemu.roce.queues.QueueConfig`` (what ``fabric:`` keys give the routers) maps onto
``ibemu.physics``: ``buffer_kb`` -> ``EthConfig.buffer_bytes`` and the switch model's buffer
(per egress port, drop tail for lossy priorities), ``ecn_mark_kb`` -> ``ecn_mark_bytes``,
``pfc`` -> ``lossless``, ``xoff_kb``/``xon_kb`` -> the thresholds per ingress port and
priority, ``switch``/``latency_ns`` -> the :class:`~ibemu.physics.link.SwitchModel` (``eth``
unless named). The cables (rates, propagation) are the topology's, as IB's
(``physics.plan.cables_of``), with ``line_gbps`` overriding every rate and ``delay_us`` added
to every propagation. ``loss_pct`` (random loss on the cable) and ``dscp_priority``
(classification) stay the datapath's: the model takes a frame's priority as given.
"""

from __future__ import annotations

from ibemu.physics.link import SWITCH_MODELS, SwitchModel
from ibemu.physics.model import EthConfig
from ibemu.physics.plan import Cable, cables_of
from ibemu.roce.queues import QueueConfig
from ibemu.topo.model import Topology


def eth_config(cfg: QueueConfig) -> EthConfig:
    return EthConfig(buffer_bytes=int(cfg.buffer_kb * 1024), lossless=frozenset(cfg.pfc),
                     xoff_bytes=int(cfg.xoff_kb * 1024), xon_bytes=int(cfg.xon_kb * 1024),
                     ecn_mark_bytes=int(cfg.ecn_mark_kb * 1024))


def switch_model(cfg: QueueConfig) -> SwitchModel:
    """The routers' model: ``cfg.switch`` (default ``eth``), its latency unless overridden, the
    buffer ``cfg.buffer_kb``."""
    base = SWITCH_MODELS[cfg.switch or "eth"]
    if not base.ethernet:
        raise ValueError(f"switch model {base.name} is not an Ethernet switch")
    latency = base.latency_ns if cfg.latency_ns is None else int(cfg.latency_ns)
    return SwitchModel(base.name, latency, int(cfg.buffer_kb * 1024), ethernet=True)


def cables(topo: Topology, cfg: QueueConfig) -> list[Cable]:
    """``topo``'s cables for the model: the topology's rates and delays, ``cfg.line_gbps``
    overriding every rate, ``cfg.delay_us`` added to every delay."""
    return cables_of(topo, gbps=cfg.line_gbps, extra_delay_us=cfg.delay_us)
