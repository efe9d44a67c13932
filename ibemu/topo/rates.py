"""Link rates (width x lane speed, as IB names them) and MTUs."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ibemu.errors import ConfigError

#: Lane speeds by IB name, in the Gb/s the industry quotes per lane (4x EDR = 100G).
LANE_GBPS: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}
WIDTHS = (1, 2, 4, 8, 12)
#: Preference when a bare Gb/s figure maps to several width x speed pairs.
_WIDTH_PREFERENCE = (4, 1, 2, 8, 12)

IB_MTUS = (256, 512, 1024, 2048, 4096)

_WS_RE = re.compile(r"\s*(\d+)\s*[xX]\s*([A-Za-z0-9]+)\s*\Z")
_GBPS_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:G|Gb|Gbps|Gb/s|gbps)?\s*\Z", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class LinkRate:
    """A link rate as width x lane speed, e.g. ``LinkRate(4, "EDR")`` (100 Gb/s)."""

    width: int
    speed: str

    def __post_init__(self) -> None:
        if self.width not in WIDTHS:
            raise ValueError(f"bad link width {self.width}x")
        if self.speed not in LANE_GBPS:
            raise ValueError(f"bad lane speed {self.speed!r}")

    @property
    def gbps(self) -> float:
        return self.width * LANE_GBPS[self.speed]

    def __str__(self) -> str:  # the spelling ibnetdiscover prints
        return f"{self.width}x{self.speed}"


DEFAULT_RATE = LinkRate(4, "EDR")
DEFAULT_MTU = 4096


def _expected() -> str:
    return f"a rate like '4x EDR', 'HDR' or '100G' (speeds: {', '.join(LANE_GBPS)}; widths: {', '.join(f'{w}x' for w in WIDTHS)})"


def parse_rate(value: object, where: str | None = None) -> LinkRate:
    """Parse ``"4x EDR"``, ``"4xEDR"``, ``"EDR"`` (4x), ``"100G"``, ``100`` into a LinkRate."""
    if isinstance(value, LinkRate):
        return value
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"expected {_expected()}, got {value!r}", where)
    text = str(value).strip()
    m = _WS_RE.match(text)
    if m:
        width, speed = int(m.group(1)), m.group(2).upper()
        if width in WIDTHS and speed in LANE_GBPS:
            return LinkRate(width, speed)
        raise ConfigError(f"expected {_expected()}, got {text!r}", where)
    if text.upper() in LANE_GBPS:
        return LinkRate(4, text.upper())
    m = _GBPS_RE.match(text)
    if m:
        gbps = float(m.group(1))
        for width in _WIDTH_PREFERENCE:
            for speed, lane in LANE_GBPS.items():
                if speed != "FDR10" and abs(width * lane - gbps) < 1e-9:
                    return LinkRate(width, speed)
        raise ConfigError(f"no IB link runs at {text} Gb/s; expected {_expected()}", where)
    raise ConfigError(f"expected {_expected()}, got {text!r}", where)


def check_mtu(value: object, where: str | None = None) -> int:
    """Return ``value`` if it is an IB MTU (256..4096, powers of two), else raise ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in IB_MTUS:
        raise ConfigError(
            f"expected an IB MTU, one of {', '.join(map(str, IB_MTUS))}, got {value!r}", where
        )
    return value
