"""The port model: physical and logical state, the spec's state machine, PortInfo bytes.

Logical PortState (IBA 7.2): Down -> Init when the physical link comes up (LinkUp); the SM
moves Init -> Armed -> Active one step at a time with SubnSet(PortInfo); a link going down
takes the port to Down from any state. PortPhysicalState: Polling (no link), LinkUp,
Disabled (by the SM: the link stays down until the SM sets Polling again).

Set semantics implemented by ``Port.apply_set`` (atomic: any invalid field -> 0x001C and
nothing changes):

- PortState 0 no change; 1 Down = link down request: the port drops to Down and, its
  physical link being up, retrains straight back to Init (the peer drops to Init too:
  ``LinkRequestKind.RETRAIN``); 2 Init only as a no-op on an Init port; 3 Armed from Init
  or Armed; 4 Active from Armed or Active. Armed/Active need PortPhysicalState LinkUp.
  Other values are invalid. Repeating the current state is accepted (a retried Set).
- PortPhysicalState 0 no change; 2 Polling re-enables a Disabled port; 3 Disabled takes the
  link down. Other values are invalid.
- LID must be unicast (< 0xC000); NeighborMTU 1..MTUCap; OperationalVLs 0 (no change) or
  1..VLCap; LinkWidthEnabled/LinkSpeedEnabled 0 (no change), all-ones (= supported) or a
  subset of the supported set.
- OperationalVLs starts at VLCap (VL0-VL7), as real ports do (qib and hfi1 set their operational
  VLs to the supported ones at init) and as ibsim's do (``op_vls = VLCap`` when it cables a
  port). An SM reads it before it changes it: OpenSM masks every SL -> VL and VL arbitration
  entry it writes by the OperationalVLs it last read, and programs QoS in its first sweep,
  before its own PortInfo Sets; a port that started at VL0 only read back all zeros there.
- Switch external ports ignore the port-0-only fields (M_Key, GIDPrefix, LID, MasterSMLID,
  LMC, MasterSMSL, SubnetTimeOut); switch port 0 ignores the link fields and accepts any
  PortState 2..4 (it has no link). CapabilityMask is read-only to the SM.

M_Key (IBA 14.2.4; checked by ``DeviceAgent._mkey_check``, stored here). A switch has one
M_Key, in port 0's PortInfo; each CA port has its own, and guards the SMPs arriving on it.
An SMP passes the check when the port's M_Key is 0 or equals the SMP's. When it does not:

- SubnGet with M_KeyProtectBits 0 or 1 is answered anyway; with 1, a PortInfo answer
  carries M_Key 0 (level 0 shows the key);
- SubnGet with protect bits 2 or 3, and every SubnSet and SubnTrapRepress at any level
  (the spec's check applies to Sets whatever the protect bits: level 0 protects the
  configuration, not its reading), is dropped without a response. M_KeyViolations counts it
  (saturating at 0xFFFF), trap 256 (Bad M_Key: the requester's LID and DrSLID, method,
  attribute, modifier, the key it carried, the directed route) goes to the port's
  MasterSMLID, repeated until repressed, and, with a non-zero M_KeyLeasePeriod, the lease
  countdown starts (if none runs). An SMP with a valid key stops the countdown; when it
  runs out the protect bits become 0 and the M_Key stays (a new SM may read it, then Set).

Levels 2 and 3 make the same check here, as Linux's software SMAs do (they compare the
protect bits with 2): whatever the spec distinguishes at level 3 beyond that is not
modelled (OpenSM never writes 3: it caps the protect bits at 2). An M_Key
of 0 with protect bits 0, the reset state, is exactly the behaviour without a key.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from enum import IntEnum

from ibemu.agents.counters import PortCounters


class PortState(IntEnum):
    NO_CHANGE = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4


class PhysState(IntEnum):
    NO_CHANGE = 0
    SLEEP = 1
    POLLING = 2
    DISABLED = 3
    TRAINING = 4
    LINK_UP = 5
    ERROR_RECOVERY = 6
    PHY_TEST = 7


class Cap(IntEnum):
    """PortInfo CapabilityMask bits used here."""

    IS_SM = 1 << 1
    IS_NOTICE_SUPPORTED = 1 << 2
    IS_TRAP_SUPPORTED = 1 << 3
    IS_SL_MAPPING_SUPPORTED = 1 << 6
    IS_SYSTEM_IMAGE_GUID_SUPPORTED = 1 << 11
    IS_EXTENDED_SPEEDS_SUPPORTED = 1 << 14
    IS_CM_SUPPORTED = 1 << 16
    IS_VENDOR_CLASS_SUPPORTED = 1 << 20


SWITCH_PORT0_CAPS = (Cap.IS_TRAP_SUPPORTED | Cap.IS_SL_MAPPING_SUPPORTED
                     | Cap.IS_SYSTEM_IMAGE_GUID_SUPPORTED | Cap.IS_EXTENDED_SPEEDS_SUPPORTED)
CA_PORT_CAPS = (Cap.IS_TRAP_SUPPORTED | Cap.IS_SL_MAPPING_SUPPORTED
                | Cap.IS_SYSTEM_IMAGE_GUID_SUPPORTED | Cap.IS_EXTENDED_SPEEDS_SUPPORTED
                | Cap.IS_CM_SUPPORTED)

WIDTH_CODES = {1: 0x01, 4: 0x02, 8: 0x04, 12: 0x08, 2: 0x10}  # lanes -> LinkWidth bit
WIDTH_SUPPORTED = 0x1F  # every width code a Set may name


@functools.cache
def widths_supported(lanes: int) -> int:
    """LinkWidthSupported of a ``lanes``-lane port: every width up to its own."""
    return sum(code for n, code in WIDTH_CODES.items() if n <= lanes)
# speed name -> (LinkSpeedActive, LinkSpeedExtActive)
SPEED_CODES = {"SDR": (1, 0), "DDR": (2, 0), "QDR": (4, 0),
               "FDR": (4, 1), "EDR": (4, 2), "HDR": (4, 4), "NDR": (4, 8)}
SPEED_SUPPORTED = 0x7  # SDR | DDR | QDR


@functools.cache
def ext_speeds_supported(speed: str) -> int:
    """LinkSpeedExtSupported of a port whose top speed is ``speed`` (FDR 1 .. NDR 0xF)."""
    code = SPEED_CODES[speed][1]
    return (code << 1) - 1 if code else 0
MTU_CODES = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}

STATUS_INVALID = 0x001C
MAX_UNICAST_LID = 0xBFFF

_PI = struct.Struct("!QQHHIHH" + "B" * 16 + "HHHBBBBHB3sHBB")
assert _PI.size == 64

VL_ARB_HIGH_CAP = 8
"""PortInfo.VLArbitrationHighCap: entries of the high-priority VL arbitration table (block 3)."""
VL_ARB_LOW_CAP = 8
"""PortInfo.VLArbitrationLowCap: entries of the low-priority table (block 1)."""


@dataclass(slots=True)
class SetOutcome:
    """What a PortInfo Set changed, for the agent to act on."""

    status: int = 0
    state_before: PortState = PortState.DOWN
    phys_before: PhysState = PhysState.POLLING
    link_request: str | None = None  # a LinkRequestKind value
    retrained: bool = False
    lid_changed: bool = False


@dataclass(slots=True)
class Port:
    """One port of a device (switch port 0 is the management port: ``is_port0``)."""

    num: int
    is_switch: bool = False
    width: int = 4
    speed: str = "EDR"
    mtu: int = 4096
    vl_cap: int = 4  # VL0..VL7
    state: PortState = PortState.DOWN
    phys: PhysState = PhysState.POLLING
    capability_mask: int = 0
    m_key: int = 0
    gid_prefix: int = 0xFE80000000000000
    lid: int = 0
    lmc: int = 0
    master_sm_lid: int = 0
    master_sm_sl: int = 0
    m_key_lease_period: int = 0
    m_key_protect: int = 0
    link_down_default: int = 2  # Polling
    link_width_enabled: int = 0
    link_speed_enabled: int = SPEED_SUPPORTED
    link_speed_ext_enabled: int = 0
    neighbor_mtu: int = 0
    operational_vls: int = 0
    """PortInfo.OperationalVLs (a VLCap code); 0 at construction: VLCap, as real ports and ibsim's
    start (the SM may lower it while the port is Init)."""
    vl_high_limit: int = 0
    hoq_life: int = 0x10
    vl_stall_count: int = 7
    partition_flags: int = 0  # PartitionEnforcementIn/Out, FilterRawIn/Out (4 bits)
    m_key_violations: int = 0
    m_key_lease_deadline: int = 0
    """Monotonic ns at which the M_Key lease runs out (0: no countdown; not a PortInfo field)."""
    p_key_violations: int = 0
    q_key_violations: int = 0
    client_reregister: int = 0
    subnet_timeout: int = 0
    resp_time_value: int = 0x10
    error_thresholds: int = 0
    """PortInfo byte 53: LocalPhyErrors (high nibble) and OverrunErrors (low) thresholds, as
    an SM set them (OpenSM writes 8/8 and compares what it reads back: a port that forgot them
    got a PortInfo Set in every sweep)."""
    pkeys: list[int] = field(default_factory=list)
    counters: PortCounters = field(default_factory=PortCounters)

    def __post_init__(self) -> None:
        if self.width not in WIDTH_CODES:
            raise ValueError(f"port {self.num}: link width must be one of {sorted(WIDTH_CODES)} lanes")
        if self.speed not in SPEED_CODES:
            raise ValueError(f"port {self.num}: link speed must be one of {sorted(SPEED_CODES)}")
        if self.mtu not in MTU_CODES:
            raise ValueError(f"port {self.num}: MTU must be one of {sorted(MTU_CODES)}")
        if not self.link_width_enabled:
            self.link_width_enabled = WIDTH_CODES[self.width]
        if not self.neighbor_mtu:
            self.neighbor_mtu = MTU_CODES[self.mtu]
        if not self.operational_vls:
            self.operational_vls = self.vl_cap
        if not self.link_speed_ext_enabled:
            self.link_speed_ext_enabled = ext_speeds_supported(self.speed)

    # ------------------------------------------------------------------ state

    @property
    def is_port0(self) -> bool:
        return self.is_switch and self.num == 0

    @property
    def link_is_up(self) -> bool:
        return self.phys == PhysState.LINK_UP

    def owns_lid(self, dlid: int) -> bool:
        """True when ``dlid`` is one of this port's LIDs (LID with the LMC bits masked)."""
        return self.lid != 0 and (dlid >> self.lmc) == (self.lid >> self.lmc)

    def physical_up(self) -> bool:
        """The link trained: LinkUp, Down -> Init. Returns True if anything changed."""
        if self.phys in (PhysState.LINK_UP, PhysState.DISABLED):
            return False
        self.phys = PhysState.LINK_UP
        if self.state == PortState.DOWN:
            self.state = PortState.INIT
        return True

    def physical_down(self) -> bool:
        """The link went away: Polling (unless Disabled), Down. Returns True if anything changed."""
        changed = self.phys == PhysState.LINK_UP or self.state != PortState.DOWN
        if self.phys != PhysState.DISABLED:
            self.phys = PhysState.POLLING
        self.state = PortState.DOWN
        if changed:
            self.counters.link_downed_counter += 1
        return changed

    def retrained(self) -> bool:
        """The peer asked for a retrain: an Armed/Active port falls back to Init."""
        if self.link_is_up and self.state in (PortState.ARMED, PortState.ACTIVE):
            self.state = PortState.INIT
            return True
        return False

    # ------------------------------------------------------------------ PortInfo bytes

    def encode(self, local_port_num: int) -> bytes:
        """The 64-byte PortInfo attribute, LocalPortNum = the port the SMP arrived on."""
        ext = self.is_switch and self.num != 0
        lsa, lsea = SPEED_CODES[self.speed]
        up = self.link_is_up
        if self.is_port0:
            lws = lwe = lwa = 0
            ls_byte = (0 << 4) | self.state
            phys_byte = (PhysState.LINK_UP << 4) | 0
            lsa_byte = 0
            ext_byte = 0
            lsee = 0
            nmtu = MTU_CODES[self.mtu]
        else:
            lws, lwe = widths_supported(self.width), self.link_width_enabled
            lwa = WIDTH_CODES[self.width] if up else 0
            ls_byte = (SPEED_SUPPORTED << 4) | self.state
            phys_byte = (self.phys << 4) | self.link_down_default
            lsa_byte = ((lsa if up else 0) << 4) | self.link_speed_enabled
            ext_supported = ext_speeds_supported(self.speed)
            ext_byte = ((lsea if up else 0) << 4) | ext_supported
            lsee = self.link_speed_ext_enabled
            nmtu = self.neighbor_mtu
        return _PI.pack(
            0 if ext else self.m_key,
            0 if ext else self.gid_prefix,
            0 if ext else self.lid,
            0 if ext else self.master_sm_lid,
            0 if ext else self.capability_mask,
            0,  # DiagCode
            0 if ext else self.m_key_lease_period,
            local_port_num,
            lwe, lws, lwa,
            ls_byte,
            phys_byte,
            ((0 if ext else self.m_key_protect) << 6) | (0 if ext else self.lmc),
            lsa_byte,
            (nmtu << 4) | (0 if ext else self.master_sm_sl),
            (self.vl_cap << 4) | 0,  # InitType
            self.vl_high_limit,
            VL_ARB_HIGH_CAP, VL_ARB_LOW_CAP,
            MTU_CODES[self.mtu],  # InitTypeReply 0, MTUCap
            (self.vl_stall_count << 5) | self.hoq_life,
            (self.operational_vls << 4) | self.partition_flags,
            self.m_key_violations, self.p_key_violations, self.q_key_violations,
            1,  # GUIDCap
            ((0 if ext else self.client_reregister) << 7) | (0 if ext else self.subnet_timeout),
            self.resp_time_value,
            self.error_thresholds,  # LocalPhyErrors / OverrunErrors thresholds
            0,  # MaxCreditHint
            0,
            b"\0\0\0",  # LinkRoundTripLatency
            0,  # CapabilityMask2
            ext_byte,
            lsee,
        )

    # ------------------------------------------------------------------ PortInfo Set

    def apply_set(self, data: bytes | bytearray | memoryview) -> SetOutcome:
        """Validate and apply a SubnSet(PortInfo); atomic (see the module docstring)."""
        (m_key, gid_prefix, lid, sm_lid, _cap, _diag, lease, _lpn, lwe, _lws, _lwa, ls_byte,
         phys_byte, mkp_lmc, lsa_byte, nmtu_smsl, _vlcap, vlhl, _hc, _lc, _mtucap, stall_hoq,
         opvls_byte, mkv, pkv, qkv, _gcap, cr_st, _rtv, err, _mch, _r, _rtl, _cm2, _ext,
         lsee) = _PI.unpack_from(data, 0)
        out = SetOutcome(state_before=self.state, phys_before=self.phys)
        req_state = ls_byte & 0x0F
        req_phys = phys_byte >> 4
        nmtu = nmtu_smsl >> 4
        opvls = opvls_byte >> 4
        lse = lsa_byte & 0x0F

        # ---- validation (nothing changes on failure)
        bad = False
        if self.is_port0:
            bad = req_state > PortState.ACTIVE
        else:
            bad = not self._state_request_ok(req_state)
            if req_phys not in (PhysState.NO_CHANGE, PhysState.POLLING, PhysState.DISABLED):
                bad = True
            if not 1 <= nmtu <= MTU_CODES[self.mtu]:
                bad = True
            if opvls > self.vl_cap:
                bad = True
            if lwe not in (0, 0xFF) and lwe & ~widths_supported(self.width):
                bad = True
            if lse not in (0, 0xF) and lse & ~SPEED_SUPPORTED:
                bad = True
            if 16 <= (lsee & 0x1F) <= 29:
                bad = True
        if not (self.is_switch and self.num != 0) and lid > MAX_UNICAST_LID:
            bad = True
        if bad:
            out.status = STATUS_INVALID
            return out

        # ---- commit
        if not (self.is_switch and self.num != 0):
            out.lid_changed = lid != self.lid
            self.m_key, self.gid_prefix, self.lid, self.master_sm_lid = m_key, gid_prefix, lid, sm_lid
            self.m_key_lease_period = lease
            self.m_key_protect = mkp_lmc >> 6
            self.lmc = 0 if self.is_port0 else mkp_lmc & 0x07
            self.master_sm_sl = nmtu_smsl & 0x0F
            self.subnet_timeout = cr_st & 0x1F
            self.client_reregister = 0  # a trigger, not a state
        if self.is_port0:
            if req_state >= PortState.INIT:
                self.state = PortState(req_state)
            return out
        self.m_key_violations, self.p_key_violations, self.q_key_violations = mkv, pkv, qkv
        self.error_thresholds = err
        if lwe:
            self.link_width_enabled = widths_supported(self.width) if lwe == 0xFF else lwe
        if lse:
            self.link_speed_enabled = SPEED_SUPPORTED if lse == 0xF else lse
        lsee &= 0x1F
        if lsee == 31:  # set to supported
            self.link_speed_ext_enabled = ext_speeds_supported(self.speed)
        elif lsee == 30:  # disable extended speeds
            self.link_speed_ext_enabled = 0
        elif lsee:
            self.link_speed_ext_enabled = lsee
        self.neighbor_mtu = nmtu
        if opvls:
            self.operational_vls = opvls
        self.vl_high_limit = vlhl
        self.vl_stall_count = stall_hoq >> 5
        self.hoq_life = stall_hoq & 0x1F
        self.partition_flags = opvls_byte & 0x0F
        self.link_down_default = phys_byte & 0x0F or self.link_down_default

        if req_phys == PhysState.DISABLED:
            if self.phys != PhysState.DISABLED:
                # LinkDownedCounter counts failed link error recovery, not an SM's request.
                self.phys = PhysState.DISABLED
                self.state = PortState.DOWN
                out.link_request = "disable"
            return out
        if req_phys == PhysState.POLLING and self.phys == PhysState.DISABLED:
            self.phys = PhysState.POLLING
            out.link_request = "enable"
            return out
        if req_state == PortState.DOWN:
            if self.state != PortState.DOWN and self.link_is_up:
                # Down, then the link retrains at once: back to Init, the peer too (an
                # SM's request, not a link failure: LinkDownedCounter stays).
                self.state = PortState.INIT
                out.retrained = True
                out.link_request = "retrain"
        elif req_state in (PortState.ARMED, PortState.ACTIVE):
            self.state = PortState(req_state)
        return out

    def _state_request_ok(self, req: int) -> bool:
        if req in (PortState.NO_CHANGE, PortState.DOWN):
            return True
        if req == PortState.INIT:
            return self.state == PortState.INIT
        if req == PortState.ARMED:
            return self.link_is_up and self.state in (PortState.INIT, PortState.ARMED)
        if req == PortState.ACTIVE:
            return self.link_is_up and self.state in (PortState.ARMED, PortState.ACTIVE)
        return False
