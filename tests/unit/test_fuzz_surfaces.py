"""Small fuzz runs of every input surface the fuzz campaign covers (``benchmarks/bench_fuzz.py``
runs 100,000 inputs each): a few thousand seeded mutations of valid frames (``ibemu.testing.fuzz``),
no exception escapes, every link-bad frame is counted where a port counts it, and the findings
of the campaign stay fixed (a bad IPv4 header checksum decoded as RoCE, an unknown YAML tag
escaping the scenario loader as yaml's own error)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from ibemu.agents.ca import CaAgent
from ibemu.agents.device import DeviceAgent
from ibemu.agents.port import PortState
from ibemu.agents.switch import SwitchAgent
from ibemu.errors import ConfigError
from ibemu.testing.fuzz import Mutator
from ibemu.testing.loopback import exchanged_pair
from ibemu.wire import fast
from ibemu.wire import madcodec as mb
from ibemu.wire.madpacket import frame_mad
from ibemu.wire.rocecodec import RoceCodec
from ibemu.wire.umad import SIM_MAGIC, CtlType, SimRequest, UmadSession

REPO = Path(__file__).resolve().parents[2]
N = 3000


def _switch() -> SwitchAgent:
    sw = SwitchAgent(node_guid=0x11, num_ports=4, link_up=[True] * 4)
    sw.ports[0].lid = 7
    for p in (1, 2, 3):
        sw.ports[p].state = PortState.ACTIVE
    block = bytearray(b"\xff" * 64)
    block[1], block[3], block[9] = 1, 1, 3
    sw.lft.set_block(0, block)
    sw.lft.set_top(63)
    return sw


def _ca() -> CaAgent:
    ca = CaAgent(node_guid=0x22, num_ports=2, link_up=[True, True])
    ca.ports[1].lid = 9
    ca.ports[1].state = PortState.ACTIVE
    ca.set_is_sm(1, True)
    return ca


def _smp(mad: bytes, dlid: int = 0xFFFF) -> bytes:
    return frame_mad(mad, dlid=dlid, slid=0xFFFF if dlid == 0xFFFF else 1, dqp=0, sqp=0, vl=15, qkey=0)


def _dr(method: int, attr: int, path: list[int], mod: int = 0, data: bytes = b"") -> bytes:
    mad = bytearray(mb.dr_smp(method, attr, path=path, modifier=mod, data=data))
    mad[6] = 1  # arrived at its first hop
    return _smp(bytes(mad))


def _corpus(own: int, switch: bool) -> list[bytes]:
    out = [_dr(mb.GET, a, [1], m) for a in (0x10, 0x11, 0x12, 0x15, 0x16, 0x19, 0x20) for m in (0, 1)]
    out += [_smp(mb.lr_smp(mb.GET, 0x15, modifier=1), dlid=own), _dr(mb.SET, 0x15, [1], 1, bytes(64))]
    out += [frame_mad(mb.pma(mb.GET, a, data=mb.port_counters_select(1)), dlid=own, slid=1, dqp=1, sqp=1,
                      qkey=0x80010000) for a in (0x0001, 0x0012, 0x001D)]
    if switch:
        out += [_dr(mb.SET, 0x19, [1], 0, bytes([1] * 64)), _dr(mb.GET, 0x11, [1, 2, 3])]
    return out


@pytest.mark.parametrize("make", [_switch, _ca], ids=["switch", "ca"])
def test_agents_never_raise_and_count_every_link_bad_frame(make: type[DeviceAgent]) -> None:
    rng = random.Random(11)
    mut = Mutator(rng)
    agent = make()
    corpus = _corpus(7 if agent.IS_SWITCH else 9, agent.IS_SWITCH)
    bad = counted = 0
    for i in range(N):
        if i % 500 == 0:
            agent = make()
        port = rng.choice((1, 2))
        frame, link_bad, _what = mut.mutate(rng.choice(corpus))
        before, stats = agent.counters(port).port_rcv_errors, agent.stats.total()
        acts = agent.receive(port, frame)
        if link_bad:
            bad += 1
            counted += agent.counters(port).port_rcv_errors == before + 1
        else:  # answered, relayed or acted on, or counted: never dropped without a trace
            assert acts or agent.stats.total() > stats
    assert agent.stats["internal_error"] == 0
    assert bad > N // 4 and counted == bad


def test_forwarder_decide_and_its_fast_twin_agree_on_mutated_frames() -> None:
    rng = random.Random(12)
    mut = Mutator(rng)
    ref, quick = _switch(), _switch()
    corpus = [fast.NativeTemplate(slid=5, dlid=d, destqp=0x100).packet(0x04, 1, bytes(64)) for d in (1, 3, 7, 9, 40)]
    for _ in range(N):
        port = rng.choice((1, 2, 3))
        frame, link_bad, _what = mut.mutate(rng.choice(corpus))
        before = ref.counters(port).port_rcv_errors
        v = ref.forwarder.decide(frame, port)
        out: dict[int, list[bytes]] = {}
        if quick.forwarder.forward_run([bytes(14) + frame], 0, port, 14, out) == 0:
            quick.forwarder.decide(frame, port)
        else:
            assert out == {v.port: [bytes(14) + frame]}
        if link_bad:
            assert ref.counters(port).port_rcv_errors == before + 1
    names = type(ref.counters(1)).NAMES
    for p in (1, 2, 3):
        assert [getattr(ref.counters(p), n) for n in names] == [getattr(quick.counters(p), n) for n in names]


def test_mad_socket_session_answers_every_control_message_and_never_raises() -> None:
    from tests.unit.umad.fakes import LocalSma

    rng = random.Random(13)
    ident = bytes
    sender = b"\0sim:ctl77\0"
    ctls = [struct.pack("<IIII64s", SIM_MAGIC, 0, k, 0, b"") for k in (2, 3, 4, 5, 6, 7, 8, 10)]
    connect = struct.pack("<IIII64s", SIM_MAGIC, 0, CtlType.CONNECT, 0, struct.pack("<III32s", 77, 0, 0, b"\0sim:in77"))
    reqs = [SimRequest(0xFFFF, 0, 0, 0, mb.dr_smp(mb.GET, 0x11, path=[])).pack(),
            SimRequest(1, 0, 1, 1, mb.pma(mb.GET, 0x12)).pack()]
    mut_ctl = Mutator(rng, ((0, 4), (4, 4), (8, 4), (12, 4), (16, 4)), ident)
    mut_req = Mutator(rng, ((0, 2), (4, 2), (8, 4), (12, 4), (16, 4), (24, 8), (32, 1), (35, 1), (48, 2)), ident)
    session = UmadSession(LocalSma())
    session.on_ctl(connect, sender)
    for _ in range(N):
        if rng.random() < 0.5:
            out = session.on_ctl(mut_ctl.mutate(rng.choice([connect, *ctls]))[0], sender)
            assert out.reply is not None and len(out.reply) == 80
        else:
            dgram = mut_req.mutate(rng.choice(reqs))[0]
            before = session.stats.total()
            session.on_data(rng.choice((0, 0, 3)), dgram)
            if len(dgram) != 288:
                assert session.stats.total() == before + 1


def test_transport_counts_every_link_bad_packet() -> None:
    rng = random.Random(14)
    pair = exchanged_pair()
    a, b, corpus = pair.a, pair.b, pair.corpus
    assert len(corpus) > 5
    mut = Mutator(rng, ((0, 1), (2, 2), (6, 2), (8, 1), (10, 2), (13, 3), (17, 3), (20, 4), (24, 4)))
    for _ in range(N):
        pkt = rng.choice(corpus)
        frame, link_bad, _what = mut.mutate(pkt)
        hca = b if pkt[2:4] == b"\x00\x02" else a
        before = hca.stats.malformed + hca.stats.crc_errors
        hca.receive(frame)
        if link_bad:
            assert hca.stats.malformed + hca.stats.crc_errors == before + 1
        if rng.random() < 0.01:
            hca.tick(10**12)


def test_roce_codec_refuses_what_a_nic_drops() -> None:
    ips = {1: "198.18.0.1", 2: "198.18.0.2"}
    tx = RoceCodec(lid=1, ip=ips[1], lid_ips=ips, mac=b"\x02" * 6, peer_mac=b"\x04" * 6)
    rx = RoceCodec(lid=2, ip=ips[2], lid_ips=ips, mac=b"\x04" * 6, peer_mac=b"\x02" * 6)
    frame = bytes(tx.encapsulate(fast.NativeTemplate(slid=1, dlid=2, destqp=0x100).packet(0x04, 1, bytes(256))))
    assert rx.decapsulate(frame) is not None
    for at in (15, 22, 24, 25):  # TOS, TTL (both masked by the ICRC), the checksum itself: the campaign's finding
        bad = bytearray(frame)
        bad[at] ^= 0x01
        before = rx.stats.rx_malformed
        assert rx.decapsulate(bytes(bad)) is None, at
        assert rx.stats.rx_malformed == before + 1
    rng = random.Random(15)
    mut = Mutator(rng, ((14, 1), (16, 2), (20, 2), (23, 1), (26, 4), (30, 4), (36, 2), (38, 2), (42, 1)), bytes)
    for _ in range(N):
        out, _bad, what = mut.mutate(frame)
        got = rx.decapsulate(out)
        if what in ("truncated", "bad CRC"):  # the IP length no longer fits, or the ICRC fails
            assert got is None


def test_scenario_loader_refuses_unknown_yaml_tags_with_a_location() -> None:
    from ibemu.scenario.loader import loads_scenario

    for text, line in (("name: x\nrecord: !!python/object {}\n", 2), ("name: x\n!!python/object : 1\n", 2),
                       ("name: !custom x\n", 1), ("name: x\nrecord:\n  plots: !!python/name:os.system\n", 3)):
        with pytest.raises(ConfigError) as err:
            loads_scenario(text, source="s.yaml")
        assert f"s.yaml:{line}: unsupported YAML tag" in str(err.value)


def _text_mutations(rng: random.Random, text: str, tokens: list[str], n: int) -> list[str]:
    lines = text.splitlines(keepends=True)
    out = []
    for _ in range(n):
        ls = list(lines)
        i = rng.randrange(len(ls))
        k = rng.random()
        if k < 0.3:
            del ls[i]
        elif k < 0.7:
            words = ls[i].split(" ")
            words[rng.randrange(len(words))] = rng.choice(tokens)
            ls[i] = " ".join(words)
        else:
            ls[i] = ls[i][: rng.randrange(len(ls[i]) + 1)] + rng.choice(tokens) + "\n"
        out.append("".join(ls))
    return out


def test_scenario_loader_raises_only_located_config_errors() -> None:
    from ibemu.scenario.loader import loads_scenario

    rng = random.Random(16)
    tokens = ["-1", "0", "nan", "1e309", "[]", "{}", "null", "!!python/object", "!x", "&a", "*a", "h99", ":", "'",
              "k: 99999", "bogus: 1", "0x10000", "\t"]
    for text in _text_mutations(rng, (REPO / "scenarios" / "default.yaml").read_text(), tokens, 300):
        try:
            loads_scenario(text, source="f.yaml", base_dir=REPO / "scenarios")
        except ConfigError as exc:
            assert exc.where or str(exc).startswith("f.yaml:"), str(exc)


def test_ibnetdiscover_reader_raises_only_located_config_errors() -> None:
    from ibemu.topo.ibnetdiscover import loads

    rng = random.Random(17)
    tokens = ["Switch", "Ca", "36", "0", "-1", "[99]", "[1](2)", "\"", "lid", "4xHDR", "(", ")", "caguid=0x", "\0"]
    for text in _text_mutations(rng, (REPO / "scenarios" / "small-cluster.ibnd").read_text(), tokens, 300):
        try:
            loads(text, source="f.ibnd")
        except ConfigError as exc:
            assert exc.where or str(exc).startswith("f.ibnd:"), str(exc)


def test_ibnetdiscover_reader_refuses_a_bad_port_guid_with_a_location() -> None:
    """A CA port's GUID with an 'x' inside (the pattern admits it) raised int()'s ValueError:
    the fuzz campaign's finding."""
    from ibemu.topo.ibnetdiscover import loads

    text = (REPO / "scenarios" / "small-cluster.ibnd").read_text()
    lines = text.splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("[1](2c90300a1b011)"))
    lines[i] = lines[i].replace("(2c90300a1b011)", "(2c9030xa1b011)")
    with pytest.raises(ConfigError) as err:
        loads("\n".join(lines), source="f.ibnd")
    assert f"f.ibnd:{i + 1}" in str(err.value) and "bad port GUID" in str(err.value)
