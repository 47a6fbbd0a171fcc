"""Results a user can reuse: CF-clean NetCDF (checked by cfchecks), units pint parses, and every Python idiom of the
README's Python API section run on real results."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import mcsim
from mcsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
CF_TABLES = Path(__file__).parent / "data" / "cf"
SMALL = dict(samples=3, requests=400)
SMALL_SET = ["--set", "mc.samples=3", "--set", "mc.requests=400", "--no-progress"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One file of every kind of result: run, compare, sweep (a number and a string axis), ablate, search and
    capacity."""
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("cf")
    runner = CliRunner()
    commands = {
        "run": ["run", "scenarios/dense-model.toml"],
        "compare": ["compare", "scenarios/dense-model.toml"],
        "sweep": ["sweep", "scenarios/dense-model.toml", "--grid", "hardware.preset=h100,h200",
                  "--grid", "workload.rate_rps=20,60"],
        "ablate": ["compare", "scenarios/dense-model.toml", "--ablate"],
        "search": ["search", "scenarios/dense-model.toml", "--space", "hardware.preset=h100,h200", "--space",
                   "deployment.max_batch_per_gpu=32,64", "--constraint", "slo_attainment>=0.9", "--first-round", "2"],
        "capacity": ["capacity", "scenarios/dense-model.toml", "--rtol", "0.2"],
    }
    paths = {}
    for kind, words in commands.items():
        words = [str(ROOT / w) if w.endswith(".toml") else w for w in words]
        paths[kind] = out / f"{kind}.nc"
        result = runner.invoke(main, [*words, *SMALL_SET, "-o", str(paths[kind])])
        assert result.exit_code == 0, result.output
    return paths


def _cf_checker():
    try:
        from cfchecker.cfchecks import CFChecker
    except (ImportError, OSError) as err:  # cfunits needs the UDUNITS-2 C library (Debian: libudunits2-0)
        pytest.skip(f"cfchecker cannot run here: {err}")
    return CFChecker(cfStandardNamesXML=str(CF_TABLES / "cf-standard-name-table.xml"),
                     cfAreaTypesXML=str(CF_TABLES / "area-type-table.xml"),
                     cfRegionNamesXML=str(CF_TABLES / "standardized-region-list.xml"), silent=True)


@pytest.mark.parametrize("kind", ["run", "compare", "sweep", "ablate", "search", "capacity"])
def test_cfchecks_finds_no_error(results, kind):
    checker = _cf_checker()
    checker.checker(str(results[kind]))
    messages = [m for m in checker.all_messages if m.startswith(("ERROR:", "WARN:", "FATAL:"))]
    counts = checker.get_total_counts()
    assert counts["FATAL"] == 0 and counts["ERROR"] == 0, messages
    # What is left are warnings CF allows: string-labelled coordinates (tier, variant, lever, hardware preset) and
    # the calendar-free month of payback_months.
    for message in messages:
        assert ("Possible incorrect declaration of a coordinate variable" in message
                or "The unit 'month'" in message), message


def test_units_parse_in_udunits_and_pint(results):
    pytest.importorskip("pint_xarray")  # registers the .pint accessor
    try:
        from cfunits import Units
    except (ImportError, OSError) as err:
        pytest.skip(f"cfunits cannot run here: {err}")
    for kind, path in results.items():
        with xr.open_dataset(path) as ds:
            for name, v in ds.variables.items():
                assert "units" in v.attrs, f"{kind}: {name} has no units"
                assert Units(v.attrs["units"]).isvalid, f"{kind}: {name}: {v.attrs['units']!r}"
            quantified = ds.pint.quantify()  # raises on any unit pint cannot parse
            assert str(quantified.ttft_s.pint.units) == "second"
            assert str(quantified.decode_tok_s_per_gpu.pint.units) == "1 / second"
            assert str(quantified.cost_usd_per_day.pint.units) == "1 / day"
            assert ds.cost_usd_per_day.attrs["currency"] == "USD"
            assert ds.cost_usd_per_mtok.attrs["display_units"] == "USD/Mtok"


def test_names_have_no_dots_and_paths_travel(results):
    with xr.open_dataset(results["sweep"]) as ds:
        assert all("." not in str(n) for n in [*ds.variables, *ds.dims])
        assert ds.hardware_preset.attrs["path"] == "hardware.preset"
        assert ds.workload_rate_rps.attrs["path"] == "workload.rate_rps"
        assert list(ds.hardware_preset.values) == ["h100", "h200"]  # string labels reopen as labels
        assert ds.attrs["Conventions"] == "CF-1.8"
        for key in ("title", "history", "source", "references", "dependencies", "command_line"):
            assert ds.attrs[key], key
        assert "numpy " in ds.attrs["dependencies"] and "xarray " in ds.attrs["dependencies"]
        assert ds.attrs["source"].startswith(f"mcsim {mcsim.__version__}")


def test_command_line_runs_again_to_the_same_numbers(results, tmp_path):
    from click.testing import CliRunner

    with xr.open_dataset(results["sweep"]) as first:
        words = shlex.split(first.attrs["command_line"])
        assert words[:2] == ["mcsim", "sweep"] and words.count("--grid") == 2
        out = tmp_path / "again.nc"
        words[words.index("--output") + 1] = str(out)
        result = CliRunner().invoke(main, words[1:])
        assert result.exit_code == 0, result.output
        with xr.open_dataset(out) as again:
            for name in ("cost_usd_per_mtok", "ttft_s", "gross_margin"):
                np.testing.assert_array_equal(first[name].values, again[name].values)


def test_python_api_records_the_equivalent_call():
    ds = mcsim.run(ROOT / "scenarios/dense-model.toml", samples=2, requests=300)
    call = ds.attrs["command_line"]
    assert call.startswith("import mcsim; mcsim.run(") and "samples=2" in call and "requests=300" in call
    namespace: dict = {}
    exec(call.replace("mcsim.run(", "ds = mcsim.run(", 1), namespace)  # the statement runs as recorded
    np.testing.assert_array_equal(namespace["ds"].cost_usd_per_mtok.values, ds.cost_usd_per_mtok.values)


def _readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):text.index("\n## ", text.index("## Python API") + 5)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_every_readme_python_idiom_runs(tmp_path, monkeypatch):
    """The README's Python API blocks run as written, on smaller runs of the same calls."""
    blocks = _readme_blocks()
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenarios").mkdir()
    for path in (ROOT / "scenarios").iterdir():
        if path.name != "sweep.toml":
            (tmp_path / "scenarios" / path.name).symlink_to(path)
    # sweep.toml's own grid (4 x 5 x 2 points) narrowed to 2 x 2 x 2: every value the idioms select stays in it
    text = (ROOT / "scenarios" / "sweep.toml").read_text()
    for wide, narrow in (('"speculative.draft_tokens" = [0, 1, 2, 3]', '"speculative.draft_tokens" = [0, 1]'),
                         ("num = 5 }", "num = 2 }")):
        assert text.count(wide) == 1, wide
        text = text.replace(wide, narrow)
    (tmp_path / "scenarios" / "sweep.toml").write_text(text)
    for name in ("run", "compare", "sweep", "capacity"):  # the calls as written, with few samples and requests
        monkeypatch.setattr(mcsim, name, _smaller(getattr(mcsim, name)))
    namespace: dict = {}
    lines_run = 0
    for block in blocks:
        for statement in _statements(block):
            exec(statement, namespace)  # noqa: S102 - the README's own code
            lines_run += 1
    assert lines_run >= 15
    sw = namespace["sw"]
    # what the idioms give is what the numbers say
    paired = (sw.cost_usd_per_mtok.sel(hardware_preset="h200") / sw.cost_usd_per_mtok.sel(hardware_preset="h800"))
    axis = sw.cost_usd_per_mtok.dims.index("hardware_preset")
    assert list(sw.hardware_preset.values) == ["h800", "h200"]
    values = sw.cost_usd_per_mtok.values
    np.testing.assert_allclose(paired.transpose(*[d for d in sw.cost_usd_per_mtok.dims if d != "hardware_preset"]),
                               np.take(values, 1, axis=axis) / np.take(values, 0, axis=axis))
    selected = sw.query(sample="workload_rate_rps > 700")
    assert set(selected.sample.values) == set(np.flatnonzero(sw.workload_rate_rps.values > 700))
    assert set(namespace["latency"].data_vars) == {"ttft_p99_s", "tpot_p50_s"}


def _smaller(call):
    """``call`` with SMALL's samples and requests in place of the ones the README's call passes."""
    @functools.wraps(call)
    def smaller(*args, **kwargs):
        return call(*args, **{**kwargs, **SMALL})
    return smaller


def _statements(block: str) -> list[str]:
    """The block's top-level statements (a statement continues on indented or bracket-continued lines)."""
    statements, current, depth = [], [], 0
    for line in block.splitlines():
        if not line.strip() and not current:
            continue
        current.append(line)
        code = line.split("#", 1)[0]
        depth += code.count("(") + code.count("[") + code.count("{") - code.count(")") - code.count("]") \
            - code.count("}")
        if depth == 0:
            statements.append("\n".join(current))
            current = []
    return statements


def test_workload_and_request_count_per_grid_point(tmp_path):
    """A time-scale sweep of a short trace: the workload attribute names each time scale, and the footer counts the
    requests the trace held, not the number asked for."""
    from click.testing import CliRunner

    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    lines += [f"2023-11-16 18:15:{i // 10:02d}.{(i % 10) * 100000:06d},{100 + i},{20 + i % 7}" for i in range(40)]
    trace = tmp_path / "short.csv"
    trace.write_text("\n".join(lines) + "\n")
    out = tmp_path / "scaled.nc"
    result = CliRunner().invoke(main, [
        "sweep", str(ROOT / "scenarios/dense-model.toml"), "--set", f"workload.trace={str(trace)!r}".replace("'", '"'),
        "--set", 'workload.trace_format="azure"', "--grid", "workload.trace_time_scale=1,2", "--grid",
        "workload.rate_rps=20,60", "--set", "mc.samples=2", "--set", "mc.requests=5000", "--no-progress", "-o",
        str(out)])
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        counts = set(np.unique(ds.requests.values).tolist())
        assert len(counts) == 1 and counts.pop() <= 40
        n = int(ds.requests.values.flat[0])
        workload = ds.attrs["workload"]
    # 40 requests, a quarter of them warm-up (dense-model's mc.warmup_fraction), of 5000 asked for
    assert n == 40 - int(0.25 * 40)
    assert f"2 samples x {n} measured requests (the trace held fewer than the 5000 asked for" in \
        " ".join(result.output.split())
    assert workload.startswith("varies over the grid: ")
    assert "workload.trace_time_scale=1: " in workload and "(time scale 2," in workload
    assert "rate_rps" not in workload  # a trace keeps its own arrival rate
