"""The C twin of the MAD-socket hot path against the Python path it replaces, byte for byte.

``madtwin frame`` must put on the wire exactly what the CA agent frames for the same
directed-route SMP (``CaAgent.send_mad``: hop pointer, LRH/BTH/DETH, ICRC, VCRC), and leave
to the agent host everything the twin does not handle; ``madtwin reply`` must hand the client
exactly the datagram the agent host would (``CaAgent.receive`` -> ``CaMadPort`` ->
``UmadSession.route`` with the client's TID put back), and drop what the CA agent drops.
The program is run in its test modes (stdin -> hex lines): no sockets, no fabric.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import pytest

from ibemu.agents.actions import DeliverMad, Send
from ibemu.agents.ca import CaAgent
from ibemu.kernel import madtwin, sockfilter
from ibemu.wire.madpacket import frame_mad
from ibemu.wire.umad import SimRequest, mad_tid, rmpp_length, set_mad_tid

needs_binary = pytest.mark.skipif(not madtwin.available(), reason="madtwin is not built (make native)")

# Every SMP attribute OpenSM and infiniband-diags send directed-route.
ATTRS = (0x0010, 0x0011, 0x0012, 0x0014, 0x0015, 0x0016, 0x0017, 0x0018, 0x0019, 0x001B, 0x0020, 0x0030)
GET, SET = 0x01, 0x02
TAG = sockfilter.SM_OWN_TID_TAG.to_bytes(2, "big")


def dr_mad(rng: random.Random, method: int, attr: int, hops: int, *, port: int = 1) -> bytearray:
    mad = bytearray(rng.randbytes(256))  # every byte the twin must carry unchanged is random
    mad[0:4] = bytes((1, 0x81, 1, method))
    mad[4:8] = bytes((0, 0, 0, hops))  # D=0, status 0, HopPointer 0
    mad[16:18] = attr.to_bytes(2, "big")
    mad[18:20] = b"\0\0"
    mad[32:36] = b"\xff\xff\xff\xff"  # DrSLID, DrDLID permissive
    path = [0, port, *(rng.randint(1, 36) for _ in range(hops - 1))]
    mad[128:192] = bytes(path).ljust(64, b"\0")
    mad[192:256] = bytes(64)  # ReturnPath: filled in by the switches
    return mad


def request(mad: bytes | bytearray, **kw: int) -> bytes:
    fields = {"dlid": 0xFFFF, "slid": 0, "dqp": 0, "sqp": 0, "status": 0} | kw
    return SimRequest(fields["dlid"], fields["slid"], fields["dqp"], fields["sqp"], bytes(mad),
                      status=fields["status"]).pack()


def requests(seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [request(dr_mad(rng, method, attr, hops))
            for hops in (*range(1, 9), 31, 63) for attr in ATTRS for method in (GET, SET)]


def ca() -> CaAgent:
    return CaAgent(node_guid=0x0A1BE00200000001, num_ports=1, link_up=[True])


@needs_binary
def test_frames_equal_the_ca_agents_byte_for_byte() -> None:
    reqs = requests()
    got = madtwin.run_test_mode("frame", b"".join(reqs))
    agent = ca()
    want = []
    for raw in reqs:
        mad = bytearray(SimRequest.unpack(raw).mad)
        mad[8:10] = TAG  # the twin's TID tag, in place of the slot the MAD socket would write
        sends = [a for a in agent.send_mad(1, 0xFFFF, 0, 0, mad) if isinstance(a, Send)]
        assert len(sends) == 1 and sends[0].port == 1
        want.append(sends[0].packet.hex())
    assert len(got) == len(reqs) == 240  # 10 hop counts x 12 attributes x Get, Set
    assert got == want


@needs_binary
def test_what_the_twin_leaves_to_the_agent_host() -> None:
    rng = random.Random(2)

    def variant(**edit: int) -> bytes:
        mad = dr_mad(rng, GET, 0x0011, 3)
        for offset, value in edit.items():
            mad[int(offset[1:])] = value
        return request(mad)

    forwarded = [
        variant(o7=0),                          # HopCount 0: the local SMA answers
        variant(o7=64),                         # HopCount beyond 63: the CA agent returns 110
        variant(o6=1),                          # HopPointer set by the client: 110
        variant(o4=0x80),                       # D bit: a response travelling out
        variant(o3=0x81),                       # a GetResp
        variant(o3=0x05),                       # a Trap
        variant(o3=0x07),                       # a TrapRepress
        variant(o0=2),                          # BaseVersion 2: the agent host bounces it
        variant(o1=0x01),                       # LID-routed
        variant(o1=0x04),                       # PMA (GSI)
        variant(o32=0x00, o33=0x05),            # DrSLID set: a LID-routed head
        variant(o129=2),                        # InitialPath[1] is not our port
        request(dr_mad(rng, GET, 0x0011, 2), dqp=1),
        request(dr_mad(rng, GET, 0x0011, 2), status=110),
    ]
    out = madtwin.run_test_mode("frame", b"".join(forwarded))
    assert out == ["-"] * len(forwarded)
    # and with another port number, a request for port 1 is not ours either
    assert madtwin.run_test_mode("frame", requests()[0], port=2) == ["-"]


def response_to(frame_hex: str, rng: random.Random, *, hp: int = 1) -> bytearray:
    """The packet a DR request's response is when it reaches the CA again."""
    pkt = bytearray.fromhex(frame_hex)
    mad = bytearray(pkt[28:284])
    n = mad[7]
    mad[3] = 0x81
    mad[4] = 0x80 | (mad[4] & 0x7F)
    mad[6] = hp
    mad[64:128] = rng.randbytes(64)  # the attribute's data
    mad[192:192 + n + 1] = bytes([0, *(rng.randint(1, 36) for _ in range(n))])  # ReturnPath
    return bytearray(frame_mad(mad, dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15,
                               psn=rng.randrange(1 << 24)))


def agent_reply(agent: CaAgent, pkt: bytes | bytearray, client_tid: int) -> str:
    """What the agent host writes to the client for ``pkt``: '-' when the CA agent drops it."""
    got = [a for a in agent.receive(1, bytes(pkt)) if isinstance(a, DeliverMad)]
    if not got:
        return "-"
    d = got[0]
    mad = set_mad_tid(d.mad, client_tid)
    return SimRequest(dlid=d.dlid, slid=d.slid, dqp=d.dqp, sqp=d.sqp, mad=mad, status=d.status,
                      length=rmpp_length(d.mad)).pack().hex()


@needs_binary
def test_replies_equal_the_agent_hosts_and_bad_frames_are_dropped() -> None:
    rng = random.Random(3)
    reqs = requests(4)
    frames = madtwin.run_test_mode("frame", b"".join(reqs))
    agent = ca()
    pairs, want = [], []
    for raw, frame in zip(reqs, frames, strict=True):
        tid = mad_tid(SimRequest.unpack(raw).mad)
        cases = [response_to(frame, rng)]
        bad_icrc = response_to(frame, rng)
        bad_icrc[100] ^= 0x01                   # a bit flipped on the cable
        bad_vcrc = response_to(frame, rng)
        bad_vcrc[289] ^= 0x80
        relay = response_to(frame, rng, hp=2)   # a CA asked to relay: discarded
        cases += [bad_icrc, bad_vcrc, relay]
        for pkt in cases:
            pairs.append(raw + bytes(pkt))
            want.append(agent_reply(agent, pkt, tid))
    got = madtwin.run_test_mode("reply", b"".join(pairs))
    assert want.count("-") == 3 * len(reqs) and got == want
    # a response whose TID answers nothing pending is dropped (the agent host would pass it on)
    other = response_to(frames[0], rng)
    other[28 + 15] ^= 0xFF
    other = bytearray(frame_mad(other[28:284], dlid=0xFFFF, slid=0xFFFF, dqp=0, sqp=0, qkey=0, vl=15))
    assert madtwin.run_test_mode("reply", reqs[0] + bytes(other)) == ["-"]


@needs_binary
def test_the_filter_takes_only_tagged_dr_getresps() -> None:
    rng = random.Random(5)
    frame = bytes.fromhex(madtwin.run_test_mode("frame", requests()[0])[0])
    resp = response_to(frame.hex(), rng)
    eth = bytes(12) + b"\x88\xb5"
    assert sockfilter.matches(madtwin.TWIN_REPLIES, eth + bytes(resp))
    untagged = bytearray(resp)
    untagged[28 + 8:28 + 10] = b"\x00\x01"      # a MAD-socket slot's response: the CA agent's
    request_out = bytearray(frame)               # the twin's own request (method Get)
    lid_routed = bytearray(resp)
    lid_routed[28 + 1] = 0x01
    on_qp1 = bytearray(resp)
    on_qp1[15] = 1
    for pkt in (untagged, request_out, lid_routed, on_qp1):
        assert not sockfilter.matches(madtwin.TWIN_REPLIES, eth + bytes(pkt))
    # and the CA agent's own filter leaves exactly the tagged ones to the twin
    assert not sockfilter.matches(sockfilter.CA_MANAGEMENT, eth + bytes(resp))
    assert sockfilter.matches(sockfilter.CA_MANAGEMENT, eth + bytes(untagged))


def test_without_the_binary_one_notice_and_the_python_path(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(madtwin, "BINARY", Path("/nonexistent/madtwin"))
    monkeypatch.setattr(madtwin, "_noticed", False)
    monkeypatch.delenv(madtwin.ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=madtwin.__name__):
        assert not madtwin.enabled()
        madtwin.notice_if_missing()
        madtwin.notice_if_missing()
    assert [r.getMessage() for r in caplog.records] == [
        "/nonexistent/madtwin is not built (make native): OpenSM's SMPs take the agent host's Python path"]
    monkeypatch.setattr(madtwin, "_noticed", False)
    monkeypatch.setenv(madtwin.ENV, "0")  # turned off: no notice either
    caplog.clear()
    madtwin.notice_if_missing()
    assert not caplog.records
