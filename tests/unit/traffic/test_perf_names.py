"""The perf CLI's test names match the traffic package's."""

from __future__ import annotations


def test_perf_cli_names_every_test_the_traffic_package_has() -> None:
    """The CLI keeps its own copy (importing the transport would slow every command)."""
    from ibemu.cli import perf_cmd
    from ibemu.traffic import collectives, perftest

    assert perf_cmd.TESTS == perftest.TESTS and perf_cmd.COLLECTIVES == collectives.COLLECTIVES
