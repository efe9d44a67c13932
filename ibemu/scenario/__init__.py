"""ibemu.scenario: scenario files (YAML), their schema, and the typed Scenario they load into."""

from ibemu.scenario.loader import (
    builtin_names,
    builtin_text,
    load_builtin,
    load_scenario,
    loads_scenario,
)
from ibemu.scenario.schema import (
    FabricSpec,
    FaultSpec,
    RecordSpec,
    Scenario,
    SMSpec,
    TimeSpec,
    TopologySpec,
    TrafficSpec,
)
from ibemu.scenario.yamlnodes import ScenarioError

__all__ = [
    "FabricSpec",
    "FaultSpec",
    "RecordSpec",
    "SMSpec",
    "Scenario",
    "ScenarioError",
    "TimeSpec",
    "TopologySpec",
    "TrafficSpec",
    "builtin_names",
    "builtin_text",
    "load_builtin",
    "load_scenario",
    "loads_scenario",
]
