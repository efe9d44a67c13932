"""The RoCE user datapath's scenario keys: accepted as documented, bad ones refused, located."""

from __future__ import annotations

import pytest

from ibemu.errors import ConfigError
from ibemu.kernel.impair import has_sch_fq
from ibemu.scenario import ScenarioError, loads_scenario
from ibemu.scenario.runner import check_runnable

FT = "topology:\n  generator: fat-tree\n  k: 4\n"  # lines 1-3
USER = FT + "fabric:\n  kind: roce\n  datapath: user\n"  # lines 4-6


def problem(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, "x.yaml")
    return info.value.problems[0]


def test_user_datapath_keys_load() -> None:
    s = loads_scenario(USER + "  line_gbps: 0.5\n  ecn_mark_kb: 32\n  pfc: [3, 5]\n  delay_us: 200\n  loss_pct: 0.1\n"
                       "  buffer_kb: 256\n  pfc_xoff_kb: 48\n", "x.yaml")
    f = s.fabric
    assert f.roce_user and f.line_gbps == 0.5 and f.pfc == (3, 5) and f.buffer_kb == 256
    assert f.pfc_xoff_kb == 48 and f.pfc_xon_kb == 32 and f.delay_us == 200 and f.loss_pct == 0.1
    assert f.ecn and f.ecn_line_gbps == 0.5  # the hosts' DCQCN line rate is the ports'
    check_runnable(s)  # the user datapath delays frames itself: no sch_fq needed
    assert loads_scenario(USER + "  line_gbps: 1\n  pfc: true\n", "x.yaml").fabric.pfc == (3,)
    assert loads_scenario(USER + "  pfc: false\n", "x.yaml").fabric.pfc == ()
    own = loads_scenario(USER + "  pfc: true\n  ecn_mark_kb: 32\n", "x.yaml").fabric  # the cables' own rates
    assert own.pfc == (3,) and own.ecn and own.line_gbps == 0
    assert loads_scenario(USER + "  line_gbps: 1\n  pfc: true\n  pfc_xoff_kb: 16\n", "x.yaml").fabric.pfc_xon_kb == 8
    mapped = loads_scenario(USER + "  line_gbps: 1\n  pfc: true\n  dscp_priority: {26: 5, 48: 7}\n", "x.yaml").fabric
    assert mapped.dscp_priority == ((26, 5), (48, 7)) and mapped.pfc == (5,)  # pfc: true follows RoCE data


@pytest.mark.parametrize(("text", "expected"), [
    (FT + "fabric:\n  kind: roce\n  pfc: true\n",
     "x.yaml:6 fabric.pfc: needs fabric.datapath: user (the routers' kernels have no line rate, queues or PFC)"),
    (FT + "fabric:\n  kind: ib\n  datapath: user\n  pfc: true\n",
     "x.yaml:7 fabric.pfc: cable impairments and ECN apply to a RoCE fabric only (kind: roce), line rates and PFC "
     "too; an IB fabric is lossless (per-link loss and delay: defaults.loss_pct/delay_us, datapath user)"),
    (USER + "  line_gbps: -1\n", "x.yaml:7 fabric.line_gbps: expected a number > 0 and <= 1000, got -1"),
    (USER + "  line_gbps: 1\n  pfc: [9]\n", "x.yaml:8 fabric.pfc[]: expected an integer from 0 to 7, got 9"),
    (USER + "  line_gbps: 1\n  pfc: yes please\n", "x.yaml:8 fabric.pfc: expected true or false, got 'yes please'"),
    (USER + "  line_gbps: 1\n  ecn_line_gbps: 1\n  ecn_mark_kb: 8\n",
     "x.yaml:8 fabric.ecn_line_gbps: the user datapath has real queues: give their rate as fabric.line_gbps"),
    (USER + "  line_gbps: 1\n  pfc: true\n  pfc_xoff_kb: 16\n  pfc_xon_kb: 32\n",
     "x.yaml:10 fabric.pfc_xon_kb: must not exceed pfc_xoff_kb (16)"),
    (USER + "  dscp_priority: {64: 3}\n", "x.yaml:7 fabric.dscp_priority: expected an integer from 0 to 63, got 64"),
    (USER + "  dscp_priority: {26: 8}\n", "x.yaml:7 fabric.dscp_priority.26: expected an integer from 0 to 7, got 8"),
    (USER + "  dscp_priority: [26]\n",
     "x.yaml:7 fabric.dscp_priority: expected a mapping DSCP: priority, like {26: 3, 48: 6}"),
])
def test_bad_user_datapath_keys(text: str, expected: str) -> None:
    assert problem(text) == expected


@pytest.mark.skipif(has_sch_fq(), reason="this kernel can delay frames on the kernel datapath")
def test_delay_on_the_kernel_datapath_is_refused_where_it_is_written() -> None:
    s = loads_scenario(FT + "fabric:\n  kind: roce\n  delay_us: 20\n", "x.yaml")
    with pytest.raises(ConfigError, match=r"x.yaml:6 fabric.delay_us: a cable delay needs the fq qdisc"):
        check_runnable(s)
