"""The link model's per-port state kept in lists on the ports (``EgressPort.vl_maps``,
``in_bytes`` / ``in_blocks``, ``ClassQueue``, the live plane's ``_Flight``) against the
plain rules they stand for: the SL -> VL map of (input, output) else (0, output) in whatever
order the maps and ports were set; a class queue's round robin between input ports as a dict
of deques serves it, through the lists' compaction; a cable's records as a deque keeps them."""

from __future__ import annotations

import random
from collections import deque

from hypothesis import given, settings
from hypothesis import strategies as st

from ibemu.physics.link import LinkModel
from ibemu.physics.live import _Flight
from ibemu.physics.model import ClassQueue, Frame, IbPortConfig, Node
from ibemu.physics.qos import Sl2Vl
from ibemu.topo.rates import parse_rate

EDR = LinkModel.of(parse_rate("4x EDR"), cable_m=2)


def _rule(sl2vl: dict[tuple[int, int], Sl2Vl], in_port: int, out_port: int) -> Sl2Vl | None:
    return sl2vl.get((in_port, out_port)) or sl2vl.get((0, out_port))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 6), st.integers(0, 3)), max_size=25),
       st.integers(0, 6))
def test_the_maps_per_input_port_follow_the_rule(sets: list[tuple[int, int, int]], ports_first: int) -> None:
    """Maps set before and after the ports exist, (0, out) before and after the others: the
    port's list gives what (in, out) else (0, out) of ``Node.sl2vl`` gives."""
    node = Node("s", "ib", switch=True)
    tables = [Sl2Vl(tuple((sl + k) % 4 for sl in range(16))) for k in range(4)]
    for num in range(1, ports_first + 1):
        node.add_port(num, EDR, ib=IbPortConfig(data_vls=4))
    for i, o, k in sets:
        node.set_sl2vl(i, o, tables[k])
    for num in range(ports_first + 1, 7):
        node.add_port(num, EDR, ib=IbPortConfig(data_vls=4))
    for out_port in range(1, 7):
        for in_port in range(0, 12):
            want = _rule(node.sl2vl, in_port, out_port)
            frame = Frame(100, sl=5)
            got = node._class_of(frame, in_port, out_port)
            assert got == (want[5] if want is not None else 5 % 4), (in_port, out_port)


def test_input_buffer_use_is_shown_per_input_port_and_vl() -> None:
    node = Node("s", "ib", switch=True, latency_ns=90)
    for num in (1, 2):
        node.add_port(num, EDR, ib=IbPortConfig(data_vls=2))
    node.connect(2, ("h", 1), None)
    frame = Frame(1000, vl=1)
    node.receive(1, frame, 0, 2)
    assert node.ingress_bytes[(1, 1)] == 1000 and node.ingress_blocks[(1, 1)] == 16
    assert sum(node.ingress_bytes.values()) == 1000
    node.advance(10_000)  # through the pipeline, onto the wire, off it: the buffer is free again
    assert not any(node.ingress_bytes.values()) and not any(node.ingress_blocks.values())
    assert Node("e", "eth", switch=True).ingress_blocks == {}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=300))
def test_a_class_queue_serves_its_input_ports_round_robin(ops: list[tuple[bool, int]]) -> None:
    """Appends and pops in any order, many more than the compaction's threshold: the same
    frames in the same order as a FIFO per input port served round robin (dict of deques)."""
    q = ClassQueue()
    ref: dict[int, deque[Frame]] = {}
    order: deque[int] = deque()
    for push, port in ops:
        if push or not order:
            f = Frame(64, flow=len(ops))
            q.append(f, port)
            sub = ref.setdefault(port, deque())
            if not sub:
                order.append(port)
            sub.append(f)
        else:
            key = order.popleft()
            want = ref[key].popleft()
            if ref[key]:
                order.append(key)
            assert q.head() is want
            assert q.popleft() is want
        assert len(q) == sum(len(s) for s in ref.values())
        assert list(q) == [f for s in ref.values() for f in s]


def test_a_cables_records_keep_their_order_through_compaction() -> None:
    rng = random.Random(3)
    fl = _Flight()
    ref: deque[tuple[object, int, int, int]] = deque()
    n = 0
    for _ in range(5000):
        r = rng.random()
        if r < 0.55 or not ref:
            rec = (n, n, 0, 1)
            n += 1
            fl.append(rec)
            ref.append(rec)
        elif r < 0.95:
            assert fl.first() == ref[0]
            assert fl.popleft() == ref.popleft()
        else:
            i = rng.randrange(min(len(ref), 16))
            assert fl.window(16) == list(ref)[:16]
            fl.remove(i)
            del ref[i]
        assert len(fl) == len(ref) and bool(fl) == bool(ref)
    assert list(fl) == list(ref)
