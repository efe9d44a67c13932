"""ibemu: a packet-level InfiniBand / RoCEv2 fabric emulator."""

__version__ = "0.1.0"
