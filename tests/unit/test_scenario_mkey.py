"""The SM's M_Key keys in a scenario: validated with located errors, carried to both SMs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ibemu.fabric import ibemusm, opensm
from ibemu.fabric.session import read_spec, request_from_spec, write_spec
from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.scenario.runner import fabric_request
from ibemu.sm.__main__ import parse_args

FT = "topology:\n  generator: fat-tree\n  k: 4\n"  # lines 1-3

BAD: list[tuple[str, str, str]] = [
    ("key-negative", FT + "sm:\n  m_key: -1\n",
     "x.yaml:5 sm.m_key: expected a 64-bit value (0 to 0xffffffffffffffff), got -1"),
    ("key-65-bits", FT + "sm:\n  m_key: 0x10000000000000000\n",
     "x.yaml:5 sm.m_key: expected a 64-bit value (0 to 0xffffffffffffffff), got 0x10000000000000000"),
    ("key-text", FT + "sm:\n  m_key: secret\n",
     "x.yaml:5 sm.m_key: expected an integer, got 'secret'"),
    ("protect-4", FT + "sm:\n  m_key: 7\n  m_key_protect: 4\n",
     "x.yaml:6 sm.m_key_protect: expected an integer from 0 to 3, got 4"),
    ("lease-too-long", FT + "sm:\n  m_key: 7\n  m_key_lease_s: 65536\n",
     "x.yaml:6 sm.m_key_lease_s: expected an integer from 0 to 65535, got 65536"),
    ("protect-without-key", FT + "sm:\n  m_key_protect: 2\n",
     "x.yaml:5 sm.m_key_protect: m_key_protect protects an M_Key: give sm.m_key (a non-zero 64-bit value)"),
    ("opensm-level-3", FT + "sm:\n  impl: opensm\n  m_key: 7\n  m_key_protect: 3\n",
     "x.yaml:7 sm.m_key_protect: OpenSM sets protect bits 0-2 (it would use 2 instead of 3); use 2, or impl: ibemu"),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_keys(text: str, expected: str, tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, "x.yaml", tmp_path)
    assert info.value.problems[0] == expected, info.value.problems


def test_keys_reach_both_sms(tmp_path: Path) -> None:
    scen = loads_scenario(FT + "sm:\n  m_key: 0xFEEDFACE00000001\n  m_key_protect: 2\n  m_key_lease_s: 30\n",
                          "x.yaml", tmp_path)
    keys = {"m_key": 0xFEEDFACE00000001, "m_key_protect": 2, "m_key_lease_s": 30}
    assert scen.sm.keys() == keys and fabric_request(scen).sm_keys == keys
    write_spec(tmp_path / "run", "r1", fabric_request(scen))  # what the daemon of `ibemu up` reads
    assert request_from_spec(read_spec(tmp_path / "run")).sm_keys == keys
    args = parse_args(["--ns", "x", *ibemusm.key_args(keys)])
    assert (args.m_key, args.m_key_protect, args.m_key_lease) == (0xFEEDFACE00000001, 2, 30)
    conf = opensm.write_key_config(tmp_path, keys).read_text().splitlines()
    assert conf == ["m_key 0xfeedface00000001", "m_key_protection_level 2", "m_key_lease_period 30",
                    "m_key_lookup FALSE"]
    plain = loads_scenario(FT, "x.yaml", tmp_path)
    assert plain.sm.keys() == {} and ibemusm.key_args({}) == [] and fabric_request(plain).sm_keys == {}


@pytest.mark.parametrize("argv", [["--m-key", "0x1" + "0" * 16], ["--m-key", "key"], ["--m-key-protect", "4"],
                                  ["--m-key-lease", "70000"]])
def test_sm_cli_refuses_bad_keys(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
