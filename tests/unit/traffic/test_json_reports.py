"""The machine-readable outputs scripts expect: perftest's --out_json and nccl-tests' -J."""

from __future__ import annotations

from ibemu.traffic.collectives import CollectiveResult, nccl_footer, nccl_json, nccl_line
from ibemu.traffic.perftest import BwResult, Deliveries, LatResult, PerfOptions, json_report


def test_perftest_bandwidth_document() -> None:
    r = BwResult("write_bw", 65536, 5000, 2.0, 5000 * 65536, 180.5, 156.25, 0.0025, 80_000, 0, Deliveries())
    doc = json_report(r, PerfOptions(qps=2, bidirectional=True), link_type="Ethernet")
    assert doc["test_info"]["test"] == "RDMA_Write_BW_Bidirectional_Test"
    assert doc["test_info"]["Number_of_qps"] == 2 and doc["test_info"]["Link_type"] == "Ethernet"
    assert doc["results"] == {"MsgSize": 65536, "n_iterations": 5000, "BW_peak": 180.5, "BW_average": 156.25,
                              "MsgRate": 0.0025}


def test_perftest_latency_document() -> None:
    samples = [1000 + 10 * i for i in range(1000)]  # ns
    r = LatResult("send_lat", 2, 1000, samples)
    res = json_report(r, PerfOptions(test="send_lat"))["results"]
    assert res["MsgSize"] == 2 and res["n_iterations"] == 1000
    assert res["t_min"] == 1.0 and res["t_max"] == 10.99 and res["percentile_99.9"] == 10.99
    assert res["t_min"] <= res["t_typical"] <= res["percentile_99"] <= res["percentile_99.9"]


def test_nccl_footer_and_json_agree_with_the_line() -> None:
    r = CollectiveResult("allreduce", 4, 1 << 20, 5, [0.002] * 5, 0, 0)
    line = nccl_line(r).split()
    assert "# Out of bounds values : 0 OK" in nccl_footer(r)
    doc = nccl_json(r, args=["ibemu", "perf"], start_time="t0", end_time="t1")
    (res,) = doc["results"]
    assert res["size"] == int(line[0]) and abs(res["out_of_place"]["bus_bw"] - float(line[6])) < 1e-3
    assert doc["average_bus_bandwidth"]["bandwidth"] == res["out_of_place"]["bus_bw"]
    bad = CollectiveResult("allreduce", 4, 1 << 20, 5, [0.002] * 5, 3, 0)
    assert "3 FAILED" in nccl_footer(bad) and nccl_json(bad, args=[], start_time="", end_time="")["out_of_bounds"] == {
        "count": 3, "okay": False}
