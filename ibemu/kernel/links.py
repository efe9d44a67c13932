"""veth cables between namespaces, and their control: up/down, rate shaping, statistics.

Cables are created directly inside their two namespaces (never in the root namespace), one
``ip -batch`` for all of them. Runtime control goes through one netlink socket per namespace
(pyroute2), opened by entering the namespace from the calling thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyroute2 import IPRoute

from ibemu.kernel import netns
from ibemu.kernel.commands import KernelError, batch, run

log = logging.getLogger(__name__)

ETH_HEADER = 14
IB_MAX_PACKET = 8 + 40 + 12 + 28 + 4096 + 4 + 4 + 2  # LRH+GRH+BTH+ext+payload+pad+CRCs
VETH_MTU = 4400
"""MTU of every veth: an IB MTU 4096 packet with all headers fits (IPv4/UDP RoCEv2 too)."""


@dataclass(frozen=True, slots=True)
class Cable:
    """One veth pair: interface ``a_if`` in namespace ``a_ns``, ``b_if`` in ``b_ns``."""

    a_ns: str
    a_if: str
    b_ns: str
    b_if: str
    mtu: int = VETH_MTU
    a_mac: str | None = None
    b_mac: str | None = None


def create_cables(cables: Sequence[Cable]) -> None:
    """Create all veth pairs in one batch (their namespaces must exist)."""
    def end(ifname: str, ns: str, mtu: int, mac: str | None) -> str:
        return f"{ifname} netns {ns} mtu {mtu}" + (f" address {mac}" if mac else "")

    batch("ip", [
        f"link add {end(c.a_if, c.a_ns, c.mtu, c.a_mac)} type veth peer name {end(c.b_if, c.b_ns, c.mtu, c.b_mac)}"
        for c in cables
    ])


class LinkControl:
    """Netlink control of interfaces in many namespaces (one cached socket each).

    Thread-safe; blocking: call from a worker thread when inside trio.
    """

    def __init__(self) -> None:
        self._sockets: dict[str, IPRoute] = {}
        self._index: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _ipr(self, ns: str) -> IPRoute:
        with self._lock:
            ipr = self._sockets.get(ns)
            if ipr is None:
                with netns.entered(ns):
                    ipr = IPRoute()
                self._sockets[ns] = ipr
            return ipr

    def index(self, ns: str, ifname: str) -> int:
        key = (ns, ifname)
        idx = self._index.get(key)
        if idx is None:
            found = self._ipr(ns).link_lookup(ifname=ifname)
            if not found:
                raise KernelError(f"no interface {ifname} in {ns}")
            idx = self._index[key] = int(found[0])
        return idx

    def set_up(self, ns: str, ifname: str, up: bool = True) -> None:
        self._ipr(ns).link("set", index=self.index(ns, ifname), state="up" if up else "down")

    def all_up(self, ns: str, ifnames: Iterable[str]) -> None:
        ipr = self._ipr(ns)
        for name in ifnames:
            ipr.link("set", index=self.index(ns, name), state="up")

    def is_up(self, ns: str, ifname: str) -> bool:
        """Administrative state of the interface (IFF_UP)."""
        link = self._ipr(ns).get_links(self.index(ns, ifname))[0]
        return bool(link["flags"] & 1)

    def carrier(self, ns: str, ifname: str) -> bool:
        """Physical link: both veth ends up."""
        link = self._ipr(ns).get_links(self.index(ns, ifname))[0]
        return link.get_attr("IFLA_OPERSTATE") == "UP"

    def stats(self, ns: str, ifname: str) -> dict[str, int]:
        """rx/tx packets, bytes, drops of an interface."""
        link = self._ipr(ns).get_links(self.index(ns, ifname))[0]
        s = link.get_attr("IFLA_STATS64")
        return {k: int(s[k]) for k in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes",
                                       "rx_dropped", "tx_dropped", "rx_errors", "tx_errors")}

    def forget(self, ns: str) -> None:
        with self._lock:
            ipr = self._sockets.pop(ns, None)
            self._index = {k: v for k, v in self._index.items() if k[0] != ns}
        if ipr is not None:
            ipr.close()

    def close(self) -> None:
        for ns in list(self._sockets):
            self.forget(ns)


def shape(ns: str, ifname: str, rate_bps: int, *, burst_bytes: int | None = None,
          latency_ms: float = 50.0) -> None:
    """Limit egress of one interface with a token bucket (tbf)."""
    burst = burst_bytes or max(2 * VETH_MTU + ETH_HEADER, rate_bps // 8 // 250)  # ~4 ms of traffic
    run(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", f"{rate_bps}bit",
         "burst", str(burst), "latency", f"{latency_ms}ms"])
