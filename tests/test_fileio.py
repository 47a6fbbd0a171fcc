"""The atomic-write helper and the root exception."""

from __future__ import annotations

import os

import pytest

from mcsim.errors import McsimError
from mcsim.fileio import atomic_path, atomic_write


def test_atomic_write_replaces_the_file_whole(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write(target, "one\n")
    assert atomic_write(target, b"two\n") == target
    assert target.read_bytes() == b"two\n"
    assert os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("error", [OSError, KeyboardInterrupt])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, error):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(error):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise error()
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_permissions(tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    assert (atomic_write(tmp_path / "usual", "x").stat().st_mode & 0o777) == 0o666 & ~umask
    assert (atomic_write(tmp_path / "mine", "x", mode=0o640).stat().st_mode & 0o777) == 0o640


def test_every_mcsim_error_keeps_its_builtin_base():
    from mcsim.execution.executor import SweepInterrupted
    from mcsim.calibration.files import CalibrationError
    from mcsim.optrace.ollama import OllamaError, OllamaUnavailable
    from mcsim.scenario import ScenarioError
    from mcsim.scenario.catalog import UnknownPresetError
    from mcsim.scenario.distributions import DistributionError
    from mcsim.stages.requests_trace import TraceError

    for cls in (ScenarioError, DistributionError, TraceError, CalibrationError):
        assert issubclass(cls, McsimError) and issubclass(cls, ValueError)
    assert issubclass(UnknownPresetError, McsimError) and issubclass(UnknownPresetError, KeyError)
    for cls in (OllamaError, OllamaUnavailable, SweepInterrupted):
        assert issubclass(cls, McsimError)
