"""Shared test fixtures, the hypothesis profiles, and the Numba warm-up of a test session.

Hypothesis profiles (``MCSIM_HYPOTHESIS_PROFILE``, default ``ci``):

- ``ci``: 30 examples per property, no deadline (a first call may compile a kernel), derandomized so that a run
  on a fresh clone is reproducible;
- ``thorough``: 300 examples, random, for a search for counterexamples before a change to a kernel lands.

Tests that state their own ``max_examples`` keep it under either profile.

Numba: on a cold on-disk cache (a fresh clone) compiling the kernels is about a minute of CPU. Every session runs
the test files that call no kernel (NO_KERNEL_FILES) first. One that also runs the report's tests (COVER_FILES,
about two minutes of figures) and tests that call kernels starts tests/kernel_warmup.py at once, which compiles
every kernel into the cache in a process of its own (on the other core); the first test that may call a kernel
waits for it, then loads the kernels from the cache instead of compiling them. ``MCSIM_TEST_WARM_UP=0`` turns the
warm-up off; so does ``MCSIM_NUMBA_CACHE=0`` (no cache to fill).

The suite runs on two pytest-xdist workers (``-n 2 --dist loadfile`` in pyproject.toml: each file's tests, and its
module fixtures, on one worker; ``-n 0`` runs it in one process). Then the controller starts the warm-up once the
first worker has collected, and each worker's first test that may call a kernel waits for the file the warm-up
creates when it ends.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
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

_warm_up: dict = {"process": None, "folder": None, "waited": False}
#: Under ``pytest -n``: the file the controller's warm-up creates when it ends (the workers wait for it).
DONE_ENV = "MCSIM_TEST_WARM_UP_DONE"


def _calls_no_kernel(item) -> bool:
    return item.path.name in NO_KERNEL_FILES


def _wanted(config) -> bool:
    return (os.environ.get("MCSIM_TEST_WARM_UP", "1") != "0" and os.environ.get("MCSIM_NUMBA_CACHE", "1") != "0"
            and not config.option.collectonly)


def _worth_it(files: set) -> bool:
    """A warm-up pays when the report's tests cover its time and some test calls a kernel."""
    return COVER_FILES <= files and bool(files - NO_KERNEL_FILES)


def _is_controller(config) -> bool:
    """The controller of ``pytest -n N`` (N > 0), which runs no test itself."""
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def _start(done: str | None = None):
    args = [sys.executable, str(ROOT / "tests" / "kernel_warmup.py"), *([done] if done else [])]
    return subprocess.Popen(args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def pytest_configure(config):
    # The workers of pytest -n inherit this environment when they start, after this hook: they learn where the
    # warm-up will say it is done.
    if _is_controller(config) and _wanted(config):
        _warm_up["folder"] = tempfile.mkdtemp(prefix="mcsim-warm-up-")
        os.environ[DONE_ENV] = os.path.join(_warm_up["folder"], "done")


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: not _calls_no_kernel(item))  # stable: each group keeps its order


def pytest_collection_finish(session):
    if hasattr(session.config, "workerinput") or not _wanted(session.config):
        return
    if _worth_it({item.path.name for item in session.items}):
        _warm_up["process"] = _start()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The controller of pytest -n: the first worker's collection decides whether the warm-up runs."""
    done = os.environ.get(DONE_ENV)
    if not done or _warm_up["process"] is not None or os.path.exists(done):
        return
    if _worth_it({Path(i.split("::")[0]).name for i in ids}):
        _warm_up["process"] = _start(done)
    else:
        Path(done).touch()


def _wait_for_file(done: str) -> None:
    deadline = time.monotonic() + WARM_UP_TIMEOUT_S
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if _calls_no_kernel(item):
        return
    done = os.environ.get(DONE_ENV)
    if hasattr(item.config, "workerinput") and done and not _warm_up["waited"]:
        _warm_up["waited"] = True
        _wait_for_file(done)
        return
    process = _warm_up["process"]
    if process is not None:
        _warm_up["process"] = None
        try:
            process.wait(timeout=WARM_UP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return
    process = _warm_up["process"]
    if process is not None:
        _warm_up["process"] = None
        process.kill()
        process.wait()
    if _warm_up["folder"]:
        shutil.rmtree(_warm_up["folder"], ignore_errors=True)
