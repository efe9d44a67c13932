"""ibemu: a packet-level InfiniBand / RoCEv2 fabric emulator."""

from ibemu.native import choose as _choose

__version__ = "0.1.0"

_choose()  # the compiled hot path where built and current, else its sources (ibemu.native)
