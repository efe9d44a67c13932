"""Transport timers: the local ACK timeout and the RNR NAK timer codes (IBA 9.7.6.1.3, 9.7.5.2.8)."""

from __future__ import annotations

# RNR timer field (5 bits) -> delay in milliseconds (IBA table 45).
RNR_TIMER_MS: tuple[float, ...] = (
    655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64, 0.96,
    1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92,
    122.88, 163.84, 245.76, 327.68, 491.52,
)
_RNR_TIMER_NS = tuple(round(ms * 1_000_000) for ms in RNR_TIMER_MS)


def ack_timeout_ns(timeout: int) -> int | None:
    """Local ACK timeout 4.096 us x 2^timeout; 0 means infinite (None)."""
    if not 0 <= timeout < 32:
        raise ValueError(f"timeout {timeout} is not a 5-bit value")
    if timeout == 0:
        return None
    return 4096 << timeout


def rnr_delay_ns(code: int) -> int:
    """Delay the requester waits after an RNR NAK carrying timer ``code``."""
    return _RNR_TIMER_NS[code & 0x1F]
