"""Nothing of a user's is ever destroyed: ``--force`` replaces only a regular file the command itself writes, a report
goes only into a new folder or one holding an earlier report of its own, temporary and parts files are recognised
by a name and content no user file has, and cleanup removes only those.

Every case builds a folder of user files, runs the command, and checks every file byte for byte afterwards.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import DENSE_NODE, invoke

SMALL = ["--samples", "1", "--requests", "150", "--no-progress"]


def snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: a file's bytes, a link's target, a folder's mark (links are not followed)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            key = str(path.relative_to(folder))
            if path.is_symlink():
                out[key] = ("link", os.readlink(path))
            elif path.is_dir():
                out[key] = ("folder",)
            else:
                out[key] = ("file", path.read_bytes())
    return out


def refused(result, *words) -> str:
    """Exit 2 with one ``error:`` line holding each of ``words``."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def result_file(tmp_path_factory) -> Path:
    """One small result of dense-node, written once for the report cases."""
    path = tmp_path_factory.mktemp("result") / "r.nc"
    assert invoke("run", DENSE_NODE, *SMALL, "-o", path).exit_code == 0
    return path


@pytest.fixture
def user_folder(tmp_path, result_file) -> Path:
    """A user's working folder: the result, a scenario, notes and a sub-folder of their own."""
    folder = tmp_path / "work"
    (folder / "data").mkdir(parents=True)
    shutil.copy(result_file, folder / "r.nc")
    shutil.copy(DENSE_NODE, folder / "s.toml")
    (folder / "notes.txt").write_text("three weeks of notes\n")
    (folder / "data" / "keep.csv").write_bytes(b"a,b\n1,2\n")
    return folder


# -- report ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["dot", "absolute", "input_folder", "unrelated"])
@pytest.mark.parametrize("force", [False, True])
def test_a_report_never_goes_into_a_folder_of_the_users(user_folder, tmp_path, monkeypatch, where, force):
    unrelated = tmp_path / "photos"
    unrelated.mkdir()
    (unrelated / "cat.jpg").write_bytes(b"\xff\xd8 a cat")
    monkeypatch.chdir(user_folder)
    target = {"dot": ".", "absolute": str(user_folder), "input_folder": str(user_folder / "data" / ".."),
              "unrelated": str(unrelated)}[where]
    before, before_unrelated = snapshot(user_folder), snapshot(unrelated)
    message = refused(invoke("report", "r.nc", "-o", target, *(["--force"] if force else [])),
                      "not an earlier mcsim report", "--force or not")
    assert "use --force" not in message  # the refusal never suggests the flag that would not help
    assert snapshot(user_folder) == before and snapshot(unrelated) == before_unrelated


def test_a_report_replaces_only_its_own_earlier_files(user_folder, tmp_path):
    out = tmp_path / "rep"
    assert invoke("report", user_folder / "r.nc", "-o", out).exit_code == 0
    first = snapshot(out)
    assert ".mcsim-manifest.json" in first and "summary.md" in first
    refused(invoke("report", user_folder / "r.nc", "-o", out), "earlier report", "--force")
    assert snapshot(out) == first
    # --force replaces the earlier report: files it no longer writes go, the ones it writes are new
    assert invoke("report", user_folder / "r.nc", "-o", out, "--force", "--metrics", "gross_margin").exit_code == 0
    second = snapshot(out)
    assert sorted(n for n in second if n.startswith("dist_")) == ["dist_gross_margin.png"]
    # a file the user added makes it their folder: refused, --force or not, and both files stay
    (out / "mine.md").write_text("my own summary")
    before = snapshot(out)
    refused(invoke("report", user_folder / "r.nc", "-o", out, "--force"), "mine.md")
    assert snapshot(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_a_report_into_an_empty_working_folder_keeps_the_folder(result_file, tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert invoke("report", result_file, "-o", ".").exit_code == 0
    assert Path(".").resolve() == empty.resolve() and (empty / "summary.md").is_file()
    assert os.path.samefile(os.getcwd(), empty)  # written into the folder, not renamed over it


def test_a_report_refuses_a_link_a_file_and_a_pipe(user_folder, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    refused(invoke("report", user_folder / "r.nc", "-o", link, "--force"), "symbolic link")
    assert snapshot(tmp_path / "elsewhere") == {}
    refused(invoke("report", user_folder / "r.nc", "-o", user_folder / "notes.txt", "--force"), "is a file")
    assert (user_folder / "notes.txt").read_text() == "three weeks of notes\n"
    fifo = tmp_path / "pipe.nc"
    os.mkfifo(fifo)
    refused(invoke("report", fifo, "-o", tmp_path / "rep"), "named pipe")  # refused, not a read that never ends
    assert not (tmp_path / "rep").exists()


# -- an input as the output --------------------------------------------------------------------------------------

def test_force_never_overwrites_the_commands_own_scenario_or_trace(user_folder, monkeypatch):
    monkeypatch.chdir(user_folder)
    before = snapshot(user_folder)
    refused(invoke("run", "s.toml", *SMALL, "-o", "s.toml", "--force"), "is an input of this command")
    refused(invoke("run", "s.toml", *SMALL, "-o", str(user_folder / "data" / ".." / "s.toml"), "--force"),
            "is an input")
    trace = user_folder / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 500, "input_length": 600, "output_length": 20, "hash_ids": [1, 3]}\n')
    before = snapshot(user_folder)
    refused(invoke("run", "s.toml", *SMALL, "--set", f'workload.trace="{trace}"', "-o", "t.jsonl", "--force"),
            "is an input")
    refused(invoke("capacity", "s.toml", *SMALL, "-o", "s.toml", "--force"), "is an input")
    assert snapshot(user_folder) == before


def test_calibrate_never_overwrites_its_measurements(tmp_path):
    from mcsim.calibration.vidur import bundled_linear

    measured = tmp_path / "mlp.csv"
    shutil.copy(bundled_linear("h100", "Llama-2-70b-hf"), measured)
    before = measured.read_bytes()
    refused(invoke("calibrate", measured, "-o", measured, "--force"), "is an input")
    assert measured.read_bytes() == before


# -- temporary files and parts -----------------------------------------------------------------------------------

def test_cleanup_removes_only_its_own_stale_temporary(tmp_path):
    lookalikes = {".x.nc.deadbeef.tmp": b"my half-written notes",  # the earlier pattern's shape
                  ".x.nc.mcsim-tmp-0123456789abcdef.tmp": b"text that is no NetCDF file",
                  ".x.nc.keep.tmp": b"\x89HDF\r\n\x1a\n a user's HDF5 file"}
    for name, data in lookalikes.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / ".x.nc.mcsim-tmp-fedcba9876543210.tmp").write_bytes(b"\x89HDF\r\n\x1a\n cut short by a kill")
    assert invoke("run", DENSE_NODE, *SMALL, "-o", tmp_path / "x.nc").exit_code == 0
    after = snapshot(tmp_path)
    assert set(after) == {"x.nc", *lookalikes}
    assert all(after[name] == ("file", data) for name, data in lookalikes.items())


def _linked_parts(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "point000000-chunk000000.npz").write_bytes(b"PK\x03\x04 someone's archive")
    (elsewhere / "thesis.tex").write_text("chapter one")
    (tmp_path / "x.nc.parts").symlink_to(elsewhere, target_is_directory=True)
    return "symbolic link"


def _parts_with_a_users_file(tmp_path):
    parts = tmp_path / "x.nc.parts"
    parts.mkdir()
    (parts / "point000000-chunk000000.npz").write_bytes(b"PK\x03\x04 damaged part")
    (parts / "todo.txt").write_text("my list")
    (parts / "point000000-chunk000001.npz").mkdir()  # a folder where a part would be
    return "not a part file mcsim wrote"


@pytest.mark.parametrize("flag", ["--resume", "--force"])
@pytest.mark.parametrize("make", [_linked_parts, _parts_with_a_users_file], ids=["a link", "a user's file"])
def test_a_parts_folder_that_is_not_mcsims_is_refused_and_left_alone(tmp_path, flag, make):
    words = make(tmp_path)
    before = snapshot(tmp_path)
    refused(invoke("run", DENSE_NODE, *SMALL, "-o", tmp_path / "x.nc", flag), words)
    assert snapshot(tmp_path) == before


# -- every file a run reads is checked before the first part ------------------------------------------------------

def _surface_with(tmp_path, name, first_log_ratio) -> Path:
    from mcsim.perf.gemm_surface import bundled_path

    text = bundled_path("h100").read_text()
    head, sep, tail = text.partition("log_ratio = [")
    path = tmp_path / name
    path.write_text(head + sep + f"{first_log_ratio}, " + tail.split(", ", 1)[1])
    return path


@pytest.mark.parametrize("command", ["run", "sweep", "search"])
@pytest.mark.parametrize("surface, words", [
    ("missing.toml", "missing.toml"),
    ("garbage.toml", "garbage.toml"),
    ("huge.toml", "log ratios within"),  # exp(1e6): once an internal error
])
def test_a_bad_gemm_surface_in_a_grid_stops_before_any_part(tmp_path, command, surface, words):
    good = _surface_with(tmp_path, "good.toml", 0.01)
    _surface_with(tmp_path, "huge.toml", 1e6)
    (tmp_path / "garbage.toml").write_bytes(b"\x00\x01 not toml [[[")
    out = tmp_path / "out.nc"
    grid = ["--space" if command == "search" else "--grid", f"performance.gemm_surface={good},{tmp_path / surface}"]
    result = invoke(command, DENSE_NODE, *SMALL, "--set", 'hardware.preset="h100"',
                    "--set", 'performance.fidelity="roofline"', *grid, "-o", out)
    refused(result, words)
    assert not out.exists() and not (tmp_path / "out.nc.parts").exists()


@pytest.mark.parametrize("manifest", [b"[1, 2]", b"not json", b'{"kind": "report", "files": ["../x"]}',
                                      b'{"kind": "trace", "files": []}'])
def test_a_manifest_mcsim_did_not_write_makes_the_folder_the_users(result_file, tmp_path, manifest):
    folder = tmp_path / "rep"
    folder.mkdir()
    (folder / ".mcsim-manifest.json").write_bytes(manifest)
    before = snapshot(folder)
    refused(invoke("report", result_file, "-o", folder, "--force"), "not an earlier mcsim report")
    assert snapshot(folder) == before
