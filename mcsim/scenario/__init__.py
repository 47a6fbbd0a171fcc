"""Scenarios: the TOML schema, the distributions of uncertain inputs, the catalog of presets and sweep grids.

:mod:`~mcsim.scenario.loading` reads and validates a scenario file; its public names (and the schema's
:class:`ScenarioError` and :func:`field_for`) are re-exported here.
"""

from mcsim.scenario.loading import (
    STREAM_BATCHING,
    STREAM_EXPERTS,
    STREAM_PARAMS,
    STREAM_ROUTING,
    STREAM_SPECULATIVE,
    STREAM_WORKLOAD,
    Scenario,
    bundled,
    check_variant_key,
    draw_uncertain,
    load_scenario,
    parse_override,
    resolve,
    rng_for,
)
from mcsim.scenario.schema import ScenarioError, field_for

__all__ = [
    "STREAM_BATCHING",
    "STREAM_EXPERTS",
    "STREAM_PARAMS",
    "STREAM_ROUTING",
    "STREAM_SPECULATIVE",
    "STREAM_WORKLOAD",
    "Scenario",
    "ScenarioError",
    "bundled",
    "check_variant_key",
    "draw_uncertain",
    "field_for",
    "load_scenario",
    "parse_override",
    "resolve",
    "rng_for",
]
