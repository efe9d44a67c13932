"""Property: over a lossy, duplicating, reordering, corrupting cable, RC delivers every
message exactly once and in order, or ends in a reported error with the rest flushed."""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ibemu.hca.transport import QpState, WcStatus

from .harness import make_pair

SLOT = 5000

ops = st.lists(st.tuples(st.sampled_from(["write", "read", "send", "send_imm", "write_imm"]),
                         st.integers(0, 4200)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=ops, mtu=st.sampled_from([256, 1024, 4096]), seed=st.integers(0, 2**16),
       loss=st.sampled_from([0.0, 0.05, 0.2]), dup=st.sampled_from([0.0, 0.1]),
       reorder=st.sampled_from([0.0, 0.1]), corrupt=st.sampled_from([0.0, 0.05]),
       psn=st.sampled_from([0, (1 << 24) - 5]), ack_every=st.sampled_from([1, 4, 16]),
       late_recv=st.booleans(), window=st.sampled_from([3, 4096]))
def test_exactly_once_in_order_or_reported_error(msgs: list[tuple[str, int]], mtu: int, seed: int,
                                                 loss: float, dup: float, reorder: float,
                                                 corrupt: float, psn: int, ack_every: int,
                                                 late_recv: bool, window: int) -> None:
    p = make_pair(mtu=mtu, size=SLOT * 16, psn_a=psn, psn_b=psn ^ 0x5555, seed=seed, loss=loss,
                  dup=dup, reorder=reorder, corrupt=corrupt, timeout=6, ack_every=ack_every,
                  min_rnr_timer=3, max_inflight=window)
    recvs: list[tuple[int, int, int]] = []
    p.dst.buf[SLOT * 13 :] = p.src.buf[SLOT * 13 :]  # READ source
    sends: list[tuple[int, int, int | None]] = []  # (slot, size, imm)
    wrs = []
    for i, (kind, n) in enumerate(msgs):
        off = i * SLOT
        if kind.startswith("write"):
            imm = 0x1000 + i if kind == "write_imm" else None
            wrs.append(p.write(i, off, n, off, imm=imm))
            if imm is not None:
                recvs.append((100 + i, 0, 1))
                sends.append((-1, n, imm))
        elif kind == "read":
            wrs.append(p.read(i, SLOT * 13 + off % (SLOT * 3), n, off))
        else:
            imm = 0x2000 + i if kind == "send_imm" else None
            recvs.append((100 + i, off, SLOT))
            wrs.append(p.send(i, off, n, imm=imm))
            sends.append((off, n, imm))
    if not late_recv:
        for r in recvs:
            p.recv(*r)
    p.post(wrs[: len(wrs) // 2])
    p.post(wrs[len(wrs) // 2 :])
    if late_recv:  # SENDs meet an empty receive queue first: RNR NAKs, then retries
        p.link.run(until_ns=30_000)
        for r in recvs:
            p.recv(*r)
    steps = p.link.run(max_steps=200_000)
    assert steps < 200_000, "stuck"
    p.run()
    statuses = [w.status for w in p.wcs_a]
    event(f"retransmitted: {bool(p.qa.stats.retransmitted)}, error: {p.qa.state is QpState.ERROR}")
    event(f"rnr: {bool(p.qa.stats.rnr_naks_received)}")
    assert [w.wr_id for w in p.wcs_a] == list(range(len(msgs)))  # in order, once each
    ok = statuses.count(WcStatus.SUCCESS)
    if ok < len(msgs):  # an error is reported, then everything after it is flushed
        assert statuses[ok] in (WcStatus.RETRY_EXC_ERR,)
        assert statuses[ok + 1 :] == [WcStatus.WR_FLUSH_ERR] * (len(msgs) - ok - 1)
        assert p.qa.state is QpState.ERROR
        assert statuses[:ok] == [WcStatus.SUCCESS] * ok
    for i, (kind, n) in enumerate(msgs[:ok]):
        off = i * SLOT
        if kind.startswith("write"):
            assert p.dst.buf[off : off + n] == p.src.buf[off : off + n]
        elif kind == "read":
            s = SLOT * 13 + off % (SLOT * 3)
            assert p.sink.buf[off : off + n] == p.src.buf[s : s + n]
    # receives: exactly once, in order, a prefix of what was sent (all of it on success)
    got = [(w.byte_len, w.imm) for w in p.wcs_b if w.status is WcStatus.SUCCESS]
    want = [(n, imm) for _o, n, imm in sends]
    assert got == want[: len(got)]
    if ok == len(msgs):
        assert len(got) == len(want)
    for (off, n, _imm), _g in zip(sends, got, strict=False):
        if off >= 0:
            assert p.rbuf.buf[off : off + n] == p.src.buf[off : off + n]
