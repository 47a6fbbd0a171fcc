"""End-to-end properties of a run: determinism, common random numbers, Little's law, lever switches."""

import math

import numpy as np
import pytest
import xarray as xr

import mcsim
import mcsim.execution.api
import mcsim.results.dataset
from mcsim.perf import factor as perf
from mcsim.scenario import load_scenario

# A small, fast version of the factory scenario (fewer EP ranks so that the expert stage is quick).
SMALL = [
    "deployment.gpus_per_instance=32",
    "deployment.prefill_gpus_per_instance=32",
    "moe.nodes=4",
    "workload.rate_rps=150",
]


@pytest.fixture(scope="module")
def scn(factory_path):
    return load_scenario(factory_path, overrides=SMALL)


@pytest.fixture(scope="module")
def compared(scn):
    return mcsim.compare(scn, samples=4, requests=3000, workers=1)


def test_same_seed_same_bits_whatever_workers_and_chunks(scn):
    a = mcsim.execution.api.run_variants(scn, samples=5, requests=1500, workers=1, chunk_size=5)
    b = mcsim.execution.api.run_variants(scn, samples=5, requests=1500, workers=2, chunk_size=1)
    c = mcsim.execution.api.run_variants(scn, samples=5, requests=1500, workers=2, chunk_size=2)
    for other in (b, c):
        for name in a.data_vars:
            np.testing.assert_array_equal(a[name].values, other[name].values, err_msg=name)


def test_a_sample_does_not_depend_on_the_number_of_samples(scn):
    small = mcsim.execution.api.run_variants(scn, samples=2, requests=1500, workers=1)
    large = mcsim.execution.api.run_variants(scn, samples=4, requests=1500, workers=1)
    np.testing.assert_array_equal(small.gross_margin.values, large.gross_margin.values[:2])


def test_other_seed_other_results(scn):
    a = mcsim.execution.api.run_variants(scn, samples=2, requests=1500, workers=1, seed=1)
    b = mcsim.execution.api.run_variants(scn, samples=2, requests=1500, workers=1, seed=2)
    assert not np.array_equal(a.cost_usd_per_mtok.values, b.cost_usd_per_mtok.values)


def test_variants_see_identical_requests(compared):
    base, fact = compared.sel(variant="baseline"), compared.sel(variant="factory")
    for name in ("mean_input_tokens", "mean_output_tokens", "trace_duration_s", "requests"):
        np.testing.assert_array_equal(base[name].values, fact[name].values, err_msg=name)


def test_levers_off_in_the_baseline(compared):
    base = compared.sel(variant="baseline")
    assert np.all(base.cache_hit_rate.values == 0)
    assert np.all(base.spec_tokens_per_pass.values == 1)
    assert np.all(base.prefill_gpus.values == 0)  # colocated
    fact = compared.sel(variant="factory")
    assert np.all(fact.cache_hit_rate.values > 0.2)
    assert np.all(fact.spec_tokens_per_pass.values > 1.3)
    # Each lever helps on the same draws: the factory decodes faster on every sample.
    assert np.all(fact.decode_tok_s_per_gpu.values > base.decode_tok_s_per_gpu.values)


def test_littles_law_when_the_fleet_is_sized_to_demand(compared):
    # Little: concurrency = arrival rate x time in decode / GPUs. The fleet is whole instances sized at utilization
    # u, and the operating batch is the one at which those GPUs just serve the demand: the two must agree.
    fact = compared.sel(variant="factory")
    np.testing.assert_allclose(fact.mean_concurrency_per_gpu.values, fact.operating_batch_per_gpu.values,
                               rtol=0.02)
    # Whole instances: the smallest number whose capacity at utilization u serves the load.
    assert np.all(fact.decode_instances.values == np.round(fact.decode_instances.values))
    assert np.all(fact.decode_gpus.values == 32 * fact.decode_instances.values)


def test_small_traffic_shrinks_the_batch(scn):
    # Traffic too small to fill the smallest fleet: the batch follows from Little's law, below the cap.
    busy = mcsim.execution.api.run_variants(scn, samples=2, requests=1500, workers=1)
    idle = mcsim.execution.api.run_variants(scn.with_values({"workload.rate_rps": 1.0}), samples=2, requests=1500,
                                            workers=1)
    assert np.all(idle.operating_batch_per_gpu.values < busy.operating_batch_per_gpu.values)
    assert np.all(idle.gpus.values == 32 + 32)
    # At the floor every deployed decode GPU is busy with the concurrency Little's law gives.
    np.testing.assert_allclose(idle.mean_concurrency_per_gpu.values, idle.operating_batch_per_gpu.values, rtol=0.05)


def test_dataset_contract(compared, tmp_path):
    contract = ["decode_tok_s_per_gpu", "prefill_tok_s_per_gpu", "cache_hit_rate", "cache_hit_rate_by_tier",
                "spec_tokens_per_pass", "expert_efficiency", "batch_efficiency", "ttft_s", "tpot_s", "gpus",
                "gpu_hours", "energy_j_per_token", "cost_usd_per_mtok", "revenue_usd_per_day", "cost_usd_per_day",
                "gross_margin", "payback_months", "feasible"]
    path = mcsim.results.dataset.write_netcdf(compared, tmp_path / "r.nc")
    ds = xr.open_dataset(path)
    for name in contract:
        assert name in ds, name
        assert ds[name].attrs["units"] and ds[name].attrs["long_name"]
        assert ds[name].attrs["source"] == "modelled"
    assert list(ds.variant.values) == ["baseline", "factory"]
    assert list(ds.tier.values) == ["hbm", "dram", "nvme"]
    assert ds.cache_hit_rate_by_tier.dims == ("variant", "sample", "tier")
    # tiers add up to the total
    np.testing.assert_allclose(ds.cache_hit_rate_by_tier.sum("tier"), ds.cache_hit_rate)
    inputs = {ds[v].attrs["path"]: v for v in ds.data_vars if ds[v].attrs.get("role") == "input"}
    assert inputs["efficiency.base_decode_tok_s_per_gpu"] == "efficiency_base_decode_tok_s_per_gpu"
    assert inputs["workload.classes.chat.output_tokens.median"] == "workload_classes_chat_output_tokens_median"
    assert "scenario_text" in ds.attrs and "seed" in ds.attrs and "modelled" in ds.attrs["modelled_vs_measured"]
    ds.close()
    with pytest.raises(FileExistsError):
        mcsim.results.dataset.write_netcdf(compared, path)


def test_infeasible_recipe_is_reported_not_raised(scn):
    # A 70B dense model's BF16 weights cannot fit one 80 GB GPU: the result says so.
    dense = load_scenario(scn.source, overrides=SMALL + [
        'model.preset="llama-3.1-70b"', "deployment.gpus_per_instance=1", "deployment.tp=1", 'hardware.preset="h100"',
        "precision.enabled=false", "moe.redundant_experts=0"])
    ds = mcsim.execution.api.run_variants(dense, samples=2, requests=500, workers=1)
    assert np.all(ds.feasible.values == 0)
    reasons = ds.infeasible_reason.attrs["flag_meanings"].split()
    assert reasons[int(ds.infeasible_reason.values[0])] == "weights_do_not_fit_in_HBM"


def test_static_slot_utilization_against_reference():
    rng = np.random.default_rng(0)
    out = rng.integers(1, 500, 103)
    for batch in (1, 4, 10, 103, 200):
        used = 0
        for start in range(0, len(out), batch):
            group = out[start:start + batch]
            used += len(group) * group.max()
        assert perf.static_slot_utilization(out, batch) == pytest.approx(out.sum() / used)


def test_expert_factor_closed_form():
    # Amdahl: only the MoE share of the step waits for the slowest rank.
    assert perf.expert_factor(0.5, 1.0) == pytest.approx(0.5)
    assert perf.expert_factor(0.5, 0.0) == pytest.approx(1.0)
    assert perf.expert_factor(0.8, 0.5) == pytest.approx(1 / (0.5 + 0.5 / 0.8))


def test_kv_bytes_reach_the_result(compared):
    # DeepSeek-V3 MLA latent cache in BF16: (512 + 64) x 61 x 2 = 70,272 bytes per token.
    assert math.isclose(float(compared.kv_bytes_per_token.sel(variant="factory")[0]), 70_272)


def test_variants_run_together_equal_variants_run_alone(scn):
    # Stage results are shared between variants of a sample; that must not change any number.
    from mcsim.execution.sample import run_sample
    from mcsim.scenario import draw_uncertain

    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 5).items()}
    specs = {"factory": {}, "baseline": scn.baseline, "no_cache": {"cache.enabled": False}}
    together = run_sample(scn, specs, 0, 5, 1500, draws)
    for name, overrides in specs.items():
        alone = run_sample(scn, {name: overrides}, 0, 5, 1500, draws)[name]
        for metric, value in alone.items():
            np.testing.assert_array_equal(value, together[name][metric], err_msg=f"{name}.{metric}")
    assert together["no_cache"]["cache_hit_rate"] == 0
    assert together["no_cache"]["spec_tokens_per_pass"] == together["factory"]["spec_tokens_per_pass"]


def test_variants_that_differ_in_prices_only_share_stage_5(scn, monkeypatch):
    # Stage 5 is memoised by its inputs and those of the stages before it: a price is none of them, so three
    # variants run it once; the output price (read only by economics) still reaches each variant's margin.
    from mcsim.execution import sample as sample_module
    from mcsim.scenario import draw_uncertain

    calls = []
    performance = sample_module.fleet.performance

    def counted(*args, **kwargs):
        calls.append(args[0])
        return performance(*args, **kwargs)

    monkeypatch.setattr(sample_module.fleet, "performance", counted)
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 5).items()}
    specs = {"factory": {}, "cheap": {"economics.price_output_usd_per_mtok": 1.0},
             "dear": {"economics.price_output_usd_per_mtok": 20.0}}
    together = sample_module.run_sample(scn, specs, 0, 5, 1500, draws)
    assert len(calls) == 1
    for name, overrides in specs.items():
        alone = sample_module.run_sample(scn, {name: overrides}, 0, 5, 1500, draws)[name]
        for metric, value in alone.items():
            np.testing.assert_array_equal(value, together[name][metric], err_msg=f"{name}.{metric}")
    assert together["cheap"]["gross_margin"] < together["dear"]["gross_margin"]
    assert together["cheap"]["decode_tok_s_per_gpu"] == together["dear"]["decode_tok_s_per_gpu"]
