"""``RocePort``: the HCA transport on a RoCE fabric — ``HcaPort`` with RoCEv2 frames on the cable.

The sans-IO transport (``ibemu.hca.transport``) is unchanged: it still speaks native packets
(LRH .. ICRC .. VCRC, addressed by LID). On the way out each packet becomes a RoCEv2 frame:
Ethernet to the first-hop router's MAC / IPv4 (DF, TTL 64) from this port's address to the
address its DLID maps to / UDP from a source port derived from the destination QP (ECMP
entropy: different QPs hash onto different paths) to 4791 / BTH .. pad / ICRC recomputed
over the RoCEv2 invariant fields (IBA A16.4: a pseudo-LRH of ones, IP and UDP with their
variant fields masked). On the way in the frame is checked (IPv4, UDP 4791, lengths, known
source, ours, ICRC) and becomes the native packet the transport expects (LRH from the address
table, fresh ICRC and VCRC). Malformed or unknown frames are counted in ``roce_stats``, never
raised.

The socket is an ``ETH_P_ALL`` packet socket (outgoing frames ignored) with a classic BPF
filter for UDP 4791 (and this process's QP range, when processes share the port): it sees
frames before tc ingress, where the host's guard (``netconf.guard_hosts``) drops them so the
host kernel never answers with ICMP.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping

from ibemu.hca.nic import PORT_BUFFER, HcaPort
from ibemu.hca.transport import Hca
from ibemu.hca.transport.actions import Send
from ibemu.hca.transport.hca import FIRST_QPN
from ibemu.kernel import sockfilter
from ibemu.kernel.packet import mac_address, open_packet_socket
from ibemu.roce.codec import RoceCodec, RoceStats
from ibemu.wire.roce import ROCEV2_UDP_PORT

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23


def socket_filter(qpns: tuple[int, int] | None = None) -> list[sockfilter.Insn]:
    """Classic BPF: IPv4 / UDP to 4791 [and BTH DestQP in ``qpns`` = (first, end)]."""
    if qpns is not None and not 2 <= qpns[0] < qpns[1] <= 1 << 24:
        raise ValueError("a QP range lies within 2 .. 2^24")
    drop = 8 if qpns is None else 12  # index of the final "ret 0"

    def unless(i: int, k: int) -> sockfilter.Insn:  # jeq k, else drop
        return (0x15, 0, drop - i - 1, k)

    prog: list[sockfilter.Insn] = [
        (0x28, 0, 0, 12),                    # 0: ldh [12]
        unless(1, 0x0800),                   # 1: IPv4
        (0x30, 0, 0, 23),                    # 2: ldb [23]
        unless(3, socket.IPPROTO_UDP),       # 3: UDP
        (0xB1, 0, 0, 14),                    # 4: ldxb 4*([14]&0xf): X = IP header length
        (0x48, 0, 0, 16),                    # 5: ldh [x+16]: UDP destination port
        unless(6, ROCEV2_UDP_PORT),          # 6: 4791
    ]
    if qpns is not None:
        prog += [
            (0x40, 0, 0, 26),                # 7: ld [x+26]: BTH word 1 (14 + IHL + 8 + 4)
            (0x54, 0, 0, 0xFFFFFF),          # 8: DestQP
            (0x35, 0, drop - 9 - 1, qpns[0]),  # 9: >= first, else drop
            (0x35, drop - 10 - 1, 0, qpns[1]),  # 10: >= end: drop
        ]
    prog += [(0x06, 0, 0, sockfilter.ACCEPT), (0x06, 0, 0, 0)]
    assert len(prog) == drop + 1
    return prog


class RocePort(HcaPort):
    """One host port on a RoCE fabric: ``HcaPort``'s API, RoCEv2 frames on the cable."""

    def __init__(self, sock: socket.socket, hca: Hca, peer_mac: bytes, *, ip: str,
                 lid_ips: Mapping[int, str], name: str = "", timestamps: bool = False) -> None:
        super().__init__(sock, hca, peer_mac, name=name, timestamps=timestamps)
        self.codec = RoceCodec(lid=hca.lid, ip=ip, lid_ips=lid_ips, mac=mac_address(sock), peer_mac=peer_mac)
        self.ip = ip

    @property
    def roce_stats(self) -> RoceStats:
        return self.codec.stats

    @classmethod
    def open(cls, ns: str | None, ifname: str, peer_mac: bytes, lid: int, *,  # type: ignore[override]
             ip: str, lid_ips: Mapping[int, str], mtu: int = 4096, port: int = 1, seed: int | None = None,
             name: str = "", qpns: tuple[int, int] | None = None, timestamps: bool = False) -> RocePort:
        """Open the port's socket on ``ifname`` in ``ns``. Blocking.

        ``peer_mac``: the first-hop router's interface; ``lid``/``ip``: this port's LID (what the
        transport calls it) and address; ``lid_ips``: LID -> address of every port it talks to.
        """
        sock = open_packet_socket(ns, ifname, ETH_P_ALL, bpf=socket_filter(qpns), buffer_bytes=PORT_BUFFER)
        try:
            sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
            hca = Hca(lid=lid, port=port, mtu=mtu, seed=seed, first_qpn=qpns[0] if qpns else FIRST_QPN)
            return cls(sock, hca, peer_mac, ip=ip, lid_ips=lid_ips, name=name or ifname, timestamps=timestamps)
        except BaseException:
            sock.close()
            raise

    def transmit(self, sends: Iterable[Send]) -> None:
        """Put the transport's packets on the cable as RoCEv2 frames (a full queue drops)."""
        send, encap = self.sock.send, self.codec.encapsulate
        n = 0
        for s in sends:
            frame = encap(s.packet)
            if frame is None:
                continue
            try:
                send(frame)
                n += 1
            except OSError:
                self.tx_dropped += 1
        self.tx_packets += n
        if n:
            self._rearm()

    def packet_of(self, frame: bytes) -> bytes | bytearray | memoryview | None:
        """The native packet a RoCEv2 frame carries (None, counted in ``roce_stats``, if it is
        not a good one of ours)."""
        return self.codec.decapsulate(frame)
