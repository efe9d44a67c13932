"""ibemu: a packet-level InfiniBand / RoCEv2 fabric emulator."""

import os as _os

__version__ = "0.1.0"

if _os.environ.get("IBEMU_NATIVE") == "0":  # the sources, not the compiled twins (ibemu.native)
    from ibemu.native import prefer_sources as _prefer_sources

    _prefer_sources()
