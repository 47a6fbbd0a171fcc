"""The command line: bad input is a short message and exit code 2; good runs write a self-describing NetCDF."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import xarray as xr
from click.testing import CliRunner

from mcsim.cli import main

FACTORY = Path(__file__).resolve().parents[1] / "scenarios" / "factory.toml"

CONTRACT = [
    "decode_tok_s_per_gpu", "prefill_tok_s_per_gpu", "cache_hit_rate", "cache_hit_rate_by_tier",
    "spec_tokens_per_pass", "expert_efficiency", "batch_efficiency", "ttft_s", "tpot_s", "gpus", "gpu_hours",
    "energy_j_per_token", "cost_usd_per_mtok", "revenue_usd_per_day", "cost_usd_per_day", "gross_margin",
    "payback_months", "feasible",
]

SMALL = ["--samples", "2", "--requests", "300", "--no-progress"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_usage_error(result, *fragments):
    """Exit code 2, a one- or two-line message on stderr naming what is wrong, no traceback."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert result.stdout == ""


def leftovers(folder: Path):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


# -- bad input -------------------------------------------------------------------------------------------------

def test_misspelt_key_exits_2_naming_file_key_and_suggestion(tmp_path):
    scenario = tmp_path / "typo.toml"
    scenario.write_text(FACTORY.read_text().replace("dram_gb_per_node = 1024", "dram_gb_per_nod = 1024"))
    out = tmp_path / "out.nc"
    result = invoke("run", scenario, *SMALL, "-o", out)
    assert_usage_error(result, str(scenario), "cache.dram_gb_per_nod", "did you mean 'dram_gb_per_node'")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [scenario]


@pytest.mark.parametrize("override, fragments", [
    ("speculative.draft_tokens", ["--set", "speculative.draft_tokens", "PATH=VALUE"]),
    ("speculative.draft_tokens=lots", ["speculative.draft_tokens", "integer"]),
    ("cache.dram_gb_per_nod=5", ["cache.dram_gb_per_nod", "did you mean 'dram_gb_per_node'"]),
    ("hardware.preset=h100x", ["hardware.preset", "Did you mean 'h100'?"]),
    ("workload.trace=no-such-trace.jsonl", ["workload.trace", "no-such-trace.jsonl"]),
])
def test_bad_set_exits_2(tmp_path, override, fragments):
    out = tmp_path / "out.nc"
    result = invoke("run", FACTORY, *SMALL, "--set", override, "-o", out)
    assert_usage_error(result, *fragments)
    assert not out.exists() and leftovers(tmp_path) == []


def test_missing_scenario_exits_2(tmp_path):
    result = invoke("run", tmp_path / "nowhere.toml", "-o", tmp_path / "out.nc")
    assert_usage_error(result, "nowhere.toml", "cannot read")


def test_malformed_trace_names_file_and_line(tmp_path):
    trace = tmp_path / "broken.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]}\n'
                     '{"timestamp": 5, "input_length": 700, "output_length": \n')
    out = tmp_path / "out.nc"
    result = invoke("run", FACTORY, *SMALL, "--set", f"workload.trace={trace}", "-o", out)
    assert_usage_error(result, str(trace), "line 2")
    assert not out.exists() and leftovers(tmp_path) == []


def test_existing_output_is_kept_without_force(tmp_path):
    out = tmp_path / "out.nc"
    out.write_bytes(b"precious")
    result = invoke("run", FACTORY, *SMALL, "-o", out)
    assert_usage_error(result, str(out), "--force")
    assert out.read_bytes() == b"precious"
    assert leftovers(tmp_path) == []


# -- good runs ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def replaced(tmp_path_factory):
    """A run that replaces an existing file with --force."""
    folder = tmp_path_factory.mktemp("run")
    out = folder / "out.nc"
    out.write_bytes(b"old")
    result = invoke("run", FACTORY, *SMALL, "-o", out, "--force")
    return folder, out, result


def test_force_replaces_the_output(replaced):
    folder, out, result = replaced
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:3] != b"old"
    assert f"wrote {out}" in result.stdout
    assert leftovers(folder) == [] and [p.name for p in folder.iterdir()] == ["out.nc"]


def test_output_reopens_with_the_contract_variables(replaced):
    _, out, _ = replaced
    with xr.open_dataset(out) as ds:
        assert ds.sizes["sample"] == 2
        assert "variant" not in ds.dims
        for name in CONTRACT:
            assert name in ds.data_vars, name
            assert ds[name].attrs.get("units"), name
            assert ds[name].attrs.get("long_name"), name
        assert ds["cache_hit_rate_by_tier"].dims == ("sample", "tier")
        assert list(ds["tier"].values) == ["hbm", "dram", "nvme"]
        assert ds.attrs["scenario_name"] == "factory"
        assert ds.attrs["samples"] == 2 and ds.attrs["requests_per_sample"] == 300
        assert ds.attrs["scenario_text"] == FACTORY.read_text()
        # uncertain inputs are stored as inputs
        assert ds["workload_rate_rps"].attrs["role"] == "input"
        assert ((ds["workload_rate_rps"] >= 550) & (ds["workload_rate_rps"] <= 750)).all()


def test_text_summary_lists_headline_metrics(replaced):
    _, _, result = replaced
    for name in ("decode_tok_s_per_gpu", "gross_margin", "cost_usd_per_mtok"):
        assert name in result.stdout


def test_json_summary_is_valid_json(tmp_path):
    out = tmp_path / "out.nc"
    result = invoke("run", FACTORY, *SMALL, "-o", out, "--json")
    assert result.exit_code == 0, result.output

    def refuse(constant):  # NaN and Infinity are not JSON
        raise ValueError(f"not JSON: {constant}")

    report = json.loads(result.stdout, parse_constant=refuse)
    assert report["output"] == str(out)
    gross = report["variants"]["factory"]["gross_margin"]
    assert gross["p5"] <= gross["median"] <= gross["p95"]
    assert out.exists() and leftovers(tmp_path) == []


def test_compare_has_a_variant_dim(tmp_path):
    out = tmp_path / "cmp.nc"
    result = invoke("compare", FACTORY, *SMALL, "-o", out)
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert list(ds["variant"].values) == ["baseline", "factory"]
        assert ds["gross_margin"].dims == ("variant", "sample")
        for name in CONTRACT:
            assert "variant" in ds[name].dims, name
    assert leftovers(tmp_path) == []


def test_default_output_is_outputs_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", FACTORY, *SMALL)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "outputs" / "factory.nc").exists()
    assert "wrote outputs/factory.nc" in result.stdout


def test_module_help():
    proc = subprocess.run([sys.executable, "-m", "mcsim", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "run" in proc.stdout and "compare" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "mcsim", "run", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "--set" in proc.stdout and "--force" in proc.stdout


def test_provenance_records_the_parsed_command_and_permissions(replaced):
    _, out, _ = replaced
    with xr.open_dataset(out) as ds:
        command = ds.attrs["command_line"]
    assert command.startswith("mcsim run ") and "--samples 2" in command and "--requests 300" in command
    assert "--force" in command
    assert out.stat().st_mode & 0o044  # not the 0600 of a temporary file


def test_moe_layout_is_checked_for_the_baseline_too(tmp_path):
    # EPLB needs groups to divide the experts; the message names the key.
    result = invoke("run", FACTORY, *SMALL, "--set", "moe.groups=7", "-o", tmp_path / "x.nc")
    assert_usage_error(result, "moe.groups", "256")


def test_sweep_and_report_commands(tmp_path):
    out = tmp_path / "s.nc"
    result = invoke("sweep", FACTORY, *SMALL, "--grid", "speculative.draft_tokens=0,1", "--grid",
                    "hardware.preset=h800,h200", "-o", out)
    assert result.exit_code == 0, result.output
    assert "per grid point" in result.stdout
    with xr.open_dataset(out) as ds:
        assert ds.gross_margin.dims == ("speculative_draft_tokens", "hardware_preset", "sample")
    assert not (tmp_path / "s.nc.parts").exists()
    report_dir = tmp_path / "rep"
    result = invoke("report", out, "-o", report_dir)
    assert result.exit_code == 0, result.output
    assert (report_dir / "summary.md").exists() and list(report_dir.glob("heatmap_*.png"))


def test_bad_grid_exits_2(tmp_path):
    result = invoke("sweep", FACTORY, *SMALL, "--grid", "speculative.draft_tokes=0,1", "-o", tmp_path / "x.nc")
    assert_usage_error(result, "speculative.draft_tokes", "did you mean")
    result = invoke("sweep", FACTORY, *SMALL, "--grid", "cache.dram_gb_per_node=0:10", "-o", tmp_path / "x.nc")
    assert result.exit_code == 2


def test_compare_ablate_prints_shapley_shares(tmp_path):
    result = invoke("compare", FACTORY, *SMALL, "--ablate", "-o", tmp_path / "a.nc")
    assert result.exit_code == 0, result.output
    assert "Shapley share" in result.stdout and "kv_cache" in result.stdout


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_bar_is_drawn_on_a_terminal_only():
    from mcsim.execution.executor import _progress_bar, _show_rate

    assert _progress_bar(10, 0, io.StringIO()) is None  # a log file or a pipe
    bar = _progress_bar(10, 3, _Terminal())
    try:
        assert bar is not None and bar.total == 10 and bar.n == 3
        _show_rate(bar, 2_500_000, 2.0)  # the requests simulated so far, and per second
        assert bar.postfix == "2.5 M requests, 1.25 M requests/s"
        _show_rate(bar, 900, 1.0)
        assert bar.postfix == "900 requests, 900 requests/s"
    finally:
        bar.close()


def test_samples_in_flight_report_their_requests_to_the_client():
    """A streamed sample's chunks reach the client as events while it runs: the bar's count moves before the task
    ends (two variants each stream the requests once), and a task's count leaves once it is done."""
    from dask.distributed import Client, LocalCluster

    from mcsim.execution import progress
    from mcsim.execution.sample import run_sample
    from mcsim.scenario import draw_uncertain, load_scenario

    scn = load_scenario(FACTORY, overrides=["mc.chunk_requests=1000"])
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 1).items()}
    variants = {"factory": {}, "cheaper": {"economics.electricity_usd_per_kwh": 0.05}}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        inflight = progress.InFlight({"t1": 3500}, weight=2)
        client.subscribe_topic(progress.TOPIC, inflight)
        seen = client.submit(lambda: run_sample(scn, variants, 0, 1, 3500, draws) and 1, key="t1")
        assert seen.result() == 1
        deadline = time.monotonic() + 10
        while inflight.requests() < 3500 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert inflight.counts["t1"] == 2 * 3500 and inflight.requests() == 3500
        inflight.finish("t1")
        inflight(("now", ["t1", 1000]))  # a late event of a finished task is not counted again
        assert inflight.requests() == 0
    progress.report(10)  # outside a worker: nothing to do, no error


def test_a_run_logged_to_a_file_has_no_progress_frames(tmp_path, monkeypatch):
    import tqdm

    made = []
    monkeypatch.setattr(tqdm, "tqdm", lambda *a, **k: made.append(k) or pytest.fail("a bar on a non-terminal"))
    result = invoke("run", FACTORY, "--samples", "2", "--requests", "300", "-o", tmp_path / "x.nc")  # no --no-progress
    assert result.exit_code == 0, result.output
    assert made == [] and "\r" not in result.stderr


def test_search_space_and_schema_output_errors_name_what_the_user_typed(tmp_path):
    dense = Path(__file__).resolve().parents[1] / "scenarios" / "dense-node.toml"
    result = invoke("search", dense, "--space", "deployment.tpx=2,4", "--objective", "cost_usd_per_mtok")
    assert_usage_error(result, "deployment.tpx", "--space", "did you mean 'tp'")
    result = invoke("schema", "-o", tmp_path / "missing" / "x.json")
    assert_usage_error(result, str(tmp_path / "missing" / "x.json"), "no such folder")
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_missing_choice_is_listed_on_one_line_without_escapes():
    from helpers import invoke

    result = invoke("list")
    assert result.exit_code == 2 and "\\n" not in result.stderr and "\\t" not in result.stderr
    assert "presets, models, hardware, keys" in result.stderr and len(result.stderr.strip().splitlines()) == 1
