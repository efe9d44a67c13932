"""Linear forwarding tables: the store, LFT Get/Set by SMP, effective updates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ibemu.agents.actions import AltUpdate, LftUpdate
from ibemu.agents.lft import NO_ROUTE, Lft
from ibemu.wire import madcodec as mb

from .fabrics import chain
from .minism import MiniSm


@given(block=st.integers(0, 3), top=st.integers(0, 255), old=st.binary(min_size=64, max_size=64),
       new=st.binary(min_size=64, max_size=64), same=st.lists(st.integers(0, 63), max_size=64))
def test_set_block_returns_exactly_the_entries_that_changed_under_the_top(
        block: int, top: int, old: bytes, new: bytes, same: list[int]) -> None:
    new_b = bytearray(new)
    for i in same:  # most Sets change a few entries of 64
        new_b[i] = old[i]
    lft = Lft(256)
    lft.set_top(top)
    lft.set_block(block, old)
    base = block * 64
    want = {base + i: new_b[i] for i in range(64) if old[i] != new_b[i] and 0 < base + i <= top}
    assert lft.set_block(block, new_b) == want
    assert lft.get_block(block) == bytes(new_b)


def test_store_blocks_top_and_effective_changes() -> None:
    lft = Lft(1024)
    assert lft.blocks == 16 and lft.lookup(5) == NO_ROUTE
    block = bytearray(b"\xff" * 64)
    block[5], block[9] = 3, 4
    assert lft.set_block(0, block) == {}  # top 0: nothing is routed yet
    assert lft.set_top(70) == {5: 3, 9: 4}
    assert lft.lookup(5) == 3 and lft.lookup(9) == 4 and lft.lookup(0) == NO_ROUTE
    block[9] = 7
    assert lft.set_block(0, block) == {9: 7}
    assert lft.set_block(0, block) == {}
    b1 = bytearray(b"\xff" * 64)
    b1[0], b1[20] = 2, 2  # LIDs 64 and 84; 84 is above the top
    assert lft.set_block(1, b1) == {64: 2}
    assert lft.set_top(100) == {84: 2}
    assert lft.set_top(8) == {9: NO_ROUTE, 64: NO_ROUTE, 84: NO_ROUTE}
    assert lft.effective() == {5: 3}
    assert lft.get_block(1) == bytes(b1)
    with pytest.raises(IndexError):
        lft.get_block(16)
    with pytest.raises(ValueError):
        lft.set_top(1024)


def test_lft_set_by_smp_emits_only_changed_entries() -> None:
    fab = chain(1)
    sm = MiniSm(fab, "sm")
    sm.discover()
    si = sm.ok([1], 0x12)
    sm.ok([1], 0x12, method=mb.SET, data=mb.switch_info_set(si, linear_fdb_top=0xBFFF))
    fab.lft_updates["s1"].clear()
    block = bytearray(b"\xff" * 64)
    block[1:4] = bytes([6, 5, 5])
    got = sm.ok([1], 0x19, mod=0, method=mb.SET, data=bytes(block))
    assert got == bytes(block)
    assert fab.lft_updates["s1"] == [LftUpdate({1: 6, 2: 5, 3: 5})]
    block[3] = 6
    sm.ok([1], 0x19, mod=0, method=mb.SET, data=bytes(block))
    assert fab.lft_updates["s1"][-1] == LftUpdate({3: 6})
    sm.ok([1], 0x19, mod=0, method=mb.SET, data=bytes(block))  # unchanged: no update
    assert len(fab.lft_updates["s1"]) == 2
    high = bytearray(b"\xff" * 64)
    high[63] = 2
    sm.ok([1], 0x19, mod=767, method=mb.SET, data=bytes(high))  # the last block of 49152
    assert fab.lft_updates["s1"][-1] == LftUpdate({767 * 64 + 63: 2})
    assert sm.ok([1], 0x19, mod=0) == bytes(block)
    assert sm.ok([1], 0x19, mod=767) == bytes(high)
    assert sm.ok([1], 0x19, mod=5) == b"\xff" * 64
    assert [e.fields["changed"] for e in fab.events_of("lft_set", "s1")] == [3, 1, 1]


def test_routes_programmed_by_the_mini_sm() -> None:
    fab = chain(3)
    nodes = MiniSm(fab, "sm").bring_up()
    lid = {n.description: n.lid for n in nodes.values()}
    s2 = fab.agents["s2"]
    assert s2.lft.lookup(lid["sm"]) == 1 and s2.lft.lookup(lid["h"]) == 3
    assert s2.lft.lookup(lid["s2"]) == 0
    merged: dict[int, int] = {}
    for upd in fab.lft_updates["s2"]:
        merged.update(upd.changes)
    assert merged == s2.lft.effective()


def test_bind_keeps_the_table_in_storage_another_party_shares() -> None:
    """After ``bind`` the table lives in the given memory: what the other party writes there
    is what the LFT reads, what the LFT writes is there; changes are still computed right."""
    lft = Lft(128)
    lft.set_block(0, bytes([1] * 64))
    lft.set_top(100)
    shared = bytearray(b"\0" * 200)
    lft.bind(memoryview(shared))
    assert shared[:64] == bytes([1] * 64) and shared[64:128] == b"\xff" * 64  # copied over
    shared[70] = 3  # the kernel answered an LFT Set
    assert lft.lookup(70) == 3 and lft.get_block(1)[6] == 3
    assert lft.set_block(1, bytes([3] * 64)) == {lid: 3 for lid in range(64, 101) if lid != 70}
    assert shared[64:128] == bytes([3] * 64)
    with pytest.raises(ValueError):
        lft.bind(memoryview(bytearray(10)))


def test_alternate_ports_vendor_attribute_set_get_and_bad_input() -> None:
    """AlternatePorts (0xFF30, ibemu's vendor attribute): modifier = LID >> 4, 16 LIDs of 4
    bytes; a Set that changes the block emits ``AltUpdate`` (normalized: nothing after the
    first 0, no fourth byte); a port beyond the switch's or a block beyond the LFT is refused."""
    fab = chain(1)
    sm = MiniSm(fab, "sm")
    sm.discover()
    assert sm.ok([1], 0xFF30, mod=2) == bytes(64)  # none yet
    data = bytearray(64)
    data[4:8] = bytes([3, 5, 0, 0])  # LID 33: ports 3 then 5
    data[8:12] = bytes([4, 0, 6, 9])  # LID 34: port 4 (the rest after the 0 is ignored)
    got = sm.ok([1], 0xFF30, mod=2, method=mb.SET, data=bytes(data))
    want = bytearray(64)
    want[4:6], want[8] = bytes([3, 5]), 4
    assert got == bytes(want) and sm.ok([1], 0xFF30, mod=2) == bytes(want)
    assert fab.alt_updates["s1"] == [AltUpdate(32, bytes(want))]
    sm.ok([1], 0xFF30, mod=2, method=mb.SET, data=bytes(data))  # unchanged: no update
    assert len(fab.alt_updates["s1"]) == 1
    bad = bytearray(64)
    bad[0] = 9  # the switch has 8 ports
    assert mb.status(sm.query([1], 0xFF30, mod=2, method=mb.SET, data=bytes(bad)).mad) == 0x1C
    assert mb.status(sm.query([1], 0xFF30, mod=49152 // 16).mad) == 0x1C
    assert sm.ok([1], 0xFF30, mod=2) == bytes(want) and len(fab.alt_updates["s1"]) == 1
