"""veth cables between namespaces, and their control: up/down, rate shaping, statistics.

Cables are created directly inside their two namespaces (never in the root namespace), one
``ip -batch`` for all of them. Runtime control goes through one netlink socket per namespace
(pyroute2), opened by entering the namespace from the calling thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyroute2 import IPRoute

from ibemu.kernel import netns, rtnl
from ibemu.kernel.commands import KernelError, batch, run

log = logging.getLogger(__name__)

ETH_HEADER = 14
IFF_LOWER_UP = 0x10000
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
    a_index: int | None = None
    b_index: int | None = None
    """Interface indexes of the two ends (None: the kernel picks). They must differ: see
    ``create_cables``."""


def create_cables(cables: Sequence[Cable]) -> None:
    """Create all veth pairs in one batch (their namespaces must exist).

    The two ends of a cable get different interface indexes when the plan gives them
    (``fabric.plan`` numbers every end of a fabric apart). The kernel reports a veth's carrier
    change at once only when the device's index differs from its peer's (linkwatch's
    "urgent" test compares ``ifindex`` with ``iflink``, the peer's index); otherwise the event
    waits for linkwatch's once-a-second run. Left to the kernel, ends in fresh namespaces
    often get equal indexes, and the far end of a cut cable learned of it 0.5-0.8 s late
    where the near end took 0.5 ms.
    """
    def end(ifname: str, ns: str, mtu: int, mac: str | None, index: int | None) -> str:
        return (f"{ifname} netns {ns} mtu {mtu}" + (f" address {mac}" if mac else "")
                + (f" index {index}" if index else ""))

    for c in cables:
        if c.a_index is not None and c.a_index == c.b_index:
            raise ValueError(f"cable {c.a_ns}/{c.a_if}: both ends have interface index {c.a_index}")
    batch("ip", [
        f"link add {end(c.a_if, c.a_ns, c.mtu, c.a_mac, c.a_index)} type veth "
        f"peer name {end(c.b_if, c.b_ns, c.mtu, c.b_mac, c.b_index)}"
        for c in cables
    ])


class LinkControl:
    """Netlink control of interfaces in many namespaces (one cached socket each).

    Blocking. A pyroute2 IPRoute must only be used by the thread that made it (used from
    another it silently returns stale answers), so sockets are cached per thread and
    namespace.
    """

    def __init__(self) -> None:
        self._sockets: dict[tuple[int, str], IPRoute] = {}
        self._index: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def _ipr(self, ns: str) -> IPRoute:
        key = (threading.get_ident(), ns)
        ipr = self._sockets.get(key)
        if ipr is None:
            with netns.entered(ns):
                ipr = IPRoute()
            with self._lock:
                self._sockets[key] = ipr
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
        """Bring interfaces up (one raw netlink round trip for the namespace)."""
        rtnl.set_up(ns, ifnames, True)

    def is_up(self, ns: str, ifname: str) -> bool:
        """Administrative state of the interface (IFF_UP)."""
        link = self._ipr(ns).get_links(self.index(ns, ifname))[0]
        return bool(link["flags"] & 1)

    def carrier(self, ns: str, ifname: str) -> bool:
        """Physical link: both veth ends up (IFF_LOWER_UP, set as soon as the peer is up)."""
        link = self._ipr(ns).get_links(self.index(ns, ifname))[0]
        return bool(link["flags"] & IFF_LOWER_UP)

    def without_carrier(self, ns: str, ifnames: Iterable[str]) -> list[str]:
        """Those of ``ifnames`` in ``ns`` whose carrier is still down (one netlink dump)."""
        return rtnl.carrier_down(ns, ifnames)

    def wait_carrier(self, ports: dict[str, list[str]], timeout_s: float = 5.0) -> None:
        """Wait until every listed interface (namespace -> names) has carrier.

        The kernel reports veth carrier changes through linkwatch, up to a second late.
        """
        deadline = time.monotonic() + timeout_s
        pending = dict(ports)
        while pending:
            pending = {ns: left for ns, names in pending.items() if (left := self.without_carrier(ns, names))}
            if not pending:
                return
            if time.monotonic() > deadline:
                ns, names = next(iter(pending.items()))
                raise KernelError(f"no carrier after {timeout_s} s on {ns}/{names[0]} "
                                  f"({sum(map(len, pending.values()))} ports)")
            time.sleep(0.02)

    def stats(self, ns: str, ifname: str) -> dict[str, int]:
        """rx/tx packets, bytes, drops of an interface."""
        link = self._ipr(ns).get_links(self.index(ns, ifname))[0]
        s = link.get_attr("IFLA_STATS64")
        return {k: int(s[k]) for k in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes",
                                       "rx_dropped", "tx_dropped", "rx_errors", "tx_errors")}

    def forget(self, ns: str) -> None:
        with self._lock:
            gone = [k for k in self._sockets if k[1] == ns]
            iprs = [self._sockets.pop(k) for k in gone]
            self._index = {k: v for k, v in self._index.items() if k[0] != ns}
        for ipr in iprs:
            ipr.close()

    def close(self) -> None:
        for ns in {k[1] for k in self._sockets}:
            self.forget(ns)


def shape(ns: str, ifname: str, rate_bps: int, *, burst_bytes: int | None = None,
          latency_ms: float = 50.0) -> None:
    """Limit egress of one interface with a token bucket (tbf)."""
    burst = burst_bytes or max(2 * VETH_MTU + ETH_HEADER, rate_bps // 8 // 250)  # ~4 ms of traffic
    run(["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", f"{rate_bps}bit",
         "burst", str(burst), "latency", f"{latency_ms}ms"])


def netem(ns: str, ifname: str, *, delay_us: float = 0.0, loss_pct: float = 0.0, have_netem: bool) -> None:
    """Delay and/or lose frames leaving ``ifname`` with netem, where the kernel has it.

    ``have_netem`` comes from ``ibemu.kernel.features.detect()``. Without netem this raises a
    KernelError that says what to do instead (the user datapath injects both itself).
    """
    if not have_netem:
        raise KernelError(
            f"{ns}/{ifname}: this kernel has no netem (sch_netem), so the kernel datapath cannot "
            "delay or lose frames; use fabric.datapath: user, whose forwarders inject both")
    args = ["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "netem"]
    if delay_us:
        args += ["delay", f"{delay_us}us"]
    if loss_pct:
        args += ["loss", f"{loss_pct}%"]
    run(args)
