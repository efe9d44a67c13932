"""Cables and switch models: data rates with their line encodings, serialization, propagation,
switch latency.

Rates. A :class:`~ibemu.topo.rates.LinkRate` names width x lane speed as the industry quotes it
(4x EDR = "100 Gb/s"). What a frame's serialization takes is the *data* rate: the signalling
rate less the line code. The figures used (IBA Vol 2 (physical layer), release 1.3-1.5, and
the IBTA roadmap; lanes, per direction):

=====  ===============  ====================================  ====================
speed  signalling Gb/s  line code                             data Gb/s per lane
=====  ===============  ====================================  ====================
SDR    2.5              8b/10b                                2.0
DDR    5.0              8b/10b                                4.0
QDR    10.0             8b/10b                                8.0
FDR10  10.3125          64b/66b                               10.0
FDR    14.0625          64b/66b                               13.636
EDR    25.78125         64b/66b                               25.0
HDR    53.125 (PAM4)    256b/257b + RS(544,514) FEC           50.0
NDR    106.25 (PAM4)    256b/257b + RS(544,514) FEC           100.0
XDR    212.5 (PAM4)     256b/257b + RS(544,514) FEC           200.0
=====  ===============  ====================================  ====================

So 4x EDR carries 100 Gb/s of data, 4x QDR 32 (not the quoted 40), 4x FDR 54.5 (not 56).
From HDR on the quoted figure is the data rate after FEC; the table keeps the signalling rate
for documentation only. An Ethernet port of the same quoted rate (100GBASE-R, 400GBASE-R) has
the same data rate: 64b/66b or 256b/257b + RS-FEC likewise.

Framing per frame, besides the code: an IB packet (LRH .. VCRC, the bytes ``PktLen`` counts
plus the VCRC) is framed by a start and an end delimiter: :data:`IB_FRAMING_BYTES` = 2 (one
symbol each; with 64b/66b the control blocks carry them, so this slightly overstates them;
idles between packets are not modelled). An Ethernet frame (destination MAC .. FCS) costs
:data:`ETH_FRAMING_BYTES` = 20 more on the wire: preamble 7, SFD 1, minimum inter-frame gap
12. A RoCEv2 frame of the same payload is therefore longer on the wire than its IB twin
(Ethernet + IP + UDP headers against an LRH, and 20 bytes of framing against 2): the two
fabric kinds differ where real ones do.

Propagation: ``delay_us`` when a cable states it, else its length at
:data:`NS_PER_METRE` = 5 ns/m (light in glass or twinax at ~0.67 c; copper DAC is 4.3-4.8 ns/m,
so 5 is a slightly slow, round figure).

Switch latency (:class:`SwitchModel`): the port-to-port latency vendors publish for an unloaded
switch, in ns, from the time a frame has arrived to the time it may start on its egress port:

- ``ib-edr`` 90: NVIDIA Switch-IB 2 / SB7800 product brief ("90ns port-to-port").
- ``ib-hdr`` 130: NVIDIA Quantum QM8700 product brief ("130ns").
- ``ib-ndr`` 130: Quantum-2 (QM9700): no figure published that we know of; taken as HDR's.
- ``eth-spectrum`` 300: NVIDIA Spectrum SN2700 ("300ns port-to-port", cut-through).
- ``eth`` 500: a generic datacenter Ethernet ASIC; published figures run from ~300 ns
  (cut-through, Spectrum) through ~450 ns (Broadcom Tomahawk class) to ~800 ns (Trident class,
  store-and-forward); 500 is a middle figure. Configurable per switch model in a scenario.

Deviation: the model is store-and-forward at every switch (a frame must have fully arrived
before its switch latency starts), so one hop costs switch latency + serialization +
propagation, the formula the benchmark checks. Real IB and cut-through Ethernet switches start
forwarding once the header is in, saving one serialization per hop when the egress is idle (at
4x EDR a 4 KiB packet serializes in 330 ns, so a cut-through path of 3 switches is ~1 us
shorter). Throughput and queueing are the same either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from ibemu.errors import ConfigError
from ibemu.topo.rates import LANE_GBPS, LinkRate

#: Per lane speed: (signalling Gb/s, line code, data Gb/s). See the module docstring.
LANE_CODING: dict[str, tuple[float, str, float]] = {
    "SDR": (2.5, "8b/10b", 2.0),
    "DDR": (5.0, "8b/10b", 4.0),
    "QDR": (10.0, "8b/10b", 8.0),
    "FDR10": (10.3125, "64b/66b", 10.0),
    "FDR": (14.0625, "64b/66b", 14.0625 * 64 / 66),
    "EDR": (25.78125, "64b/66b", 25.0),
    "HDR": (53.125, "PAM4 256b/257b + RS(544,514)", 50.0),
    "NDR": (106.25, "PAM4 256b/257b + RS(544,514)", 100.0),
    "XDR": (212.5, "PAM4 256b/257b + RS(544,514)", 200.0),
}
assert set(LANE_CODING) == set(LANE_GBPS)

IB_FRAMING_BYTES: Final = 2
"""Start and end delimiter of an IB packet on the wire (see the module docstring)."""
ETH_FRAMING_BYTES: Final = 20
"""Preamble (7), SFD (1) and the minimum inter-frame gap (12) of an Ethernet frame."""
NS_PER_METRE: Final = 5.0
"""Propagation delay of a cable per metre of length."""
MAX_CABLE_M: Final = 100_000.0
"""Longest cable a scenario may state (100 km: long-haul IB range extenders go that far)."""


def data_gbps(rate: LinkRate) -> float:
    """The data rate of ``rate`` in Gb/s: width x lane data rate after the line code."""
    return rate.width * LANE_CODING[rate.speed][2]


def signalling_gbps(rate: LinkRate) -> float:
    return rate.width * LANE_CODING[rate.speed][0]


@dataclass(frozen=True, slots=True)
class LinkModel:
    """One cable, one direction: data rate, framing overhead and propagation delay.

    ``serialization_ns(b)`` is what a frame of ``b`` bytes (IB: LRH .. VCRC; Ethernet:
    destination MAC .. FCS) occupies the wire, framing included, at the data rate.
    """

    gbps: float
    """Data rate (after the line code), Gb/s."""
    propagation_ns: float = 0.0
    framing_bytes: int = IB_FRAMING_BYTES
    rate: LinkRate | None = None
    """The width x speed it came from (None: a bare Gb/s figure)."""
    propagation: int = field(init=False, repr=False, compare=False, default=0)
    """``propagation_ns`` rounded to whole ns (the model's clock is integer ns); set once, not
    a property: the model reads it several times per frame and hop."""

    def __post_init__(self) -> None:
        if not self.gbps > 0 or not math.isfinite(self.gbps):
            raise ValueError(f"a link's data rate is a positive number of Gb/s, not {self.gbps!r}")
        if self.propagation_ns < 0 or self.framing_bytes < 0:
            raise ValueError("propagation delay and framing are not negative")
        object.__setattr__(self, "propagation", round(self.propagation_ns))  # (frozen)

    @classmethod
    def of(cls, rate: LinkRate, *, delay_us: float = 0.0, cable_m: float = 0.0,
           ethernet: bool = False) -> LinkModel:
        """The model of a cable of ``rate``: propagation ``delay_us`` if given, else ``cable_m``
        at :data:`NS_PER_METRE`; Ethernet framing when ``ethernet``."""
        return cls(gbps=data_gbps(rate), propagation_ns=propagation_ns(delay_us, cable_m),
                   framing_bytes=ETH_FRAMING_BYTES if ethernet else IB_FRAMING_BYTES, rate=rate)

    def serialization_ns(self, nbytes: int) -> float:
        return (nbytes + self.framing_bytes) * 8 / self.gbps

    def frame_ns(self, nbytes: int) -> int:
        """``serialization_ns`` rounded up to whole ns (the model's clock is integer ns)."""
        return math.ceil(self.serialization_ns(nbytes) - 1e-9)

    def byte_ns(self) -> float:
        return 8 / self.gbps


def propagation_ns(delay_us: float = 0.0, cable_m: float = 0.0) -> float:
    """One-way propagation: ``delay_us`` when stated, else the cable's length at 5 ns/m."""
    if delay_us < 0 or cable_m < 0:
        raise ValueError("delay and cable length are not negative")
    return delay_us * 1000.0 if delay_us else cable_m * NS_PER_METRE


@dataclass(frozen=True, slots=True)
class SwitchModel:
    """A switch's port-to-port latency and buffers.

    ``buffer_bytes`` is, for IB, each input port's receive buffer per data VL (what it
    advertises as credits, in 64-byte blocks); for Ethernet, each egress port's shared buffer
    (drop tail for lossy priorities).
    """

    name: str
    latency_ns: int
    buffer_bytes: int
    ethernet: bool = False

    def __post_init__(self) -> None:
        if self.latency_ns < 0:
            raise ValueError(f"switch latency is not negative ({self.latency_ns})")
        if self.buffer_bytes <= 0:
            raise ValueError(f"switch buffer must be positive ({self.buffer_bytes})")


#: Per-VL input buffer defaults: 32 KiB per VL per port is the order of Switch-IB class parts
#: (a few hundred KiB per port shared among the VLs); the Ethernet default, 1 MiB per port, is
#: ibemu's RoCE user datapath's ``buffer_kb`` default.
SWITCH_MODELS: dict[str, SwitchModel] = {
    "ib-edr": SwitchModel("ib-edr", 90, 32 * 1024),
    "ib-hdr": SwitchModel("ib-hdr", 130, 32 * 1024),
    "ib-ndr": SwitchModel("ib-ndr", 130, 32 * 1024),
    "eth-spectrum": SwitchModel("eth-spectrum", 300, 1024 * 1024, ethernet=True),
    "eth": SwitchModel("eth", 500, 1024 * 1024, ethernet=True),
}
"""Built-in switch models by name (see the module docstring for the sources)."""


def default_switch_model(rate: LinkRate, *, ethernet: bool) -> SwitchModel:
    """The model a switch gets when the scenario names none: by lane speed for IB (EDR and
    slower: ``ib-edr``; HDR: ``ib-hdr``; NDR and faster: ``ib-ndr``), ``eth`` for RoCE."""
    if ethernet:
        return SWITCH_MODELS["eth"]
    if LANE_GBPS[rate.speed] >= LANE_GBPS["NDR"]:
        return SWITCH_MODELS["ib-ndr"]
    if rate.speed == "HDR":
        return SWITCH_MODELS["ib-hdr"]
    return SWITCH_MODELS["ib-edr"]


def switch_model(name: str, where: str | None = None) -> SwitchModel:
    try:
        return SWITCH_MODELS[name]
    except KeyError:
        raise ConfigError(f"no switch model {name!r}; known: {', '.join(SWITCH_MODELS)}", where) from None
