"""Shared test fixtures, the hypothesis profiles, and the Numba warm-up of a test session.

Hypothesis profiles (``MCSIM_HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci``: 30 examples per property, no deadline (a first call may compile a kernel), derandomized so that a run
  on a fresh clone is reproducible;
- ``thorough``: 300 examples, random, for a search for counterexamples before a change to a kernel lands.

Tests that state their own ``max_examples`` keep it under either profile.

Numba: on a cold on-disk cache (a fresh clone) compiling the kernels is about two minutes of CPU. Every session runs
the test files that call no kernel (NO_KERNEL_FILES) first. One that also runs the report's tests (COVER_FILES,
about two minutes of figures) and tests that call kernels starts tests/kernel_warmup.py at once, which compiles
every kernel into the cache in a process of its own (on the other core); the first test that may call a kernel
waits for it, then loads the kernels from the cache instead of compiling them. ``MCSIM_TEST_WARM_UP=0`` turns the
warm-up off; so does ``MCSIM_NUMBA_CACHE=0`` (no cache to fill).
"""

import os
import subprocess
import sys
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


# -- Numba warm-up -------------------------------------------------------------------------------------------------

#: Test files whose tests call no Numba kernel (test_report's real compare calls the stages' small kernels, which
#: the warm-up compiles first).
NO_KERNEL_FILES = frozenset({
    "test_architecture.py", "test_catalog.py", "test_cli_help.py", "test_collectives_measured.py",
    "test_distributions.py", "test_economics.py", "test_fileio.py", "test_json_schema.py", "test_listing.py",
    "test_ollama.py", "test_optrace.py", "test_profiles.py", "test_report.py", "test_report_figures.py",
    "test_roofline.py", "test_scenario.py", "test_sensitivity.py", "test_steps.py", "test_traces.py",
})
#: The files whose time covers the warm-up's: without them a session waits for kernels it may not call.
COVER_FILES = frozenset({"test_report.py", "test_report_figures.py"})
WARM_UP_TIMEOUT_S = 900

_warm_up: dict = {"process": None}


def _calls_no_kernel(item) -> bool:
    return item.path.name in NO_KERNEL_FILES


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not _calls_no_kernel(item))  # stable: each group keeps its order


def pytest_collection_finish(session):
    wanted = os.environ.get("MCSIM_TEST_WARM_UP", "1") != "0" and os.environ.get("MCSIM_NUMBA_CACHE", "1") != "0"
    files = {item.path.name for item in session.items}
    if wanted and COVER_FILES <= files and files - NO_KERNEL_FILES and not session.config.option.collectonly:
        _warm_up["process"] = subprocess.Popen([sys.executable, str(ROOT / "tests" / "kernel_warmup.py")], cwd=ROOT,
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    process = _warm_up["process"]
    if process is not None and not _calls_no_kernel(item):
        _warm_up["process"] = None
        try:
            process.wait(timeout=WARM_UP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pytest_sessionfinish(session, exitstatus):
    process = _warm_up["process"]
    if process is not None:
        process.kill()
        process.wait()
