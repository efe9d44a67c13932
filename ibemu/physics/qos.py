"""InfiniBand QoS as the SM programs it: VL counts, SL -> VL maps, VL arbitration tables.

Plain data (no wire bytes: ``ibemu.wire.madattrs`` encodes SLtoVLMappingTable and
VLArbitrationTable; the agents decode a Set into these objects).

- VL counts use PortInfo's VLCap / OperationalVLs code (IBA 14.2.5.6): 1 = VL0, 2 = VL0-1,
  3 = VL0-3, 4 = VL0-7, 5 = VL0-14. VL15 is the management VL on every port, apart from these.
- :class:`Sl2Vl`: 16 entries, SL -> VL. A data SL mapped to VL15 is dropped at that port (IBA
  7.6.6: VL15 is for SMPs only), as is one mapped to a VL the port does not operate.
- :class:`VlArb`: the high and low priority tables, each up to 64 (VL, weight) entries, weight
  in units of 64 bytes, and VLHighLimit (units of 4 KiB of high-priority data before a
  low-priority packet must be given its chance; 255 = no limit; 0 = one packet). The arbiter
  (:class:`Arbiter`) follows IBA 7.6.9: VL15 first; then the high table unless the high limit
  is spent and a low-priority packet is waiting; within a table, entry after entry, sending
  packets of the entry's VL while its remaining weight is positive (a packet may overshoot
  it; packets are never split), moving on when the weight is spent or the VL has nothing it
  may send. Entries of weight 0 are skipped.

Deviation: when a VL has nothing to send, the arbiter moves on and its entry's unspent weight
is lost for this round (IBA leaves the exact bookkeeping to the implementation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

VL15: Final = 15
NUM_SLS: Final = 16
ARB_ENTRIES: Final = 64
"""Entries a VL arbitration table may have at most (two 32-entry blocks)."""
ARB_BLOCK_ENTRIES: Final = 32
HIGH_LIMIT_UNLIMITED: Final = 255
HIGH_LIMIT_UNIT: Final = 4096
CREDIT_BYTES: Final = 64
"""IB flow control block: credits count 64-byte units."""

_VL_CODES = {1: 1, 2: 2, 3: 4, 4: 8, 5: 15}


def vls_of_code(code: int) -> int:
    """Data VLs a VLCap / OperationalVLs code stands for (1 -> 1, 2 -> 2, 3 -> 4, 4 -> 8, 5 -> 15)."""
    try:
        return _VL_CODES[code]
    except KeyError:
        raise ValueError(f"{code} is not a VL count code (1..5)") from None


def code_of_vls(vls: int) -> int:
    """The VLCap / OperationalVLs code of ``vls`` data VLs (1, 2, 4, 8 or 15)."""
    for code, n in _VL_CODES.items():
        if n == vls:
            return code
    raise ValueError(f"a port operates 1, 2, 4, 8 or 15 data VLs, not {vls}")


VL_COUNTS = tuple(_VL_CODES.values())


def blocks(nbytes: int) -> int:
    """Credits (64-byte blocks) a packet of ``nbytes`` takes."""
    return -(-nbytes // CREDIT_BYTES)


@dataclass(frozen=True, slots=True)
class Sl2Vl:
    """SL -> VL for one (input port, output port) pair of a switch, or one CA port."""

    vls: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.vls) != NUM_SLS or any(not 0 <= v <= VL15 for v in self.vls):
            raise ValueError(f"an SL -> VL map has 16 VLs within 0..15, got {self.vls!r}")

    @classmethod
    def default(cls, data_vls: int) -> Sl2Vl:
        """SL modulo the data VLs: with one VL every SL rides VL0."""
        return cls(tuple(sl % data_vls for sl in range(NUM_SLS)))

    def __getitem__(self, sl: int) -> int:
        return self.vls[sl]

    def problems(self, data_vls: int) -> list[str]:
        """What is wrong with this map on a port operating ``data_vls`` VLs."""
        out = []
        for sl, vl in enumerate(self.vls):
            if vl == VL15:
                out.append(f"SL{sl} -> VL15: VL15 carries SMPs only, data on it is dropped")
            elif vl >= data_vls:
                out.append(f"SL{sl} -> VL{vl}: the port operates VL0-{data_vls - 1} only")
        return out


@dataclass(frozen=True, slots=True)
class VlArb:
    """The VL arbitration tables of one egress port and its VLHighLimit."""

    high: tuple[tuple[int, int], ...] = ()
    low: tuple[tuple[int, int], ...] = ()
    high_limit: int = 0

    def __post_init__(self) -> None:
        for name, table in (("high", self.high), ("low", self.low)):
            if len(table) > ARB_ENTRIES:
                raise ValueError(f"the {name} priority table has at most {ARB_ENTRIES} entries")
            for vl, w in table:
                if not 0 <= vl < VL15 or not 0 <= w <= 255:
                    raise ValueError(f"a {name} priority entry is (VL 0..14, weight 0..255), got ({vl}, {w})")
        if not 0 <= self.high_limit <= 255:
            raise ValueError(f"VLHighLimit lies within 0..255, got {self.high_limit}")

    @classmethod
    def default(cls, data_vls: int) -> VlArb:
        """Every data VL once in the low table, weight 1: packet-by-packet round robin."""
        return cls(low=tuple((vl, 1) for vl in range(data_vls)))

    def starved(self, used_vls: Sequence[int]) -> list[int]:
        """The VLs among ``used_vls`` that no entry of positive weight serves: their packets
        never leave (a warning for a scenario, not an error: IBA allows the table)."""
        served = {vl for vl, w in (*self.high, *self.low) if w > 0}
        return sorted({vl for vl in used_vls if vl != VL15 and vl not in served})


@dataclass(slots=True)
class _TableState:
    idx: int = 0
    remaining: int = 0
    started: bool = False


@dataclass(slots=True)
class Arbiter:
    """IBA 7.6.9 VL arbitration of one egress port (see the module docstring)."""

    arb: VlArb
    _high: _TableState = field(default_factory=_TableState)
    _low: _TableState = field(default_factory=_TableState)
    _high_bytes: int = 0
    _high_pkts: int = 0
    _last: str | None = None
    _next: dict[int, tuple[int | None, ...]] = field(default_factory=dict, repr=False, compare=False)
    """VL -> for each entry i of the low table, the least k in 1..n such that entry i + k
    (cyclically) serves the VL with a positive weight (None: none does): ``pick_only``."""

    def pick(self, ready: Callable[[int], bool], queued: int = -1) -> int | None:
        """The VL to send from next; ``ready(vl)``: the VL has a packet it may send now
        (queued, and credits for it). ``queued``: a bit per VL that may hold packets (the
        others are skipped without asking ``ready``: the same choice, fewer calls with several
        VLs operated and one busy). Call :meth:`sent` once it is sent."""
        self._last = None
        if queued >> VL15 & 1 and ready(VL15):
            return VL15
        if not self.arb.high:  # (``ready`` has no side effects: the low table alone decides)
            vl = self._serve(self.arb.low, self._low, ready, queued)
            if vl is not None:
                self._last = "low"
            return vl
        low_ready = any(w > 0 and queued >> vl & 1 and ready(vl) for vl, w in self.arb.low)
        if not self._high_spent() or not low_ready:
            vl = self._serve(self.arb.high, self._high, ready, queued)
            if vl is not None:
                self._last = "high"
                return vl
        vl = self._serve(self.arb.low, self._low, ready, queued)
        if vl is not None:
            self._last = "low"
        return vl

    def pick_only(self, vl: int, ready: bool) -> bool:
        """:meth:`pick` when data VL ``vl`` is the only VL holding packets (``ready``: its
        head may be sent), for a port without a high-priority table: the same choice and the
        same table state, without scanning the table entry by entry (with eight VLs operated
        and one busy, most of a frame's arbitration). True: ``vl`` was picked."""
        self._last = None
        table = self.arb.low
        n = len(table)
        if not n:
            return False
        st = self._low
        if not st.started:
            st.idx, st.remaining, st.started = 0, table[0][1], True
        if n == 1:
            v, w = table[0]
            if w > 0:
                if st.remaining <= 0:
                    st.remaining = w
                if ready and v == vl:
                    self._last = "low"
                    return True
            st.idx, st.remaining = 0, w
            return False
        i = st.idx
        v, w = table[i]
        if ready and v == vl and w > 0 and st.remaining > 0:
            self._last = "low"
            return True
        nxt = self._next.get(vl)
        if nxt is None:
            nxt = self._next[vl] = tuple(
                next((k for k in range(1, n + 1) if table[(j + k) % n][0] == vl and table[(j + k) % n][1] > 0), None)
                for j in range(n))
        k = nxt[i] if ready else None
        if k is None:  # the scan went round the table (n + 1 entries) in vain
            st.idx = (i + 1) % n
            st.remaining = table[st.idx][1]
            return False
        st.idx = (i + k) % n
        st.remaining = table[st.idx][1]
        self._last = "low"
        return True

    def _high_spent(self) -> bool:
        lim = self.arb.high_limit
        if lim == HIGH_LIMIT_UNLIMITED:
            return False
        if lim == 0:
            return self._high_pkts >= 1
        return self._high_bytes >= lim * HIGH_LIMIT_UNIT

    @staticmethod
    def _serve(table: tuple[tuple[int, int], ...], st: _TableState,
               ready: Callable[[int], bool], queued: int = -1) -> int | None:
        n = len(table)
        if not n:
            return None
        if not st.started:
            st.idx, st.remaining, st.started = 0, table[0][1], True
        if n == 1:  # the loop below for one entry (the default with one data VL), unrolled
            vl, w = table[0]
            if w > 0:
                if st.remaining <= 0:
                    st.remaining = w
                if queued >> vl & 1 and ready(vl):
                    return vl
            st.idx, st.remaining = 0, w
            return None
        for _ in range(n + 1):
            vl, w = table[st.idx]
            if w > 0 and st.remaining > 0 and queued >> vl & 1 and ready(vl):
                return vl
            st.idx = (st.idx + 1) % n
            st.remaining = table[st.idx][1]
        return None

    def sent(self, vl: int, nbytes: int) -> None:
        """Account a packet of ``nbytes`` sent on ``vl``, the VL :meth:`pick` just chose."""
        if self._last == "high":
            self._high.remaining -= blocks(nbytes)
            self._high_bytes += nbytes
            self._high_pkts += 1
        elif self._last == "low":
            self._low.remaining -= blocks(nbytes)
            self._high_bytes = self._high_pkts = 0
        self._last = None
