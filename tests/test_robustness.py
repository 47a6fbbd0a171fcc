"""Every failure a one-line error, nothing stale merged, nothing left behind: bad scenarios, bad traces, damaged
and stale parts, full disks, hostile inputs (the Ollama server's side is in test_ollama.py)."""

import errno
import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from mcsim.cli import main
from mcsim.errors import McsimError
from mcsim.execution import executor
from mcsim.scenario import load_scenario
from mcsim.scenario.schema import CLASS_FIELDS, SECTIONS

ROOT = Path(__file__).resolve().parents[1]
FACTORY = ROOT / "scenarios" / "factory.toml"
DENSE = ROOT / "scenarios" / "dense-node.toml"
SMALL = ["--samples", "2", "--requests", "200", "--no-progress"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(result, code=2):
    """Exit ``code``, one ``error:`` line on stderr, no traceback."""
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def listing(folder: Path) -> set:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# -- bad scenario values ----------------------------------------------------------------------------------------

def _numeric_fields(skip_sections=()):
    """(dotted path, Field) of every numeric scenario key, the class fields under ``workload.classes.chat``."""
    fields = [(f"{s}.{k}", f) for s, table in SECTIONS.items() if s not in skip_sections for k, f in table.items()]
    fields += [(f"workload.classes.chat.{k}", f) for k, f in CLASS_FIELDS.items()]
    return [(path, f) for path, f in fields if f.kind in ("int", "float")]


def _out_of_range():
    """For every numeric key with a bound: a value just beyond it (the schema says what it accepts)."""
    cases = []
    for path, f in _numeric_fields():
        if f.lo is not None:
            cases.append((path, f.lo if f.lo_open else f.lo - 1))
        if f.hi is not None:
            cases.append((path, f.hi + 1))
    return cases


@pytest.mark.parametrize("path, value", _out_of_range())
def test_every_out_of_range_value_is_a_one_line_error(path, value, tmp_path):
    result = invoke("run", FACTORY, *SMALL, "--set", f"{path}={value}", "-o", tmp_path / "x.nc")
    line = one_line_error(result)
    assert path in line
    assert listing(tmp_path) == set()


@pytest.mark.parametrize("override, words", [
    ('economics.pue={dist=["uniform"],low=1.1,high=1.2}', "economics.pue.dist"),
    ('mc.seed={dist="uniform",low=1,high=2}', "plain value"),
    ('mc.samples={dist="uniform",low=1,high=2}', "plain value"),
    ('mc.requests={dist="choice",values=[100,200]}', "plain value"),
    ('hardware.hbm_tb_s=0', "hardware.hbm_tb_s"),
    ('model.layers=0', "model.layers"),
    ('economics.pue=' + "[" * 3000 + "]" * 3000, "nested too deeply"),
    ('workload.classes.chat.share={dist="uniform",low=0,high=0}', "shares"),
    ('performance.calibration="missing.toml"', "missing.toml"),
])
def test_malformed_values_are_one_line_errors(override, words, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text(DENSE.read_text().replace("[workload.classes.rag]\nshare = 0.3",
                                                  "[workload.classes.rag]\nshare = 0"))
    result = invoke("run", scenario, *SMALL, "--set", override, "-o", tmp_path / "x.nc")
    assert words in one_line_error(result)
    assert listing(tmp_path) == {"s.toml"}


@pytest.mark.parametrize("grid, words", [
    ("mc.seed=1,2", "[mc] keys cannot be grid axes"),
    ("mc.requests=100,200", "[mc] keys cannot be grid axes"),
    ("workload.rate_rps=1:100:1000000", "num <= 10,000"),
    ("economics.pue=0.5,1.2", "economics.pue"),
])
def test_grid_axes_are_checked_like_set(grid, words, tmp_path):
    result = invoke("run", FACTORY, *SMALL, "--grid", grid, "-o", tmp_path / "x.nc")
    assert words in one_line_error(result)
    assert listing(tmp_path) == set()


def test_a_distribution_as_a_sweep_value_is_refused(tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text(FACTORY.read_text() + '\n[sweep]\n"economics.pue" = [{ dist = "uniform", low = 1, high = 2 }]\n')
    assert "a grid value must be a number or a string" in one_line_error(invoke("run", scenario, *SMALL))


def test_deeply_nested_toml_is_a_one_line_error(tmp_path):
    scenario = tmp_path / "deep.toml"
    scenario.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nested too deeply" in one_line_error(invoke("run", scenario, "-o", tmp_path / "x.nc"))


def test_a_seed_beyond_64_bits_is_refused_before_any_work(tmp_path):
    result = invoke("run", FACTORY, *SMALL, "--seed", str(2 ** 70), "-o", tmp_path / "x.nc")
    assert result.exit_code == 2 and "--seed" in result.output
    assert listing(tmp_path) == set()


# -- traces -----------------------------------------------------------------------------------------------------

def _mooncake_line(t_ms, tokens=600):
    return json.dumps({"timestamp": t_ms, "input_length": tokens, "output_length": 20,
                       "hash_ids": list(range(-(-tokens // 512)))})


BAD_TRACES = {
    "latin1.jsonl": b"\xff\xfe{}\n",
    "packed.jsonl": b"\x1f\x8b\x08\x00rest",
    "notes.txt": b"hello\n",
    "future.jsonl": (_mooncake_line(0) + "\n" + _mooncake_line(9e15) + "\n").encode(),
    "year10000.csv": b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n"
                     b"10000-01-01 00:00:00,10,5\n",
    "deep.jsonl": ("[" * 100_000 + "]" * 100_000 + "\n").encode(),
    "empty.jsonl": b"",
}


@pytest.mark.parametrize("name", sorted(BAD_TRACES))
def test_a_bad_trace_is_a_one_line_error_and_leaves_nothing(name, tmp_path):
    (tmp_path / name).write_bytes(BAD_TRACES[name])
    out = tmp_path / "o.nc"
    result = invoke("run", FACTORY, *SMALL, "--set", f'workload.trace="{tmp_path / name}"', "-o", out)
    assert name in one_line_error(result)
    assert listing(tmp_path) == {name}


def test_an_unknown_bundled_trace_is_a_one_line_error(tmp_path):
    result = invoke("run", FACTORY, *SMALL, "--set", 'workload.trace="bundled:moonkake"', "-o", tmp_path / "o.nc")
    assert "did you mean 'mooncake'" in one_line_error(result)


def test_a_missing_trace_then_the_corrected_run(tmp_path):
    out = tmp_path / "o.nc"
    result = invoke("run", FACTORY, *SMALL, "--set", 'workload.trace="missing.jsonl"', "-o", out)
    assert "missing.jsonl" in one_line_error(result)
    assert listing(tmp_path) == set()
    assert invoke("run", FACTORY, *SMALL, "-o", out).exit_code == 0


# -- outputs ----------------------------------------------------------------------------------------------------

def test_an_output_under_a_file_is_refused_before_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    line = one_line_error(invoke("run", FACTORY, *SMALL, "-o", tmp_path / "afile" / "x.nc"))
    assert "afile is a file" in line
    assert listing(tmp_path) == {"afile"}


def test_an_output_that_is_a_folder_is_refused(tmp_path):
    (tmp_path / "x.nc").mkdir()
    assert "is a directory" in one_line_error(invoke("run", FACTORY, *SMALL, "-o", tmp_path / "x.nc"))


def test_a_read_only_folder_is_refused_before_work(tmp_path, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    assert "not writable" in one_line_error(invoke("run", FACTORY, *SMALL, "-o", tmp_path / "x.nc"))
    assert listing(tmp_path) == set()


def test_a_full_disk_is_a_one_line_error_and_keeps_the_parts(tmp_path, monkeypatch):
    import mcsim.results.dataset as dataset

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.nc"))

    monkeypatch.setattr(dataset.xr.Dataset, "to_netcdf", full)
    line = one_line_error(invoke("run", FACTORY, *SMALL, "-o", tmp_path / "x.nc"))
    assert "No space left on device" in line
    assert not (tmp_path / "x.nc").exists() and not list(tmp_path.glob(".x.nc.*.tmp"))
    assert list((tmp_path / "x.nc.parts").glob("*.npz"))  # the work is kept for --resume
    monkeypatch.undo()
    assert invoke("run", FACTORY, *SMALL, "-o", tmp_path / "x.nc", "--resume").exit_code == 0
    assert listing(tmp_path) == {"x.nc"}


def test_a_stale_temporary_of_the_output_is_removed(tmp_path):
    # mcsim's own name and a NetCDF-4 start: a write cut short by a kill (look-alikes: test_nothing_destroyed.py)
    (tmp_path / ".x.nc.mcsim-tmp-00112233deadbeef.tmp").write_bytes(b"\x89HDF\r\n\x1a\n half a netcdf")
    assert invoke("run", FACTORY, *SMALL, "-o", tmp_path / "x.nc").exit_code == 0
    assert listing(tmp_path) == {"x.nc"}


def test_meta_name_cannot_leave_the_outputs_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", FACTORY, *SMALL, "--set", 'meta.name="../../escape"')
    assert result.exit_code == 0, result.output
    assert (tmp_path / "outputs" / "escape.nc").exists() and not (tmp_path.parent / "escape.nc").exists()


def test_a_report_folder_is_not_replaced_without_force(tmp_path):
    out = tmp_path / "r.nc"
    assert invoke("run", FACTORY, *SMALL, "--set", 'meta.name="<script>x</script>\\n# heading"', "-o",
                  out).exit_code == 0
    folder = tmp_path / "rep"
    assert invoke("report", out, "-o", folder).exit_code == 0
    summary = (folder / "summary.md").read_text()
    assert "<script>" not in summary and "\n# heading" not in summary
    assert "earlier report" in one_line_error(invoke("report", out, "-o", folder))
    assert invoke("report", out, "-o", folder, "--force", "--metrics", "gross_margin").exit_code == 0
    assert sorted(p.name for p in folder.glob("dist_*")) == ["dist_gross_margin.png"]  # replaced, not merged
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_report_of_a_result_without_samples_leaves_nothing(tmp_path):
    path = tmp_path / "empty.nc"
    xr.Dataset(coords={"sample": [0, 1]}).to_netcdf(path)
    assert "nothing to report" in one_line_error(invoke("report", path, "-o", tmp_path / "rep"))
    assert listing(tmp_path) == {"empty.nc"}


# -- resume: nothing stale is merged ----------------------------------------------------------------------------

def _interrupted(tmp_path, monkeypatch, trace: Path):
    """A run whose every part is saved but whose final write was cut short."""
    import mcsim.results.dataset as dataset

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset, "write_netcdf", killed)
    scenario = tmp_path / "s.toml"
    scenario.write_text(FACTORY.read_text())
    result = invoke("run", scenario, *SMALL, "--chunk-size", "1", "--set", f'workload.trace="{trace}"',
                    "-o", tmp_path / "o.nc")
    assert result.exit_code == 130 and "--resume" in result.output
    monkeypatch.undo()
    return scenario


def _trace(path: Path, shift_ms: float) -> Path:
    path.write_text("\n".join(_mooncake_line(i * 500 + shift_ms * (i % 3), 600 + 512 * (i % 4))
                              for i in range(300)) + "\n")
    return path


def test_a_trace_rewritten_before_resume_is_detected(tmp_path, monkeypatch):
    trace = _trace(tmp_path / "t.jsonl", 0)
    scenario = _interrupted(tmp_path, monkeypatch, trace)
    _trace(trace, 137)  # rewritten between the kill and --resume
    out = tmp_path / "o.nc"
    result = invoke("run", scenario, *SMALL, "--chunk-size", "1", "--set", f'workload.trace="{trace}"', "-o", out,
                    "--resume")
    assert result.exit_code == 0, result.output
    fresh = tmp_path / "fresh.nc"
    assert invoke("run", scenario, *SMALL, "--chunk-size", "1", "--set", f'workload.trace="{trace}"',
                  "-o", fresh).exit_code == 0
    with xr.open_dataset(out) as a, xr.open_dataset(fresh) as b:
        assert a.attrs["parts_reused"] == 0  # the old parts belong to another trace: none merged
        np.testing.assert_array_equal(a.cost_usd_per_mtok.values, b.cost_usd_per_mtok.values)


def test_an_edited_part_and_a_removed_part_are_recomputed(tmp_path, monkeypatch):
    trace = _trace(tmp_path / "t.jsonl", 0)
    scenario = _interrupted(tmp_path, monkeypatch, trace)
    parts = sorted((tmp_path / "o.nc.parts").glob("*.npz"))
    assert len(parts) == 2
    with np.load(parts[0]) as z:
        table = {k: z[k] for k in z.files}
    name = next(k for k in table if not k.startswith("__") and table[k].dtype.kind == "f")
    table[name] = table[name] + 1.0  # values edited, stamp and checksum kept
    np.savez(parts[0], **table)
    parts[1].write_bytes(b"PK\x03\x04 cut short")  # a damaged part (a folder in its place is refused, see
    out = tmp_path / "o.nc"                        # test_nothing_destroyed.py)
    result = invoke("run", scenario, *SMALL, "--chunk-size", "1", "--set", f'workload.trace="{trace}"', "-o", out,
                    "--resume")
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert ds.attrs["parts_recomputed"] == 2 and ds.attrs["parts_reused"] == 0
    assert not (tmp_path / "o.nc.parts").exists()


def test_the_fingerprint_covers_every_file_read(tmp_path):
    trace = _trace(tmp_path / "t.jsonl", 0)
    scn = load_scenario(FACTORY, overrides=[f'workload.trace="{trace}"'])
    plan = executor.make_plan(scn, ("factory",), samples=2, requests=100)
    before = plan.fingerprint()
    _trace(trace, 1)
    assert executor.make_plan(scn, ("factory",), samples=2, requests=100).fingerprint() != before


# -- schedulers -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("address, words", [
    ("tcp://bad host", "expected an address"),
    ("ftp://x", "expected an address"),
    ("tcp://x:99999", "expected an address"),
])
def test_bad_scheduler_addresses_are_refused(address, words, tmp_path):
    result = invoke("run", FACTORY, *SMALL, "--scheduler", address, "-o", tmp_path / "x.nc")
    assert words in one_line_error(result)
    assert listing(tmp_path) == set()


def test_processes_and_a_scheduler_exclude_each_other(tmp_path):
    result = invoke("run", FACTORY, *SMALL, "--processes", "--scheduler", "tcp://127.0.0.1:9", "-o", tmp_path / "x")
    assert "exclude each other" in one_line_error(result)


def test_a_request_count_that_cannot_fit_is_refused_with_the_numbers(tmp_path):
    """A whole sample of 10^8 requests (chunks as large as the sample: not streamed) cannot fit; streamed, its
    estimate is a chunk and the caches' state, whatever the requests."""
    from mcsim.execution import executor
    from mcsim.scenario import load_scenario

    result = invoke("run", FACTORY, "--samples", "1", "--requests", "100000000", "--set",
                    "mc.chunk_requests=100000000", "-o", tmp_path / "x.nc")
    assert "GiB" in one_line_error(result)
    assert listing(tmp_path) == set()
    plan = executor.make_plan(load_scenario(FACTORY), ("factory",), samples=1, requests=10**8)
    streamed = executor.sample_bytes(plan)
    assert streamed < 3 * 2**30 and streamed == executor.sample_bytes(
        executor.make_plan(load_scenario(FACTORY), ("factory",), samples=1, requests=10**7))
    executor.check_memory(plan, 1)  # not refused


# -- the error boundary -----------------------------------------------------------------------------------------

def test_an_internal_error_is_one_line_and_debug_shows_the_traceback(tmp_path, monkeypatch):
    import mcsim.execution.sample as sample

    def broken(*args, **kwargs):
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(sample, "run_sample", broken)
    line = one_line_error(invoke("run", FACTORY, *SMALL, "-o", tmp_path / "x.nc"), code=1)
    assert "internal error: ZeroDivisionError" in line and "--debug" in line
    result = invoke("--debug", "run", FACTORY, *SMALL, "-o", tmp_path / "y.nc")
    assert isinstance(result.exception, ZeroDivisionError)
    assert listing(tmp_path) == set()


def test_control_characters_from_inputs_are_escaped(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": "\x1b[31mred", "input_length": 1, "output_length": 1, "hash_ids": [0]}\n')
    line = one_line_error(invoke("run", FACTORY, *SMALL, "--set", f'workload.trace="{trace}"', "-o",
                                 tmp_path / "o.nc"))
    assert "\x1b" not in line


# -- every accepted value runs or is refused ----------------------------------------------------------------------

def _range_edges():
    """Each numeric key and its lowest and highest accepted value (a moderate one where the range is open)."""
    cases = []
    for path, f in _numeric_fields(skip_sections=("mc",)):
        lo = -10 if f.lo is None else f.lo + ((1e-3 if f.kind == "float" else 1) if f.lo_open else 0)
        hi = lo * 10 + 10 if f.hi is None else f.hi
        cases.append(pytest.param(path, tuple(int(v) if f.kind == "int" else float(v) for v in (lo, hi)), id=path))
    return cases


def _model_run(path: str, value) -> str | None:
    """One sample of 150 requests of dense-node with ``path = value``, in this process: None where it ran, else the
    refusal's message. Every model stage runs (the command line's Dask, assembly and file writing are the same for
    every value and are exercised by the tests of the commands)."""
    start = time.perf_counter()
    try:
        scn = load_scenario(DENSE, overrides=[f"{path}={value}"])
        executor.run_task(executor.make_plan(scn, ("factory",), samples=1, requests=150), 0, 0)
        return None
    except McsimError as err:  # the command line prints these as one line, exit 2
        return str(err)
    finally:
        assert time.perf_counter() - start < 30.0  # no accepted value hangs


@pytest.mark.slow
@pytest.mark.parametrize("path, values", _range_edges())
def test_every_accepted_value_runs_or_is_refused_in_one_line(path, values):
    # Anything but a McsimError (an internal error) fails the test; a refusal is one line naming a key.
    for value in values:
        refusal = _model_run(path, value)
        if refusal is not None:
            assert "\n" not in refusal.strip(), refusal
            assert re.search(r"\b[a-z_]+\.[a-z_]+\b", refusal), refusal  # names a dotted key


def test_an_accepted_edge_runs_from_the_command_line_as_a_grid(tmp_path):
    # The command-line form of the check above, for one key whose edges both run: the grid of both writes its file.
    result = invoke("run", DENSE, "--samples", "1", "--requests", "150", "--no-progress", "--grid",
                    "performance.token_budget=1,20", "-o", tmp_path / "x.nc")
    assert result.exit_code == 0, result.output
    with xr.open_dataset(tmp_path / "x.nc") as ds:
        assert ds.sizes["performance_token_budget"] == 2 and bool(ds["feasible"].all())


def _closed_loopback_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_closed_scheduler_port_fails_within_seconds_in_one_line(tmp_path):
    address = f"tcp://127.0.0.1:{_closed_loopback_port()}"
    started = time.monotonic()
    result = invoke("run", FACTORY, *SMALL, "--scheduler", address, "-o", tmp_path / "x.nc")
    assert time.monotonic() - started < 5
    message = one_line_error(result)
    assert address in message and "connection refused" in message
    assert listing(tmp_path) == set()


def test_a_scheduler_name_that_does_not_resolve_fails_in_one_line(tmp_path, monkeypatch):
    import socket

    def no_such_name(*args, **kwargs):  # the resolver's answer for an unknown name, without asking any server
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    result = invoke("run", FACTORY, *SMALL, "--scheduler", f"tcp://localhost:{_closed_loopback_port()}", "-o",
                    tmp_path / "x.nc")
    message = one_line_error(result)
    assert "cannot resolve the host name 'localhost'" in message
    assert "Name or service not known" in message
