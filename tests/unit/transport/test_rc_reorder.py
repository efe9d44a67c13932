"""The RC responder under reordering (adaptive routing): IBA's in-order responder NAKs and
the requester goes back N; with a reorder window the responder holds requests ahead of ePSN
and executes them in PSN order, with no NAK and no retransmission. Both count the arrivals
ahead of ePSN (``out_of_order``)."""

from __future__ import annotations

import pytest

from .harness import make_pair


def _writes(window: int, *, reorder: float = 0.3, loss: float = 0.0, seed: int = 7) -> tuple[object, bool]:
    p = make_pair(mtu=256, reorder=reorder, loss=loss, seed=seed, reorder_window=window)
    p.post([p.write(i, i * 3000, 3000, i * 3000) for i in range(8)])  # 12 packets each
    p.run()
    ok = [w.wr_id for w in p.wcs_a] == list(range(8)) and p.dst.buf[:24000] == p.src.buf[:24000]
    return p, ok


def test_in_order_responder_naks_reordered_writes_and_recovers() -> None:
    p, ok = _writes(0)
    assert ok
    st = p.qb.stats  # type: ignore[attr-defined]
    assert p.link.stats.reordered > 0  # type: ignore[attr-defined]
    assert st.out_of_order > 0 and st.seq_naks_sent > 0
    assert p.qa.stats.retransmitted > 0  # type: ignore[attr-defined]


def test_reorder_window_places_reordered_writes_without_naks() -> None:
    p, ok = _writes(128)  # every packet of the 8 WRITEs is posted at once: 96 PSNs in flight
    assert ok
    st = p.qb.stats  # type: ignore[attr-defined]
    assert p.link.stats.reordered > 0  # type: ignore[attr-defined]
    assert st.out_of_order > 0 and st.seq_naks_sent == 0
    assert p.qa.stats.retransmitted == 0 and p.qa.stats.timeouts == 0  # type: ignore[attr-defined]
    assert not p.qb.resp._held  # type: ignore[attr-defined]


def test_reorder_window_with_sends_keeps_completion_order() -> None:
    p = make_pair(mtu=256, reorder=0.3, seed=3, reorder_window=128)
    for i in range(10):
        p.recv(i, i * 1000, 1000)
    p.post([p.send(i, i * 1000, 700) for i in range(10)])
    p.run()
    assert [w.wr_id for w in p.wcs_b] == list(range(10))
    assert p.qb.stats.seq_naks_sent == 0 and p.qb.stats.out_of_order > 0
    assert all(p.rbuf.buf[i * 1000 : i * 1000 + 700] == p.src.buf[i * 1000 : i * 1000 + 700] for i in range(10))


@pytest.mark.parametrize("window", [2, 128])
def test_reorder_window_with_losses_still_delivers_everything(window: int) -> None:
    p, ok = _writes(window, loss=0.05, seed=5)
    assert ok
    assert p.qa.stats.retransmitted > 0  # type: ignore[attr-defined]


def test_reorder_window_is_checked() -> None:
    with pytest.raises(ValueError, match="reorder window"):
        make_pair(reorder_window=-1)
