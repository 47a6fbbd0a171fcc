"""Shared test fixtures."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


@pytest.fixture(scope="session")
def factory_path() -> Path:
    return SCENARIOS / "factory.toml"
