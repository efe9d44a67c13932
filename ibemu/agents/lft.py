"""Forwarding tables of a switch: the linear (unicast) FDB and the multicast FDB store.

``Lft`` holds LinearFDBCap entries (LID -> egress port, 0xFF = no route) written and read in
64-entry blocks, plus LinearFDBTop. Entries above the top are not routed (the spec:
packets to DLIDs above LinearFDBTop are discarded), so every mutator returns the *effective*
changes ``{lid: port}`` — exactly what a forwarding plane has to update.

``Mft`` stores MulticastForwardingTable blocks (32 LIDs x one 16-port mask) so an SM can
write and read them back; ibemu does not forward multicast.
"""

from __future__ import annotations

from typing import Final

NO_ROUTE: Final = 0xFF
BLOCK: Final = 64
MCAST_BASE: Final = 0xC000
MFT_BLOCK: Final = 32


class Lft:
    """The linear forwarding table of one switch."""

    __slots__ = ("_ports", "cap", "top")

    def __init__(self, cap: int = 49152) -> None:
        if not 0 < cap <= MCAST_BASE or cap % BLOCK:
            raise ValueError(f"LinearFDBCap must be a multiple of {BLOCK} in 64..{MCAST_BASE}, not {cap}")
        self.cap = cap
        self.top = 0
        self._ports: bytearray | memoryview = bytearray(b"\xff") * cap

    def bind(self, storage: memoryview) -> None:
        """Keep the table in ``storage`` (at least ``cap`` writable bytes) from now on, its
        current entries copied there: memory another party shares (the kernel SMA's raw LFT,
        ``ibemu.kernel.sma``), so an LFT Set either side answers is the other's at once."""
        if len(storage) < self.cap or storage.readonly:
            raise ValueError(f"LFT storage needs {self.cap} writable bytes")
        view = storage[: self.cap]
        view[:] = bytes(self._ports)
        self._ports = view

    @property
    def blocks(self) -> int:
        return self.cap // BLOCK

    def lookup(self, lid: int) -> int:
        """Egress port for ``lid`` (NO_ROUTE above LinearFDBTop, for LID 0, beyond the cap)."""
        if 0 < lid <= self.top:
            return self._ports[lid]
        return NO_ROUTE

    def raw(self, lid: int) -> int:
        """The stored entry, ignoring LinearFDBTop."""
        return self._ports[lid]

    def lids_to(self, port: int) -> list[int]:
        """The LIDs (0 < LID <= LinearFDBTop) whose entry is ``port`` (a scan of the bytes,
        not a call per LID)."""
        data = bytes(self._ports[: self.top + 1])
        out: list[int] = []
        i = data.find(port, 1)
        while i >= 0:
            out.append(i)
            i = data.find(port, i + 1)
        return out

    def get_block(self, block: int) -> bytes:
        self._check_block(block)
        return bytes(self._ports[block * BLOCK : (block + 1) * BLOCK])

    def set_block(self, block: int, ports: bytes | bytearray | memoryview) -> dict[int, int]:
        """Write one 64-entry block; returns the effective entries that changed."""
        self._check_block(block)
        if len(ports) != BLOCK:
            raise ValueError(f"an LFT block has {BLOCK} entries, not {len(ports)}")
        base = block * BLOCK
        old = bytes(self._ports[base : base + BLOCK])  # a copy: the storage may be a view
        new = bytes(ports)
        if old == new:
            return {}
        self._ports[base : base + BLOCK] = new
        top = self.top
        # the entries that differ, from the set bits of old XOR new (a reroute's Set changes
        # a few of the 64: no walk over all of them)
        changed: dict[int, int] = {}
        diff = int.from_bytes(old, "little") ^ int.from_bytes(new, "little")
        while diff:
            i = ((diff & -diff).bit_length() - 1) >> 3
            diff &= ~(0xFF << (i << 3))
            if 0 < base + i <= top:
                changed[base + i] = new[i]
        return changed

    def set_top(self, top: int) -> dict[int, int]:
        """Set LinearFDBTop; returns the effective entries that changed."""
        if not 0 <= top < self.cap:
            raise ValueError(f"LinearFDBTop {top} is beyond LinearFDBCap {self.cap}")
        old, self.top = self.top, top
        p = self._ports
        if top > old:
            return {lid: p[lid] for lid in range(max(old + 1, 1), top + 1) if p[lid] != NO_ROUTE}
        return {lid: NO_ROUTE for lid in range(max(top + 1, 1), old + 1) if p[lid] != NO_ROUTE}

    def effective(self) -> dict[int, int]:
        """Every routed LID and its port (to resynchronise a forwarding plane)."""
        p = self._ports
        return {lid: p[lid] for lid in range(1, self.top + 1) if p[lid] != NO_ROUTE}

    def _check_block(self, block: int) -> None:
        if not 0 <= block < self.blocks:
            raise IndexError(f"LFT block {block} is beyond LinearFDBCap {self.cap}")


class Mft:
    """MulticastForwardingTable blocks: (position, block) -> 64 bytes of 16-bit port masks."""

    __slots__ = ("_blocks", "cap", "num_ports")

    def __init__(self, cap: int, num_ports: int) -> None:
        self.cap = cap
        self.num_ports = num_ports
        self._blocks: dict[tuple[int, int], bytes] = {}

    def valid(self, position: int, block: int) -> bool:
        return block * MFT_BLOCK < self.cap and position <= self.num_ports // 16

    def get(self, position: int, block: int) -> bytes:
        return self._blocks.get((position, block), bytes(64))

    def set(self, position: int, block: int, data: bytes | bytearray | memoryview) -> None:
        self._blocks[(position, block)] = bytes(data[:64])
