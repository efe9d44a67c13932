"""ibemu.report: what ``ibemu run`` makes of its result.

``schema`` (the ``ibemu.run/3`` structures and their validator), ``store`` (JSON files),
``summary`` (the terminal summary), ``plots`` (throughput, reroute phases, topology) and
``html`` (all of it as one self-contained page: ``ibemu report RESULT --html``).
"""

from ibemu.report.result import (
    SCHEMA_VERSION,
    Bringup,
    FabricInfo,
    FaultResult,
    Files,
    FlowImpact,
    Phases,
    ResultError,
    RunResult,
    ScenarioInfo,
    SMInfo,
    Timeline,
    TrafficResult,
    as_result,
    validate,
)
from ibemu.report.store import dump, dumps, load, loads
from ibemu.report.summary import summary

__all__ = [
    "SCHEMA_VERSION",
    "Bringup",
    "FabricInfo",
    "FaultResult",
    "Files",
    "FlowImpact",
    "Phases",
    "ResultError",
    "RunResult",
    "SMInfo",
    "ScenarioInfo",
    "Timeline",
    "TrafficResult",
    "as_result",
    "dump",
    "dumps",
    "load",
    "loads",
    "summary",
    "validate",
]
