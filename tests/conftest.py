"""Shared test fixtures and the hypothesis profiles.

Hypothesis profiles (``MCSIM_HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci``: 30 examples per property, no deadline (a first call may compile a kernel), derandomized so that a run
  on a fresh clone is reproducible;
- ``thorough``: 300 examples, random, for a search for counterexamples before a change to a kernel lands.

Tests that state their own ``max_examples`` keep it under either profile.
"""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("MCSIM_HYPOTHESIS_PROFILE", "ci"))

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


@pytest.fixture(scope="session")
def factory_path() -> Path:
    return SCENARIOS / "factory.toml"
