"""One performance model: mixed steps, fleet modes, infeasible samples, variants and grids that cannot leak."""

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import mcsim
from mcsim.cli import main
from mcsim.perf import roofline
from mcsim.perf.factor import FactorStepModel, _model, step_inputs
from mcsim.perf.fleet import PERFORMANCE_OUTPUTS
from mcsim.perf.roofline_model import RooflineStepModel, _hardware, base_scales, options
from mcsim.results import summary
from mcsim.scenario import ScenarioError, draw_uncertain, load_scenario, resolve
from mcsim.stages.workload import generate

ROOT = Path(__file__).resolve().parents[1]
DENSE = ROOT / "scenarios" / "dense-node.toml"
DEEPSEEK = ROOT / "scenarios" / "deepseek-disaggregated.toml"
FACTORY = ROOT / "scenarios" / "factory.toml"
MONEY = ("cost_usd_per_day", "revenue_usd_per_day", "gross_margin", "cost_profit_margin", "cost_usd_per_mtok",
         "energy_j_per_token", "payback_months")


def _sample(path, overrides=()):
    scn = load_scenario(path, overrides=overrides)
    p = resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 1).items()})
    return scn, p, generate(p, scn.classes, 400, np.random.default_rng(0), 131072)


def test_a_mixed_step_is_the_roofline_of_all_its_tokens():
    scn, p, req = _sample(DENSE)
    passes = np.maximum(req.output_tokens // 2, 1)
    model = RooflineStepModel(p, req, passes, {"expert_efficiency": 1.0})
    k = p["speculative.draft_tokens"]
    d, q, ctx, pctx = 64, 496, 1800.0, 300.0
    step = model.step_time(d, np.full(d, ctx), q, pctx)
    # The reference: one roofline step over the decode sequences and the prefill tokens together (the weights are
    # read once), plus k plain one-token steps' worth of drafting at draft_cost each.
    kwargs = options(p)
    whole = roofline.step_cost(_model(p), _hardware(p), decode_seqs=d, decode_context=ctx, prefill_tokens=q,
                               prefill_context=pctx, verify_tokens=k + 1, **kwargs).t_step
    plain = roofline.step_cost(_model(p), _hardware(p), decode_seqs=d, decode_context=ctx, verify_tokens=1,
                               **kwargs).t_step
    assert step.total_s == pytest.approx(whole + k * p["speculative.draft_cost"] * plain, rel=1e-12)
    assert sum(step.parts.values()) == pytest.approx(step.total_s, rel=1e-12)
    # ... which is cheaper than a decode step plus a prefill step apart: no second weight read.
    apart = model.step_time(d, np.full(d, ctx)).total_s + model.step_time(0, None, q, pctx).total_s
    assert step.total_s < apart
    # Attention follows the batch's own KV lengths: the same mean gives the same step, a longer mean a longer one.
    lengths = np.linspace(ctx - 500, ctx + 500, d)
    assert model.step_time(d, lengths, q, pctx).total_s == pytest.approx(step.total_s, rel=1e-12)
    assert model.step_time(d, lengths + 4000, q, pctx).total_s > step.total_s


@pytest.mark.parametrize("path", [DENSE, DEEPSEEK, FACTORY])
def test_the_step_model_reads_its_declared_inputs_only(path):
    # Built from the declared inputs (any other key is a KeyError), both fidelities price the same steps as from
    # every parameter of the sample, a price and a workload key among them.
    scn, p, req = _sample(path)
    declared = step_inputs(p)
    assert "economics.price_output_usd_per_mtok" in p and "economics.price_output_usd_per_mtok" not in declared
    with pytest.raises(KeyError, match="step_reads"):
        declared["workload.rate_rps"]
    passes = np.maximum(req.output_tokens // 2, 1)
    if p["performance.fidelity"] == "roofline":
        full, restricted = (RooflineStepModel(params, req, passes, {"expert_efficiency": 0.8})
                            for params in (p, declared))
    else:
        full, restricted = (FactorStepModel(params, req, passes, 0.8, base_scales(params)) for params in (p, declared))
    for d, q in ((1, 0), (64, 0), (16, 2048), (0, 8192)):
        for pool in ("decode", "prefill"):
            assert restricted.step_time(d, None, q, pool=pool).total_s == full.step_time(d, None, q, pool=pool).total_s


def test_a_factor_step_is_what_gives_its_throughput():
    scn, p, req = _sample(FACTORY)
    model = FactorStepModel(p, req, None, 1.0, base_scales(p))
    g, b_half, x = model.decode_gpus, p["efficiency.batch_half_saturation"], model.x_nospec
    # t(d, q) = (d / g + b_half) / X + q / (g x X_prefill): X(b) = X b / (b + b_half) at b = d / g.
    d, q = 8.0 * g, 3000.0
    expected = (d / g + b_half) / x + q / (g * model.x_prefill)
    assert model.step_time(d, None, q).total_s == pytest.approx(expected, rel=1e-12)
    b = 8.0
    assert b / model.pass_s(b) == pytest.approx(x * b / (b + b_half), rel=1e-12)


@pytest.fixture(scope="module")
def fixed_sweep():
    return mcsim.sweep(DENSE, ["workload.rate_rps=2,10,20,30,60"], samples=2, requests=1500, workers=1,
                       overrides=["deployment.fleet=fixed", "deployment.instances=2"])


def test_a_fixed_fleet_breaks_its_slo_as_the_rate_grows(fixed_sweep):
    ds = fixed_sweep
    assert np.all(ds.gpus.values == 16) and np.all(ds.instances.values == 2)
    # the fleet's cost does not move with the load (rental price x fixed GPUs)
    cost = ds.cost_usd_per_day.values
    assert np.allclose(cost, cost[:1])
    attained = ds.slo_attainment.values  # (rate, sample)
    assert np.all(np.diff(attained, axis=0) <= 0.005)
    assert np.all(attained[0] > 0.99) and np.all(attained[-1] < 0.2)
    saturated = ds.saturated.values
    assert np.all(saturated[0] == 0) and np.all(saturated[-1] == 1)
    # once saturated, the queue grows without bound: the median wait is minutes, not milliseconds
    assert np.all(ds.queue_wait_s.sel(request_quantile=0.5).values[-1] > 30)


def test_the_charged_batch_is_the_simulated_batch():
    # utilization mode with the simulator: throughput and cost are charged at the simulator's mean decode batch,
    # which must agree with Little's law on the same fleet (arrival rate x decode time per request / GPUs).
    ds = mcsim.run(DENSE, samples=2, requests=3000, workers=1)
    np.testing.assert_allclose(ds.operating_batch_per_gpu.values, ds.mean_concurrency_per_gpu.values, rtol=0.2)
    # and the charged fleet is that whole fleet: rental x GPUs x 24 h (dense-node rents its H100s at the catalog's
    # $2.5 per GPU-hour times its uncertain price factor)
    np.testing.assert_allclose(ds.cost_usd_per_day.values,
                               2.5 * ds["economics_gpu_price_factor"].values * ds.gpus.values * 24, rtol=1e-12)
    assert np.all(ds.gpus.values % 8 == 0)  # whole 8-GPU instances


def test_the_slo_fleet_meets_its_targets_and_one_instance_fewer_does_not():
    common = ["workload.rate_rps=30", "deployment.ttft_target_s=1.0"]
    slo = mcsim.run(DENSE, samples=1, requests=2000, workers=1, overrides=common + ["deployment.fleet=slo"])
    n = int(slo.decode_instances.values[0])
    assert n >= 2 and slo.gpus.values[0] == 8 * n
    assert slo.ttft_at_slo_quantile_s.values[0] <= 1.0 and slo.tpot_at_slo_quantile_s.values[0] <= 0.05
    fewer = mcsim.run(DENSE, samples=1, requests=2000, workers=1,
                      overrides=common + ["deployment.fleet=fixed", f"deployment.instances={n - 1}"])
    missed = (fewer.ttft_at_slo_quantile_s.values[0] > 1.0 or fewer.tpot_at_slo_quantile_s.values[0] > 0.05
              or fewer.saturated.values[0] == 1)
    assert missed
    same = mcsim.run(DENSE, samples=1, requests=2000, workers=1,
                     overrides=common + ["deployment.fleet=fixed", f"deployment.instances={n}"])
    # the same fleet, charged the same; its latency agrees up to the prefix caches, which follow the configured
    # instances (one here, two in the fixed run), not the fleet the slo mode sized
    assert same.cost_usd_per_day.values[0] == slo.cost_usd_per_day.values[0]
    assert same.ttft_at_slo_quantile_s.values[0] == pytest.approx(slo.ttft_at_slo_quantile_s.values[0], rel=0.01)
    assert same.tpot_at_slo_quantile_s.values[0] <= 0.05


def test_an_infeasible_sample_is_nan_and_counted():
    # TP1 replicas of a 70B model on 80 GB GPUs: the weights do not fit, so nothing is priced.
    ds = mcsim.run(DENSE, samples=2, requests=800, workers=1, overrides=["deployment.tp=1"])
    assert ds.feasible.values.tolist() == [0, 0]
    for name in PERFORMANCE_OUTPUTS + MONEY:
        assert np.all(np.isnan(ds[name].values)), name
    reasons = ds.infeasible_reason.attrs["flag_meanings"].split()
    assert reasons[int(ds.infeasible_reason.values[0])] == "weights_do_not_fit_in_HBM"
    text = summary.format_table(ds)
    assert "infeasible samples (NaN, left out of every band): factory: 2 of 2" in text


def test_the_prefill_pool_must_hold_the_model():
    ds = mcsim.run(DEEPSEEK, samples=1, requests=800, workers=1,
                   overrides=["deployment.prefill_gpus_per_instance=1", "cache.enabled=false"])
    reasons = ds.infeasible_reason.attrs["flag_meanings"].split()
    assert reasons[int(ds.infeasible_reason.values[0])] == "prefill_pool_weights_do_not_fit_in_HBM"
    assert np.isnan(ds.cost_usd_per_mtok.values[0])


def test_a_baseline_workload_override_is_refused(tmp_path):
    text = FACTORY.read_text().replace("[baseline]\n", '[baseline]\n"workload.rate_rps" = 5\n')
    with pytest.raises(ScenarioError, match="workload.rate_rps: \\[baseline\\] cannot change the workload"):
        load_scenario(tmp_path / "f.toml", text=text)
    scn = load_scenario(FACTORY)
    with pytest.raises(ScenarioError, match="cache.block_tokens"):
        mcsim.execution.api.run_variants(scn, variants={"a": {}, "b": {"cache.block_tokens": 16}}, samples=1, requests=300)


def test_a_grid_value_refused_by_set_is_refused_by_grid(tmp_path):
    out = tmp_path / "g.nc"
    with pytest.raises(ScenarioError, match="deployment.tp"):
        load_scenario(DENSE, overrides=["deployment.tp=3"])
    result = CliRunner().invoke(main, ["sweep", str(DENSE), "--grid", "deployment.tp=3,8", "--samples", "1",
                                       "--requests", "300", "-o", str(out), "--no-progress"])
    assert result.exit_code == 2
    assert "deployment.tp" in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_labels_say_what_ran():
    ds = mcsim.run(DENSE, samples=1, requests=500, workers=1)
    assert ds.attrs["fidelity"] == "roofline" and ds.attrs["fleet"] == "utilization"
    ds = mcsim.run(FACTORY, samples=1, requests=500, workers=1, overrides=["deployment.fleet=fixed"])
    assert ds.attrs["fidelity"] == "factor" and ds.attrs["fleet"] == "fixed"


def test_inputs_the_fidelity_does_not_read_are_not_drawn():
    roof = load_scenario(DENSE, overrides=['efficiency.batch_half_saturation={dist="uniform", low=8, high=24}'])
    assert "performance.gemm_error" in roof.uncertain()
    assert "efficiency.batch_half_saturation" not in roof.uncertain()
    factor = load_scenario(DENSE, overrides=['performance.fidelity="factor"',
                                             'efficiency.batch_half_saturation={dist="uniform", low=8, high=24}'])
    assert "performance.gemm_error" not in factor.uncertain()
    assert "efficiency.batch_half_saturation" in factor.uncertain()
    ds = mcsim.run(roof, samples=1, requests=400, workers=1)
    assert "efficiency_batch_half_saturation" not in ds and "performance_gemm_error" in ds


def test_closed_loop_think_times_come_from_the_sample_stream():
    from mcsim.perf.latency import prepare

    scn, p, req = _sample(DENSE, ["performance.closed_loop_users=8"])
    args = (p, req, req.prompt_tokens, np.zeros(req.n), np.zeros(req.n), req.output_tokens, 64)
    a = prepare(*args, np.random.default_rng(1)).think
    b = prepare(*args, np.random.default_rng(1)).think
    c = prepare(*args, np.random.default_rng(2)).think
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    runs = [mcsim.run(DENSE, samples=2, requests=600, workers=1, seed=s,
                      overrides=["performance.closed_loop_users=8"]) for s in (1, 1, 2)]
    assert np.array_equal(runs[0].e2e_s.values, runs[1].e2e_s.values)
    assert not np.array_equal(runs[0].e2e_s.values, runs[2].e2e_s.values)


@settings(max_examples=6, deadline=None)
@given(low=st.floats(2.0, 30.0), step=st.floats(2.0, 20.0))
def test_slo_attainment_of_a_fixed_fleet_does_not_rise_with_the_rate(low, step):
    # The same requests and draws at two rates (common random numbers): more load never serves more requests
    # within their SLOs, and a fleet that saturates at the lower rate also saturates at the higher one.
    ds = mcsim.sweep(DENSE, [f"workload.rate_rps={low},{low + step}"], samples=1, requests=1000, workers=1,
                     overrides=["deployment.fleet=fixed", "deployment.instances=2"])
    attained = ds.slo_attainment.values[:, 0]
    assert attained[1] <= attained[0] + 0.01
    assert ds.saturated.values[1, 0] >= ds.saturated.values[0, 0]


def test_a_fast_closed_loop_is_measured_over_its_own_arrivals():
    """64 users who think 2 s finish 4000 requests long before a third of the generator's trace span has passed:
    the warm-up is a third of the arrivals that happen, so the latencies are measured (they read NaN when the
    warm-up followed the trace's clock)."""
    ds = mcsim.run(DENSE, samples=1, requests=4000, workers=1,
                   overrides=["deployment.fleet=fixed", "deployment.instances=4", "deployment.routing=prefix-affinity",
                              "performance.closed_loop_users=64", "workload.think_time_s=2.0"])
    assert np.isfinite(ds.ttft_s.values).all() and np.isfinite(ds.busy_fraction.values).all()
    assert np.all((ds.busy_fraction.values > 0) & (ds.busy_fraction.values <= 1))


@pytest.mark.parametrize("mode", ["slo", "utilization"])
def test_max_instances_holds_per_pool(mode):
    # deepseek-disaggregated needs 15-23 instances at this load; a cap of 3 per pool cannot serve it in either mode
    path = ROOT / "scenarios" / "deepseek-disaggregated.toml"
    ds = mcsim.sweep(path, ["deployment.max_instances=3,64"], samples=2, requests=300,
                     overrides=[f"deployment.fleet={mode}"])
    capped, wide = ds.sel({"deployment_max_instances": 3}), ds.sel({"deployment_max_instances": 64})
    meanings = ds.infeasible_reason.attrs["flag_meanings"].split()
    expected = "SLO_not_met" if mode == "slo" else "fleet_over_max_instances"
    assert [meanings[int(r)] for r in capped.infeasible_reason.values.ravel()] == [expected] * 2
    assert np.all(np.isnan(capped.instances.values))
    assert np.all(wide.feasible.values == 1)
    for pool in ("decode_instances", "prefill_instances"):
        assert np.all(wide[pool].values <= 64) and np.all(wide[pool].values == np.round(wide[pool].values))


def test_a_fixed_fleet_deploys_what_it_is_given():
    ds = mcsim.run(ROOT / "scenarios" / "dense-node.toml", samples=1, requests=300, workers=1,
                   overrides=["deployment.fleet=fixed", "deployment.instances=3", "deployment.max_instances=1",
                              "performance.simulate_batching=false"])
    assert ds.instances.values.tolist() == [3.0]


def test_a_file_written_for_another_gpu_gets_that_gpus_base_throughputs(tmp_path):
    """dense-model.toml states its base throughputs for H100 (efficiency.base_hardware). The same file written for
    H200 or A100 carries them over by the roofline's plain throughputs of Llama-3.1-70B on the two GPUs, exactly as
    --set does; on H100 itself nothing moves. The factors obey the physics: H200 has H100's SMs and 1.43x its HBM
    bandwidth, so its decode (at the largest batch, partly compute-bound) gains between 1x and 1.43x and its
    prefill (compute-bound) about nothing; A100 has 0.61x the bandwidth and 0.32x the BF16 peak."""
    path = ROOT / "scenarios" / "dense-model.toml"
    _, p, req = _sample(path)
    assert p["efficiency.base_hardware"] == "h100" and base_scales(p) == (1.0, 1.0)
    models = {}
    for gpu in ("h200", "a100"):
        edited = tmp_path / f"dense-model-{gpu}.toml"
        edited.write_text(path.read_text().replace('preset = "h100"', f'preset = "{gpu}"', 1))
        _, p_file, _ = _sample(edited)
        _, p_set, _ = _sample(path, [f'hardware.preset="{gpu}"'])
        assert base_scales(p_file) == base_scales(p_set)
        models[gpu] = base_scales(p_file)
    h200_decode, h200_prefill = models["h200"]
    assert 1.0 < h200_decode < 4.8 / 3.35 and abs(h200_prefill - 1.0) < 0.1
    a100_decode, a100_prefill = models["a100"]
    assert a100_decode < 2.039 / 3.35 and a100_prefill < 0.4
    # the step model's base throughput moves by exactly that factor
    step = {gpu: FactorStepModel(q, req, None, 1.0, base_scales(q)).x_nospec
            for gpu, q in (("h100", p), ("h200", _sample(path, ['hardware.preset="h200"'])[1]))}
    assert step["h200"] / step["h100"] == pytest.approx(h200_decode, rel=1e-12)
