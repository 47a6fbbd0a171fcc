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


def test_a_device_pipe_or_folder_is_never_replaced(tmp_path):
    from mcsim.fileio import NotARegularFile

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for path, kind in ((fifo, "named pipe"), (folder, "folder"), ("/dev/null", "character device")):
        with pytest.raises(NotARegularFile, match=kind):
            atomic_write(path, "x")
    assert fifo.is_fifo() and folder.is_dir() and os.path.exists("/dev/null")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("command", [
    ("run", "scenarios/factory.toml", "--samples", "1", "--requests", "100"),
    ("sweep", "scenarios/factory.toml", "--grid", "deployment.instances=1,2", "--samples", "1", "--requests", "100"),
    ("schema",),
    ("calibrate", "mcsim/data/measurements/vidur/network/h100_dgx/send_recv.csv", "--hardware", "h100"),
])
def test_every_output_refuses_a_device_even_with_force(command, tmp_path):
    from pathlib import Path

    from helpers import invoke

    root = Path(__file__).resolve().parents[1]
    args = [str(root / a) if a.startswith(("scenarios/", "mcsim/")) else a for a in command]
    fifo = tmp_path / "out.nc"
    os.mkfifo(fifo)
    for target in ("/dev/null", str(fifo)):
        result = invoke(*args, "-o", target, "--force")
        assert result.exit_code == 2 and "not a regular file" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert fifo.is_fifo() and not (tmp_path / "out.nc.parts").exists()


def test_inputs_that_are_pipes_are_refused_without_blocking(tmp_path):
    from pathlib import Path

    from helpers import invoke

    root = Path(__file__).resolve().parents[1]
    fifo = tmp_path / "in"
    os.mkfifo(fifo)
    cases = [("calibrate", str(fifo), "--hardware", "h100", "-o", str(tmp_path / "c.toml")),
             ("run", str(fifo), "-o", str(tmp_path / "a.nc")),
             ("run", str(root / "scenarios/factory.toml"), "--calibration", str(fifo), "-o", str(tmp_path / "b.nc")),
             ("run", str(root / "scenarios/factory.toml"), "--set", f'workload.trace="{fifo}"', "--samples", "1",
              "-o", str(tmp_path / "d.nc"))]
    for args in cases:
        result = invoke(*args)
        assert result.exit_code == 2 and "pipe" in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
