"""Make scapy safe for an emulator: building a packet must never touch the host's network.

scapy fills an unset Ethernet destination by resolving the IP destination, which can send
ARP / neighbour solicitations out of the machine's real interfaces. ibemu always sets MAC
addresses itself; clearing the resolvers makes an unset one the broadcast address instead,
with no traffic. Imported by every ibemu.wire module that builds Ethernet frames.
"""

from __future__ import annotations

import logging

from scapy.config import conf
from scapy.layers import inet, inet6, l2  # noqa: F401 - register their resolvers before clearing

conf.neighbor.resolvers.clear()
conf.verb = 0
logging.getLogger("scapy.runtime").setLevel(logging.ERROR)
