"""Sweeps: grid axes, identical results on any scheduler, nothing lost on interruption, lever attribution."""

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import mcsim
import mcsim.execution.api
import mcsim.results.names
from mcsim.results import attribution
from mcsim.scenario import grid
from mcsim.scenario import ScenarioError, load_scenario

from helpers import invoke

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["deployment.gpus_per_instance=32", "deployment.prefill_gpus_per_instance=32", "moe.nodes=4",
         "workload.rate_rps=150"]
GRID = ["speculative.draft_tokens=0,1,2", "hardware.preset=h800,h200"]
VOLATILE = {"created", "history", "command_line", "parts_reused", "parts_recomputed", "chunk_size", "fingerprint"}


@pytest.fixture(scope="module")
def scn():
    return load_scenario(ROOT / "scenarios" / "factory.toml", overrides=SMALL)


def assert_same_results(a: xr.Dataset, b: xr.Dataset):
    assert set(a.data_vars) == set(b.data_vars)
    for name in a.data_vars:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    for name in a.coords:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)
    assert {k: v for k, v in a.attrs.items() if k not in VOLATILE} == \
        {k: v for k, v in b.attrs.items() if k not in VOLATILE}


# -- grid axes ---------------------------------------------------------------------------------------------------

def test_grid_option_forms():
    assert grid.parse_grid_option("speculative.draft_tokens=0,1,2").values == (0, 1, 2)
    assert grid.parse_grid_option("hardware.preset=h800,h200").values == ("h800", "h200")
    assert grid.parse_grid_option("cache.dram_gb_per_node=0:2048:5").values == (0, 512, 1024, 1536, 2048)
    log = grid.parse_grid_option("workload.rate_rps=10:1000:3:log").values
    np.testing.assert_allclose(log, [10, 100, 1000])
    with pytest.raises(ScenarioError, match="expected PATH"):
        grid.parse_grid_option("nonsense")


def test_sweep_table_and_validation(scn):
    text = (ROOT / "scenarios" / "factory.toml").read_text() + """
[sweep]
"speculative.draft_tokens" = [1, 2]
cache.dram_gb_per_node = { start = 0, stop = 1024, num = 3 }
"""
    loaded = load_scenario("s.toml", text=text)
    assert [(a.path, a.values) for a in loaded.sweep] == [
        ("speculative.draft_tokens", (1, 2)), ("cache.dram_gb_per_node", (0.0, 512.0, 1024.0))]
    with pytest.raises(ScenarioError, match="speculative.draft_tokes.*did you mean"):
        grid.validate_axes(scn, [grid.parse_grid_option("speculative.draft_tokes=1,2")])
    with pytest.raises(ScenarioError, match="hardware.preset"):
        grid.validate_axes(scn, [grid.parse_grid_option("hardware.preset=h800,h900")])
    with pytest.raises(ScenarioError, match="integers"):
        grid.validate_axes(scn, [grid.parse_grid_option("speculative.draft_tokens=0:1:3")])
    with pytest.raises(ScenarioError, match="economics.target_utilization.*got 1.5"):
        grid.validate_axes(scn, [grid.parse_grid_option("economics.target_utilization=0.5,1.5")])


@pytest.fixture(scope="module")
def swept(scn):
    # 3 samples in chunks of 2: one chunk is short
    return mcsim.sweep(scn, GRID, samples=3, requests=800, workers=2, chunk_size=2)


def test_axes_become_dims_named_by_path(swept):
    assert swept.gross_margin.dims == ("speculative_draft_tokens", "hardware_preset", "sample")
    assert list(swept["hardware_preset"].values) == ["h800", "h200"]  # the user's order, not sorted
    assert list(swept["speculative_draft_tokens"].values) == [0, 1, 2]
    assert swept.attrs["grid_axes"] == "speculative.draft_tokens hardware.preset"
    assert swept["hardware_preset"].attrs["path"] == "hardware.preset"
    # selection by dotted path, as a user names the axes in the scenario
    by_path = mcsim.sel(swept, {"speculative.draft_tokens": 2, "hardware.preset": "h200"})
    np.testing.assert_array_equal(by_path.gross_margin.values,
                                  swept.gross_margin.isel(speculative_draft_tokens=2, hardware_preset=1).values)
    with pytest.raises(mcsim.results.names.PathError, match="speculative.draft_tokens"):
        mcsim.sel(swept, "speculative.draft", 2)


def test_grid_points_share_sample_streams(swept):
    # Common random numbers: the workload and the cache do not depend on draft tokens or hardware price, so they
    # are bit-identical across those grid points; draft tokens then change the speculative gain only.
    for name in ("mean_input_tokens", "mean_output_tokens", "trace_duration_s"):
        values = swept[name].values
        assert np.all(values == values[:1, :1]), name
    hits = swept.cache_hit_rate.sel({"hardware_preset": "h800"}).values
    assert np.all(hits == hits[:1])
    gains = swept.spec_tokens_per_pass.sel({"hardware_preset": "h800"}).values
    assert np.all(gains[0] == 1) and np.all(gains[2] > gains[1])


def test_a_grid_point_equals_the_same_run_alone(scn, swept):
    alone = mcsim.run(scn, samples=3, requests=800, workers=1,
                      overrides=["speculative.draft_tokens=2", 'hardware.preset="h200"'])
    point = swept.sel({"speculative_draft_tokens": 2, "hardware_preset": "h200"})
    for name in ("decode_tok_s_per_gpu", "cost_usd_per_mtok", "ttft_s", "cache_hit_rate_by_tier"):
        np.testing.assert_array_equal(point[name].values, alone[name].values, err_msg=name)


@pytest.fixture(scope="module")
def cluster():
    """A local cluster of two worker processes (one thread each), for the tests that run on processes."""
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as running:
        yield running


def test_threads_chunks_and_a_local_cluster_of_processes_agree(scn, swept, cluster):
    one = mcsim.sweep(scn, GRID, samples=3, requests=800, workers=1, chunk_size=3)
    assert_same_results(swept, one)
    remote = mcsim.sweep(scn, GRID, samples=3, requests=800, chunk_size=1, scheduler=cluster.scheduler_address)
    assert_same_results(swept, remote)


def test_latin_hypercube_option(scn):
    ds = mcsim.sweep(scn, ["speculative.draft_tokens=1"], samples=8, requests=600, overrides=['mc.sampling="lhs"'])
    u_strata = []
    dist = scn.uncertain()["efficiency.comm_overlap_gain"]  # uniform(1.1, 1.3)
    u = (ds["efficiency_comm_overlap_gain"].values - dist.params["low"]) / (dist.params["high"] - dist.params["low"])
    u_strata = np.sort(np.floor(u * 8).astype(int))
    assert list(u_strata) == list(range(8))  # one draw per stratum


# -- nothing lost ------------------------------------------------------------------------------------------------

def _cli(*args, **kw):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "mcsim", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


SWEEP_ARGS = ["sweep", ROOT / "scenarios" / "factory.toml", *[x for s in SMALL for x in ("--set", s)],
              "--grid", "speculative.draft_tokens=0,2", "--samples", "6", "--requests", "2500", "--chunk-size", "1",
              "--workers", "1", "--no-progress"]
#: Samples streamed in chunks of 1,000 requests (mcsim.execution.sample.streamed).
STREAMED = "mc.chunk_requests=1000"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The files SWEEP_ARGS write when nothing interrupts them (the same call, made from Python), whole samples
    and streamed ones."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    paths = {}
    for extra in ((), (STREAMED,)):
        paths[extra] = folder / f"reference{len(extra)}.nc"
        mcsim.sweep(ROOT / "scenarios" / "factory.toml", ["speculative.draft_tokens=0,2"], overrides=[*SMALL, *extra],
                    samples=6, requests=2500, chunk_size=1, workers=1, output=paths[extra])
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("how, extra", [(signal.SIGINT, ()), (signal.SIGKILL, (STREAMED,))])
def test_interrupted_sweep_resumes_to_the_same_file(tmp_path, how, extra, uninterrupted):
    """Interrupted (Ctrl-C) or killed, a sweep resumes to the file an uninterrupted one writes, with whole samples
    and with streamed ones."""
    reference = uninterrupted[extra]
    args = [*SWEEP_ARGS, *[x for s in extra for x in ("--set", s)]]

    out = tmp_path / "out.nc"
    parts = tmp_path / "out.nc.parts"
    proc = _cli(*args, "-o", out)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(parts.glob("*.npz"))) < 4:
        time.sleep(0.05)
    proc.send_signal(how)
    code = proc.wait(timeout=60)
    assert not out.exists()
    saved = len(list(parts.glob("*.npz")))
    assert 4 <= saved < 12, saved
    if how == signal.SIGINT:
        assert code == 130 and "--resume" in proc.stderr.read()

    # Without --resume the leftover parts are not silently discarded or merged (the same command, run in this
    # process from here on: only the interruption needs a process of its own).
    refused = invoke(*args, "-o", out)
    assert refused.exit_code == 2 and "--resume" in refused.stderr

    resumed = invoke(*args, "-o", out, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert not parts.exists()
    with xr.open_dataset(out) as a, xr.open_dataset(reference) as b:
        assert_same_results(a, b)
        assert a.attrs["parts_reused"] >= 4
    if extra:  # the streamed samples differ from whole ones (sketched quantiles): the reference is theirs
        with xr.open_dataset(uninterrupted[()]) as whole, xr.open_dataset(reference) as b:
            assert not np.array_equal(whole["ttft_s"].values, b["ttft_s"].values)
            np.testing.assert_array_equal(whole["cache_hit_rate"].values, b["cache_hit_rate"].values)


def test_damaged_and_foreign_parts_are_recomputed(scn, tmp_path):
    from mcsim.execution import executor as sweep_module

    axes = ["speculative.draft_tokens=0,1"]
    clean = mcsim.sweep(scn, axes, samples=4, requests=800, chunk_size=2, output=tmp_path / "clean.nc")
    assert not (tmp_path / "clean.nc.parts").exists()  # parts are removed once the file is assembled

    plan = sweep_module.make_plan(scn, ("factory",), axes=grid.validate_axes(scn, [grid.parse_grid_option(axes[0])]),
                                  samples=4, requests=800, chunk_size=2)
    other = sweep_module.make_plan(scn, ("factory",), axes=plan.axes, samples=4, requests=800, chunk_size=2, seed=99)
    parts = tmp_path / "r.nc.parts"
    parts.mkdir()
    # a part of another run (other seed), a good part, and a damaged one
    foreign = mcsim.results.dataset.rows_to_table(sweep_module.run_task(other, 0, 0), ("factory",))
    sweep_module._write_part(parts / "point000000-chunk000000.npz", foreign, other, 0, 0, other.fingerprint())
    good = mcsim.results.dataset.rows_to_table(sweep_module.run_task(plan, 1, 1), ("factory",))
    sweep_module._write_part(parts / "point000001-chunk000001.npz", good, plan, 1, 1, plan.fingerprint())
    (parts / "point000000-chunk000001.npz").write_bytes(b"PK\x03\x04 truncated")
    resumed = mcsim.sweep(scn, axes, samples=4, requests=800, chunk_size=2, output=tmp_path / "r.nc", resume=True)
    assert resumed.attrs["parts_reused"] == 1 and resumed.attrs["parts_recomputed"] == 2
    assert_same_results(resumed, clean)


# -- attribution -------------------------------------------------------------------------------------------------

def _shapley_by_permutations(v, levers):
    """Reference: average marginal contribution over every order of switching the levers on."""
    phi = dict.fromkeys(levers, 0.0)
    orders = list(itertools.permutations(levers))
    for order in orders:
        on = frozenset()
        for lever in order:
            phi[lever] += v[on | {lever}] - v[on]
            on = on | {lever}
    return np.array([phi[x] / len(orders) for x in levers])


def test_shapley_against_permutation_reference():
    rng = np.random.default_rng(4)
    levers = ["a", "b", "c", "d"]
    v = {frozenset(s): float(rng.normal()) for r in range(5) for s in itertools.combinations(levers, r)}
    np.testing.assert_allclose(attribution.shapley(v, levers), _shapley_by_permutations(v, levers), rtol=1e-12)
    # additive game: each lever gets exactly its own effect
    effect = {"a": 1.0, "b": 2.0, "c": -0.5, "d": 0.0}
    v = {s: sum(effect[x] for x in s) for s in v}
    np.testing.assert_allclose(attribution.shapley(v, levers), [1.0, 2.0, -0.5, 0.0], atol=1e-12)


def test_compare_ablate(scn):
    ds = mcsim.compare(scn, samples=3, requests=1500, ablate=True)
    levers = list(ds.lever.values)
    # factory.toml keeps continuous batching in its baseline, so that lever is not part of the comparison
    assert "continuous_batching" not in levers and "kv_cache" in levers and "speculative" in levers
    assert {"baseline", "factory", "without:kv_cache", "only:speculative"} <= set(ds.variant.values)
    gain = np.log(ds.decode_tok_s_per_gpu.sel(variant="factory") / ds.decode_tok_s_per_gpu.sel(variant="baseline"))
    np.testing.assert_allclose(ds.shapley_decode_tok_s_per_gpu.sum("lever"), gain, rtol=1e-9)
    np.testing.assert_allclose(ds.shapley_share_cost_usd_per_mtok.sum("lever"), 1.0, rtol=1e-9)
    # Switching the KV cache off alone removes every cache hit; the cache lever alone has no speculative gain.
    assert np.all(ds.cache_hit_rate.sel(variant="without:kv_cache") == 0)
    assert np.all(ds.spec_tokens_per_pass.sel(variant="only:kv_cache") == 1)
    # The variants are the same runs the plain compare makes: baseline and factory agree bit for bit.
    plain = mcsim.compare(scn, samples=3, requests=1500)
    for name in ("decode_tok_s_per_gpu", "gross_margin", "ttft_s"):
        np.testing.assert_array_equal(ds[name].sel(variant=["baseline", "factory"]).values, plain[name].values)


@pytest.mark.slow
def test_a_killed_worker_loses_nothing(scn, tmp_path, cluster):
    import threading

    import psutil

    axes = ["speculative.draft_tokens=0,1,2"]
    reference = mcsim.sweep(scn, axes, samples=8, requests=10000, chunk_size=1, workers=1)
    workers = [c for c in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(c.cmdline())]
    assert len(workers) == 2
    parts = tmp_path / "k.nc.parts"

    def kill_one_worker_midway():
        deadline = time.time() + 60
        while time.time() < deadline and len(list(parts.glob("*.npz"))) < 2:
            time.sleep(0.01)
        workers[0].kill()

    killer = threading.Thread(target=kill_one_worker_midway)
    killer.start()
    got = mcsim.sweep(scn, axes, samples=8, requests=10000, chunk_size=1, scheduler=cluster.scheduler_address,
                      output=tmp_path / "k.nc")
    killer.join()
    assert not workers[0].is_running()
    assert_same_results(got, reference)


def test_a_grid_point_refused_at_run_time_is_one_line_and_leaves_nothing(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "sweep.nc"
    # 100,000 replicas' own caches cannot be held; one instance can: the second point is refused while running
    args = [sys.executable, "-m", "mcsim", "sweep", str(ROOT / "scenarios" / "factory.toml"),
            "--grid", "deployment.instances=1,100000", "--set", "deployment.fleet=fixed",
            "--set", "deployment.fleet_simulation=replicas", "--set", "deployment.routing=least-outstanding",
            "--set", "deployment.disaggregated=false", "--samples", "1", "--requests", "2000", "-o", str(out)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: at grid point deployment.instances=100000: "), lines
    assert "Compute Failed" not in result.stderr and "Traceback" not in result.stderr
    assert not out.exists() and not (tmp_path / "sweep.nc.parts").exists()
