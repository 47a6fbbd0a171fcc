"""Why samples are infeasible, as the summary prints it: each reason counted exactly, with a fix in the samples'
own figures (the smallest tp whose weights fit against the closed form of the weights, the instances the load
needs against the fleet an uncapped run deploys). Infeasible samples do not simulate, so these runs are quick."""

import json

import numpy as np

import mcsim
from mcsim.results import summary
from mcsim.results.variables import FEASIBLE_REASONS
from mcsim.scenario import catalog

from helpers import DENSE_NODE, invoke

#: Llama-3.1-70B in BF16 on one GPU of an 8-GPU instance: dense-node with its tensor parallelism and its
#: low-precision lever off.
TP1_BF16 = ["deployment.tp=1", "precision.enabled=false"]


def closed_form(hbm_gb: float, cache_gb: float = 60.0) -> tuple[float, float, int]:
    """Weights per GPU at tp 1 (GB), the HBM left for them (GB) and the smallest tp whose weights fit, by hand:
    the catalog's published parameter count x 2 bytes / tp, against HBM x 0.9 (deployment.memory_fraction's
    default) less 4 GB of activations (deployment.activation_gb_per_gpu's default) less the prefix cache's HBM
    (dense-node: 60 GB per instance of 8 GPUs; none when the cache is off)."""
    params = catalog.model_preset("llama-3.1-70b")["total_params_b"] * 1e9  # 70.6B, its model page's count
    usable = hbm_gb * 0.9 - 4.0 - cache_gb / 8
    tp = next(t for t in (1, 2, 4, 8) if params * 2 / t / 1e9 <= usable)  # the divisors of 8 GPUs
    return params * 2 / 1e9, usable, tp


def reason_names(ds) -> list[str]:
    return [FEASIBLE_REASONS[int(code)] for code in np.ravel(ds.infeasible_reason.values)]


def test_weights_that_do_not_fit_name_the_smallest_tp_that_does(tmp_path):
    out = tmp_path / "tp1.nc"
    sets = [arg for override in TP1_BF16 for arg in ("--set", override)]
    result = invoke("run", DENSE_NODE, "--samples", 3, "--requests", 300, "-o", out, "--no-progress", *sets)
    assert result.exit_code == 0, result.output
    ds = mcsim.open_results(out)
    assert reason_names(ds) == ["weights do not fit in HBM"] * 3
    weights, usable, tp = closed_form(80.0)  # H100: 80 GB
    assert tp == 4
    text = " ".join(result.output.split())
    assert (f"weights do not fit in HBM: 3 of 3 samples (weights {weights:.3g} GB per GPU > {usable:.3g} GB usable "
            "of its 80 GB HBM") in text
    assert f"try deployment.tp = {tp}, the smallest that fits" in text
    # FP8 weights (70.6 GB) still do not fit the 60.5 GB; FP4 (35.3 GB) does
    assert "or precision.weight_bytes = 0.5 with precision.enabled = true)." in text
    [entry] = json.loads(json.dumps(summary.summarize(ds)))["infeasible_reasons"]["factory"]
    assert (entry["reason"], entry["samples"], entry["of"]) == ("weights do not fit in HBM", 3, 3)
    assert f"deployment.tp = {tp}," in entry["fix"]
    # the report's summary.md says the same
    from mcsim.results.report import write_report

    report = " ".join(write_report(out, tmp_path / "report", metrics=["gross_margin"]).read_text().split())
    section = report.split("## Infeasible samples")[1].split("##")[0]
    assert "- weights do not fit in HBM: 3 of 3 samples \\(weights " in section
    assert f"try deployment.tp = {tp}, the smallest that fits" in section


def test_each_grid_point_gets_its_own_smallest_tp():
    ds = mcsim.sweep(DENSE_NODE, ["hardware.preset=h100,h200"], samples=2, requests=300, workers=1,
                     overrides=TP1_BF16)
    assert reason_names(ds) == ["weights do not fit in HBM"] * 4
    text = " ".join(summary.format_table(ds, width=120).split())
    assert "weights do not fit in HBM: 4 of 4 samples, at 2 of 2 grid points:" in text
    for preset, hbm_gb in (("h100", 80.0), ("h200", 141.0)):
        _, usable, tp = closed_form(hbm_gb)
        assert (f"hardware.preset={preset}: 2 of 2 (weights 141 GB per GPU > {usable:.3g} GB usable of its "
                f"{hbm_gb:.3g} GB HBM") in text
        point = text.split(f"hardware.preset={preset}: ")[1].split("hardware.preset=")[0]
        assert f"try deployment.tp = {tp}, the smallest that fits" in point
    assert closed_form(141.0)[2] == 2  # an H200 holds the BF16 weights at tp 2, an H100 needs 4


def test_a_comparison_names_the_variant_that_cannot_run(tmp_path):
    # At tp 2 the factory's FP8 weights fit; the baseline's BF16 ones (70.6 GB per GPU) do not, even without the
    # prefix cache the baseline turns off.
    out = tmp_path / "cmp.nc"
    result = invoke("compare", DENSE_NODE, "--samples", 2, "--requests", 300, "-o", out, "--no-progress",
                    "--set", "deployment.tp=2")
    assert result.exit_code == 0, result.output
    ds = mcsim.open_results(out)
    assert reason_names(ds.sel(variant="baseline")) == ["weights do not fit in HBM"] * 2
    assert ds.feasible.sel(variant="factory").values.tolist() == [1, 1]
    weights, usable, tp = closed_form(80.0, cache_gb=0.0)
    text = " ".join(result.output.split())
    assert "infeasible samples (NaN, left out of every band): baseline: 2 of 2, factory: 0 of 2." in text
    assert (f"baseline, weights do not fit in HBM: 2 of 2 samples (weights {weights / 2:.3g} GB per GPU > "
            f"{usable:.3g} GB usable") in text
    assert f"try deployment.tp = {tp}, the smallest that fits" in text and "factory, " not in text
    assert summary.summarize(ds)["infeasible_reasons"]["factory"] == []


def test_each_reason_is_counted_exactly_and_the_fleet_names_the_instances_it_needs():
    # Per sample: 70 GB of activations leave no room for weights; else a 1 ms TPOT target is missed at batch 1;
    # else the load needs more than one instance. None of them simulates.
    common = ["deployment.max_instances=1", "workload.rate_rps=40", "performance.simulate_batching=false"]
    ds = mcsim.run(DENSE_NODE, samples=8, requests=300, workers=1, overrides=common + [
        'deployment.activation_gb_per_gpu={dist="choice", values=[4, 70]}',
        'deployment.tpot_target_s={dist="choice", values=[0.001, 0.05]}'])
    crowded = ds.deployment_activation_gb_per_gpu.values == 70
    strict = ds.deployment_tpot_target_s.values == 0.001
    expected = {"weights do not fit in HBM": int(crowded.sum()),
                "TPOT target not met at batch 1": int((~crowded & strict).sum()),
                "fleet over max_instances": int((~crowded & ~strict).sum())}
    assert all(expected.values()), expected  # this seed draws each case
    entries = summary.summarize(ds)["infeasible_reasons"]["factory"]
    assert {e["reason"]: e["samples"] for e in entries} == expected
    assert [e["reason"] for e in entries] == [r for r in FEASIBLE_REASONS if r in expected]
    text = " ".join(summary.format_table(ds, width=120).split())
    for reason, count in expected.items():
        assert f"{reason}: {count} of 8 samples (" in text

    # The fleet those samples need is the one an uncapped run deploys for them (same draws, sample by sample).
    uncapped = mcsim.run(DENSE_NODE, samples=8, requests=300, workers=1,
                         overrides=common[1:] + ["deployment.tpot_target_s=0.05"])
    fleet_samples = ~crowded & ~strict
    needed = int(uncapped.instances.values[fleet_samples].max())
    assert needed > 1
    assert (f"the load needs {needed} instances in its largest pool at economics.target_utilization > "
            f"deployment.max_instances = 1; try deployment.max_instances >= {needed}") in text
    tpot = ds.tpot_at_batch_1_s.values[~crowded & strict]
    assert np.all(tpot > 0.001)
    bound = float(text.split("a looser deployment.tpot_target_s >= ")[1].split(",")[0])
    assert tpot.max() <= bound <= 1.01 * tpot.max()  # a target that those samples meet at batch 1


def test_a_fleet_that_cannot_keep_up_under_its_cap_is_named_with_its_latency():
    ds = mcsim.run(DENSE_NODE, samples=2, requests=300, workers=1,
                   overrides=["deployment.fleet=slo", "deployment.max_instances=1", "workload.rate_rps=40"])
    assert reason_names(ds) == ["SLO not met"] * 2
    assert np.all(np.isinf(ds.ttft_at_max_instances_s.values))  # one instance cannot keep up with 40 requests/s
    [entry] = summary.summarize(ds)["infeasible_reasons"]["factory"]
    saturated = "TTFT at deployment.slo_quantile inf s (the queue saturates) > deployment.ttft_target_s = 1 s"
    assert saturated in entry["fix"]
    assert f"deployment.max_instances >= {int(ds.instances_needed.max())}" in entry["fix"]
    assert "looser" not in entry["fix"]  # a looser target cannot help a queue that grows without bound
