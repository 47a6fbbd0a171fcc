"""Compiling every kernel up front: the stamp, the one-line notice of a cold run, and `mcsim bench --compile`."""

from __future__ import annotations

from helpers import DENSE_NODE, invoke

import mcsim.cli
from mcsim.execution import precompile


def test_a_cold_run_of_the_command_compiles_first_with_a_notice(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(mcsim.cli, "_STANDALONE", True)  # as the `mcsim` command's own process
    monkeypatch.setattr(precompile, "is_compiled", lambda: False)
    monkeypatch.setattr(precompile, "cache_on", lambda: True)
    monkeypatch.setattr(precompile, "compile_all", lambda progress=None, bar=False: calls.append(bar) or
                        {"seconds": {}, "total_s": 0.0})
    result = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "150", "--no-progress", "-o", tmp_path / "x.nc")
    assert result.exit_code == 0, result.output
    notice = [line for line in result.stderr.splitlines() if line.startswith("mcsim: compiling")]
    assert len(notice) == 1 and "mcsim bench --compile" in notice[0] and len(calls) == 1
    # warm: no notice, nothing compiled up front
    monkeypatch.setattr(precompile, "is_compiled", lambda: True)
    again = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "150", "--no-progress", "-o",
                   tmp_path / "y.nc")
    assert again.exit_code == 0 and "compiling" not in again.stderr and len(calls) == 1


def test_a_test_or_notebook_process_never_compiles_up_front(monkeypatch, tmp_path):
    monkeypatch.setattr(precompile, "is_compiled", lambda: False)
    monkeypatch.setattr(precompile, "compile_all", lambda progress=None, bar=False: (_ for _ in ()).throw(AssertionError))
    result = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "150", "--no-progress", "-o", tmp_path / "x.nc")
    assert result.exit_code == 0 and "compiling" not in result.stderr


def test_bench_compile_runs_every_path_and_leaves_the_stamp(monkeypatch, tmp_path):
    stamp = tmp_path / "numba-cache" / "mcsim-compiled-test"
    monkeypatch.setattr(precompile, "stamp_path", lambda: stamp)
    assert not precompile.is_compiled()
    result = invoke("bench", "--compile")
    assert result.exit_code == 0, result.output
    assert "compiled or loaded every kernel" in result.output
    assert all(what in result.output for what, *_ in precompile.PATHS)
    assert stamp.is_file() and precompile.is_compiled()
