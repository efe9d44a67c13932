"""Malformed input never crashes the session; a client waiting on a control reply gets one."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu.wire.umad import (
    CTL_LEN,
    MAX_CLIENTS,
    SIM_MAGIC,
    SIM_REQUEST_LEN,
    ClientInfo,
    CtlMessage,
    CtlType,
    SimRequest,
    UmadSession,
)
from tests.unit.umad.fakes import LocalSma

SENDER = b"\0sim:ctl77\0"


def ctl(magic: int = SIM_MAGIC, clientid: int = 0, type_: int = 3, length: int = 0,
        data: bytes = b"") -> bytes:
    return struct.pack("<IIII64s", magic, clientid, type_, length, data)


MALFORMED = [
    ("empty", b"", "ctl_bad_size"),
    ("one byte", b"\x01", "ctl_bad_size"),
    ("79 bytes", ctl()[:79], "ctl_bad_size"),
    ("81 bytes", ctl() + b"\0", "ctl_bad_size"),
    ("a sim_request", bytes(SIM_REQUEST_LEN), "ctl_bad_size"),
    ("big-endian magic", ctl(magic=0xEFBEADDE), "ctl_bad_magic"),
    ("zero magic", ctl(magic=0), "ctl_bad_magic"),
    ("type 0 (ERROR) as a request", ctl(type_=0), "ctl_bad_type"),
    ("type 11", ctl(type_=11), "ctl_bad_type"),
    ("type 0xffffffff", ctl(type_=0xFFFFFFFF), "ctl_bad_type"),
    ("clientid 10", ctl(clientid=10), "ctl_bad_client"),
    ("clientid 0xffffffff", ctl(clientid=0xFFFFFFFF, type_=2), "ctl_bad_client"),
    ("unconnected slot", ctl(clientid=3, type_=7), "ctl_bad_client"),
    ("SET_ISSM unconnected", ctl(clientid=0, type_=9, data=b"\1"), "ctl_bad_client"),
]


@pytest.mark.parametrize(("what", "datagram", "stat"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_control_gets_a_type_0_reply(what: str, datagram: bytes, stat: str) -> None:
    session = UmadSession(LocalSma())
    out = session.on_ctl(datagram, SENDER)
    assert out.reply is not None and len(out.reply) == CTL_LEN
    reply = CtlMessage.unpack(out.reply)
    assert reply.type == CtlType.ERROR and reply.magic == SIM_MAGIC
    assert out.attach is None
    assert session.stats[stat] == 1, dict(session.stats)
    assert len(session.clients) == 0


def test_unbound_sender_cannot_be_answered() -> None:
    session = UmadSession(LocalSma())
    for sender in (b"", "", None):
        assert session.on_ctl(ctl(), sender).reply is None
    assert session.stats["ctl_unreplyable"] == 3


def test_str_sender_address_is_accepted() -> None:
    session = UmadSession(LocalSma())
    data = ClientInfo(5).pack()
    out = session.on_ctl(ctl(type_=CtlType.CONNECT, data=data), "/tmp/some-path-socket")
    assert out.reply is not None and CtlMessage.unpack(out.reply).type == CtlType.CONNECT


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400), st.binary(max_size=40))
def test_random_control_datagrams_never_raise(datagram: bytes, sender: bytes) -> None:
    session = UmadSession(LocalSma())
    out = session.on_ctl(datagram, sender)
    if sender:
        assert out.reply is not None and len(out.reply) == CTL_LEN
    else:
        assert out.reply is None


ctl_messages = st.builds(
    lambda magic, clientid, type_, data: ctl(magic, clientid, type_, len(data), data),
    st.sampled_from([SIM_MAGIC, SIM_MAGIC, SIM_MAGIC, 0]),
    st.one_of(st.integers(0, 11), st.integers(0, 0xFFFFFFFF)),
    st.one_of(st.integers(0, 11), st.integers(0, 0xFFFFFFFF)),
    st.binary(max_size=64),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 14), ctl_messages | st.binary(max_size=100)), max_size=40))
def test_random_control_sequences_keep_invariants(ops: list[tuple[int, bytes]]) -> None:
    backend = LocalSma()
    session = UmadSession(backend)
    for pid, datagram in ops:
        out = session.on_ctl(datagram, f"\0sim:ctl{pid}\0".encode())
        assert out.reply is not None and len(out.reply) == CTL_LEN
        if out.attach is not None:
            assert CtlMessage.unpack(out.reply).type == CtlType.CONNECT
        assert len(session.clients) <= MAX_CLIENTS
        addrs = [c.ctl_addr for c in session.clients]
        assert len(addrs) == len(set(addrs))  # one slot per client socket
        sm = session.clients.sm_client() is not None
        assert bool(backend.capmask & 2) == sm  # port IsSM follows the clients


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.one_of(st.binary(max_size=600), st.binary(min_size=288, max_size=288)))
def test_random_data_datagrams_never_raise(slot: int, datagram: bytes) -> None:
    backend = LocalSma()
    session = UmadSession(backend)
    backend.deliver = lambda req: session.route(req)  # type: ignore[assignment,return-value]
    session.on_ctl(ctl(type_=CtlType.CONNECT, data=ClientInfo(1).pack()), SENDER)
    bounce = session.on_data(slot, datagram)
    assert bounce is None or len(bounce) == SIM_REQUEST_LEN


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=288, max_size=288), st.booleans())
def test_random_mads_from_the_fabric_route_or_refuse(raw: bytes, sm: bool) -> None:
    session = UmadSession(LocalSma())
    session.on_ctl(ctl(type_=CtlType.CONNECT, data=ClientInfo(1, issm=int(sm)).pack()), SENDER)
    routed = session.route(SimRequest.unpack(raw))
    if isinstance(routed, tuple):
        slot, payload = routed
        assert slot == 0 and len(payload) == SIM_REQUEST_LEN
        assert payload[33] in session.sm_classes or SimRequest.unpack(raw).is_response \
            or SimRequest.unpack(raw).status != 0
