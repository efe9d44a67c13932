"""UmadSession: slots, control replies, TID rewriting and routing (no sockets)."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest

from ibemu.wire.umad import (
    CTL_LEN,
    MAX_CLIENTS,
    STATUS_TIMEOUT,
    ClientInfo,
    CtlMessage,
    CtlType,
    Delivery,
    SimRequest,
    UmadSession,
    Vendor,
    unpack_port,
)
from tests.unit.umad.fakes import LID, NODE_GUID, LocalSma, smp_get


def ctl_addr(pid: int, base: str = "sim") -> bytes:
    return f"\0{base}:ctl{pid}\0".encode()


class Harness:
    """A session plus helpers that play clients by pid."""

    def __init__(self, **kwargs: object) -> None:
        self.backend = LocalSma(answer=False)
        self.session = UmadSession(self.backend, **kwargs)  # type: ignore[arg-type]
        self.slots: dict[int, int] = {}

    def ctl(self, pid: int, type_: int, data: bytes = b"", slot: int | None = None) -> CtlMessage:
        clientid = self.slots.get(pid, 0) if slot is None else slot
        out = self.session.on_ctl(CtlMessage(type_, clientid, data, len(data)).pack(), ctl_addr(pid))
        assert out.reply is not None and len(out.reply) == CTL_LEN
        return CtlMessage.unpack(out.reply)

    def connect(self, pid: int, issm: bool = False, nodeid: str = "") -> CtlMessage:
        out = self.session.on_ctl(
            CtlMessage(CtlType.CONNECT, 0, ClientInfo(pid, 0, int(issm), nodeid).pack(), 44).pack(),
            ctl_addr(pid))
        assert out.reply is not None
        reply = CtlMessage.unpack(out.reply)
        if reply.type == CtlType.CONNECT:
            assert out.attach is not None
            self.slots[pid] = out.attach.slot
        else:
            assert out.attach is None
        return reply

    def send(self, pid: int, req: SimRequest) -> bytes | None:
        return self.session.on_data(self.slots[pid], req.pack())


def routed(hx: Harness, req: SimRequest) -> tuple[int, bytes]:
    out = hx.session.route(req)
    assert isinstance(out, tuple), out
    return out


@pytest.fixture
def hx() -> Harness:
    return Harness()


def test_connect_reply_and_attach_address(hx: Harness) -> None:
    out = hx.session.on_ctl(
        CtlMessage(CtlType.CONNECT, 0, ClientInfo(4242, 5, 0).pack() + b"\x99" * 20, 64).pack(),
        ctl_addr(4242))
    assert out.reply is not None and out.attach is not None
    reply = CtlMessage.unpack(out.reply)
    assert reply.type == CtlType.CONNECT and reply.length == 64
    assert ClientInfo.unpack(reply.data) == ClientInfo(id=0, qp=5, issm=0, nodeid="h1")
    assert reply.data[44:] == b"\x99" * 20  # the rest of the data area is echoed
    assert out.attach.slot == 0 and out.attach.address == b"\0sim:in4242\0"
    assert CtlMessage.unpack(out.attach.error_reply).type == CtlType.ERROR


def test_ten_slots_then_refusal_and_lowest_free_slot_reused(hx: Harness) -> None:
    for pid in range(100, 100 + MAX_CLIENTS):
        assert hx.connect(pid).type == CtlType.CONNECT
    assert sorted(hx.slots.values()) == list(range(MAX_CLIENTS))
    assert hx.connect(999).type == CtlType.ERROR  # ibsim: "can't open new connection"
    assert hx.session.stats["connect_full"] == 1
    assert hx.ctl(103, CtlType.DISCONNECT).type == CtlType.DISCONNECT
    assert hx.ctl(105, CtlType.DISCONNECT).type == CtlType.DISCONNECT
    assert hx.connect(999).type == CtlType.CONNECT and hx.slots[999] == 3
    assert len(hx.session.clients) == MAX_CLIENTS - 1


def test_disconnect_unconnected_slot_is_fine_but_bad_slot_is_an_error(hx: Harness) -> None:
    assert hx.ctl(1, CtlType.DISCONNECT, slot=4).type == CtlType.DISCONNECT
    assert hx.ctl(1, CtlType.DISCONNECT, slot=10).type == CtlType.ERROR
    assert hx.ctl(1, CtlType.GET_PORT, slot=0xFFFFFFFF).type == CtlType.ERROR


def test_only_the_connecting_socket_may_use_a_slot(hx: Harness) -> None:
    hx.connect(1)
    assert hx.ctl(2, CtlType.GET_PORT, slot=0).type == CtlType.ERROR
    assert hx.ctl(2, CtlType.DISCONNECT, slot=0).type == CtlType.ERROR
    assert len(hx.session.clients) == 1
    assert hx.ctl(1, CtlType.GET_PORT).type == CtlType.GET_PORT
    assert hx.ctl(3, CtlType.GET_NODEINFO, slot=5).type == CtlType.ERROR  # not connected


def test_reconnect_from_same_socket_frees_the_stale_slot(hx: Harness) -> None:
    hx.connect(1)
    hx.connect(2)
    hx.ctl(1, CtlType.SET_ISSM, struct.pack("<i", 1))
    assert hx.connect(1).type == CtlType.CONNECT
    assert hx.slots[1] == 0 and len(hx.session.clients) == 2
    assert hx.session.stats["reconnect"] == 1
    assert hx.backend.issm_calls == [True, False]


def test_get_queries_answer_from_the_backend(hx: Harness) -> None:
    hx.connect(1)
    be = hx.backend
    assert unpack_port(hx.ctl(1, CtlType.GET_PORT).data) == (LID, 4)
    assert Vendor.unpack(hx.ctl(1, CtlType.GET_VENDOR, bytes(24)).data) == Vendor(0x02C9, 0x1017, 0, 1)
    assert hx.ctl(1, CtlType.GET_NODEINFO).data == be.node_info()
    assert hx.ctl(1, CtlType.GET_PORTINFO, b"\0").data == be.port_info()
    assert hx.ctl(1, CtlType.GET_PKEYS).data == b"\xff\xff" + bytes(62)
    gid = hx.ctl(1, CtlType.GET_GID).data
    assert gid[:8] == bytes.fromhex("fe80000000000000")
    assert gid[8:16] == struct.pack("<Q", NODE_GUID)  # host order, as ibsim copies it
    assert hx.ctl(1, CtlType.GET_GUID).data[:8] == struct.pack("<Q", NODE_GUID)


def test_portinfo_port_argument_reaches_the_backend(hx: Harness) -> None:
    seen: list[int] = []

    def port_info(port: int = 0) -> bytes:
        seen.append(port)
        return bytes(64)
    hx.backend.port_info = port_info  # type: ignore[method-assign]
    hx.connect(1)
    hx.ctl(1, CtlType.GET_PORTINFO, b"\x02")
    hx.ctl(1, CtlType.GET_PORTINFO, b"\x00")
    assert seen == [2, 0]


def test_backend_error_gets_an_error_reply(hx: Harness) -> None:
    def boom() -> bytes:
        raise RuntimeError("no")
    hx.backend.node_info = boom  # type: ignore[method-assign]
    hx.connect(1)
    assert hx.ctl(1, CtlType.GET_NODEINFO).type == CtlType.ERROR
    assert hx.session.stats["ctl_backend_error"] == 1


def test_issm_is_the_or_of_all_clients(hx: Harness) -> None:
    be = hx.backend
    hx.connect(1)
    hx.connect(2)
    hx.ctl(1, CtlType.SET_ISSM, struct.pack("<i", 1))
    hx.ctl(2, CtlType.SET_ISSM, struct.pack("<i", 1))
    assert be.issm_calls == [True] and be.capmask & 2
    hx.ctl(1, CtlType.SET_ISSM, struct.pack("<i", 0))
    assert be.issm_calls == [True]
    hx.session.client_gone(hx.slots[2])  # killed SM: IsSM must not stay set
    assert be.issm_calls == [True, False] and not be.capmask & 2


def test_connect_as_sm_sets_issm_and_second_sm_is_refused(hx: Harness) -> None:
    assert hx.connect(1, issm=True).type == CtlType.CONNECT
    assert hx.backend.issm_calls == [True]
    assert hx.connect(2, issm=True).type == CtlType.ERROR
    assert hx.session.stats["connect_sm_exists"] == 1
    hx.ctl(1, CtlType.DISCONNECT)
    assert hx.backend.issm_calls == [True, False]
    assert hx.connect(2, issm=True).type == CtlType.CONNECT


def test_sim_host_must_name_this_node(hx: Harness) -> None:
    assert hx.connect(1, nodeid="h2").type == CtlType.ERROR
    assert hx.connect(1, nodeid="h1").type == CtlType.CONNECT


# ------------------------------------------------------------------- data and TIDs


def dr_get(tid: int, attr: int = 0x11) -> SimRequest:
    return SimRequest(0xFFFF, 0xFFFF, 0, 0, smp_get(attr, tid))


def test_request_tid_gets_the_slot_and_response_is_routed_and_restored(hx: Harness) -> None:
    for pid in (10, 11, 12, 13):
        hx.connect(pid)
    tid = 0xBEEF_0001_0000_0042  # client bits 48-63 = 0xBEEF, agent id 1 in 32-47
    assert hx.send(13, dr_get(tid)) is None
    sent = hx.backend.sent[-1]
    assert sent.tid == (3 << 48) | 0x0001_0000_0042
    response = hx.backend.respond(sent)
    slot, raw = routed(hx, response)
    assert slot == 3
    assert SimRequest.unpack(raw).tid == tid


def test_without_restore_the_slot_stays_in_the_tid_like_ibsim() -> None:
    hx = Harness(restore_tid=False)
    hx.connect(1)
    hx.connect(2)
    hx.send(2, dr_get(0xBEEF_0000_0000_0001))
    slot, raw = routed(hx, hx.backend.respond(hx.backend.sent[-1]))
    assert slot == 1 and SimRequest.unpack(raw).tid == 0x0001_0000_0000_0001


def test_tid_memory_is_bounded() -> None:
    hx = Harness(tid_memory=8)
    hx.connect(1)
    for i in range(20):
        hx.send(1, dr_get((0xAAAA << 48) | i))
    client = hx.session.clients.get(0)
    assert client is not None and len(client.tids) == 8
    _, raw = routed(hx, hx.backend.respond(hx.backend.sent[0]))
    assert SimRequest.unpack(raw).tid == 0  # forgotten: delivered with the slot bits (0)
    _, raw = routed(hx, hx.backend.respond(hx.backend.sent[-1]))
    assert SimRequest.unpack(raw).tid == (0xAAAA << 48) | 19


def test_responses_and_trap_repress_from_a_client_keep_their_tid(hx: Harness) -> None:
    hx.connect(1)
    hx.connect(2)
    for method in (0x81, 0x07):
        mad = bytearray(smp_get(0x11, 0x7777_0000_0000_0009, directed=False))
        mad[3] = method
        hx.send(2, SimRequest(5, 0, 0, 0, bytes(mad)))
        assert hx.backend.sent[-1].tid == 0x7777_0000_0000_0009


def test_lid_routed_slid_is_filled_in_directed_route_left_alone(hx: Harness) -> None:
    hx.connect(1)
    hx.send(1, SimRequest(0x0005, 0, 1, 1, smp_get(0x11, 1, directed=False)))
    assert hx.backend.sent[-1].slid == LID
    hx.send(1, SimRequest(0x0005, 0x0009, 1, 1, smp_get(0x11, 2, directed=False)))
    assert hx.backend.sent[-1].slid == 9
    hx.send(1, SimRequest(0xFFFF, 0xFFFF, 0, 0, smp_get(0x11, 3)))
    assert hx.backend.sent[-1].slid == 0xFFFF


def test_undeliverable_request_goes_back_to_its_slot(hx: Harness) -> None:
    hx.connect(1)
    hx.connect(2)
    hx.send(2, dr_get(0x5555_0000_0000_0001, attr=0x12))  # SwitchInfo: the fake CA bounces it
    bounced = hx.backend.respond(hx.backend.sent[-1])
    assert bounced.status == STATUS_TIMEOUT and not bounced.is_response
    slot, raw = routed(hx, bounced)
    assert slot == 1
    back = SimRequest.unpack(raw)
    assert back.status == STATUS_TIMEOUT and back.tid == 0x5555_0000_0000_0001


def test_response_for_an_empty_slot_goes_nowhere(hx: Harness) -> None:
    hx.connect(1)
    resp = hx.backend.respond(dr_get(7 << 48))
    assert hx.session.route(resp) is Delivery.NO_CLIENT
    assert hx.session.route(hx.backend.respond(dr_get(0xFFFF << 48))) is Delivery.NO_CLIENT
    assert hx.session.stats["deliver_no_slot"] == 2


def trap(mgmt_class: int = 0x01) -> SimRequest:
    mad = bytearray(256)
    mad[0:4] = bytes([1, mgmt_class, 1, 0x05])
    struct.pack_into(">QH", mad, 8, 0x1234, 0x0002)
    return SimRequest(dlid=1, slid=2, dqp=0, sqp=0, mad=bytes(mad))


def test_unsolicited_mads_go_to_the_sm_client_only(hx: Harness) -> None:
    hx.connect(1)
    assert hx.session.route(trap()) is Delivery.NO_CLIENT
    assert hx.session.stats["deliver_no_sm"] == 1
    hx.connect(2)
    hx.connect(3)
    hx.ctl(3, CtlType.SET_ISSM, struct.pack("<i", 1))
    slot, raw = routed(hx, trap())
    assert slot == 2 and SimRequest.unpack(raw).tid == 0x1234  # unsolicited: TID untouched
    # a class the SM is not known to have registered would crash umad2sim: refused
    assert hx.session.route(trap(mgmt_class=0x04)) is Delivery.NO_CLIENT
    assert hx.session.stats["deliver_class_refused"] == 1


def test_bad_base_version_request_bounces_response_dropped(hx: Harness) -> None:
    hx.connect(1)
    bad = bytearray(smp_get(0x11, 0x42))
    bad[0] = 2
    raw = hx.send(1, SimRequest(0xFFFF, 0xFFFF, 0, 0, bytes(bad)))
    assert raw is not None
    back = SimRequest.unpack(raw)
    assert back.status == STATUS_TIMEOUT and back.tid == 0x42
    bad[3] = 0x81
    assert hx.send(1, SimRequest(0xFFFF, 0xFFFF, 0, 0, bytes(bad))) is None
    assert hx.backend.sent == [] and hx.session.stats["data_bad_mad"] == 2


def test_backend_send_failure_bounces_the_request(hx: Harness) -> None:
    def boom(req: SimRequest) -> None:
        raise OSError("fabric gone")
    hx.backend.send_mad = boom  # type: ignore[method-assign]
    hx.connect(1)
    raw = hx.send(1, dr_get(0x9))
    assert raw is not None and SimRequest.unpack(raw).status == STATUS_TIMEOUT
    assert hx.session.stats["data_backend_error"] == 1


def test_data_from_unconnected_slot_or_wrong_size_is_dropped(hx: Harness) -> None:
    assert hx.session.on_data(4, dr_get(1).pack()) is None
    hx.connect(1)
    assert hx.session.on_data(0, dr_get(1).pack()[:-1]) is None
    assert hx.session.on_data(0, b"") is None
    assert hx.session.stats["data_unconnected"] == 1
    assert hx.session.stats["data_bad_size"] == 2
    assert hx.backend.sent == []


def test_client_gone_frees_slot_and_forgets_tids(hx: Harness) -> None:
    hx.connect(1)
    hx.send(1, dr_get(0xAAAA << 48))
    pending = hx.backend.respond(hx.backend.sent[-1])
    hx.session.client_gone(0)
    assert len(hx.session.clients) == 0
    assert hx.session.route(pending) is Delivery.NO_CLIENT
    hx.connect(2)  # a new client in slot 0 never sees the old client's TID bits
    slot, raw = routed(hx, pending)
    assert slot == 0 and SimRequest.unpack(raw).tid == 0


def trap_repress(tid: int, dlid: int) -> SimRequest:
    mad = bytearray(256)
    mad[0:4] = bytes([1, 0x01, 1, 0x07])
    struct.pack_into(">QH", mad, 8, tid, 0x0002)
    return SimRequest(dlid=dlid, slid=0, dqp=0, sqp=0, mad=bytes(mad))


def switch_trap(tid: int, slid: int) -> SimRequest:
    return replace(trap(), slid=slid, mad=trap().mad[:8] + struct.pack(">Q", tid) + trap().mad[16:])


def test_trap_repress_tid_bits_32_47_repaired_per_issuer(hx: Harness) -> None:
    hx.connect(1, issm=True)
    # two switches, same trap counter, their GUID bits in 32-47 (as ibemu's switch SMA does)
    for tid, lid in ((0x1001_0000_0001, 0x10), (0x1002_0000_0001, 0x20)):
        routed(hx, switch_trap(tid, lid))
    # umad2sim writes the SM's agent id (here 3) into bits 32-47 of the TrapRepress
    hx.send(1, trap_repress(0x0003_0000_0001, dlid=0x20))
    hx.send(1, trap_repress(0x0003_0000_0001, dlid=0x10))
    assert [r.tid for r in hx.backend.sent] == [0x1002_0000_0001, 0x1001_0000_0001]
    assert hx.session.stats["tid_repaired"] == 2
    hx.send(1, trap_repress(0x0003_0000_0002, dlid=0x10))  # no such trap: left as it is
    assert hx.backend.sent[-1].tid == 0x0003_0000_0002


def test_trap_repress_not_repaired_in_ibsim_mode() -> None:
    hx = Harness(restore_tid=False)
    hx.connect(1, issm=True)
    routed(hx, switch_trap(0x1001_0000_0001, 0x10))
    hx.send(1, trap_repress(0x0003_0000_0001, dlid=0x10))
    assert hx.backend.sent[-1].tid == 0x0003_0000_0001


def test_backend_failures_in_connect_and_issm_never_escape(hx: Harness) -> None:
    def boom(on: bool) -> None:
        raise RuntimeError("no")
    hx.backend.set_issm = boom  # type: ignore[method-assign]
    assert hx.connect(1, issm=True).type == CtlType.CONNECT  # the slot is the client's anyway
    hx.session.client_gone(0)
    assert hx.session.stats["issm_backend_error"] == 2

    class Nameless(LocalSma):
        @property
        def node_name(self) -> str:
            raise RuntimeError("no name")

        @node_name.setter
        def node_name(self, value: str) -> None:
            pass
    session = UmadSession(Nameless())
    out = session.on_ctl(CtlMessage(CtlType.CONNECT, 0, ClientInfo(2).pack(), 44).pack(), ctl_addr(2))
    assert out.reply is not None and CtlMessage.unpack(out.reply).type == CtlType.ERROR
    assert session.stats["ctl_backend_error"] == 1 and len(session.clients) == 0
