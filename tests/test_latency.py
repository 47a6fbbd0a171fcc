"""Roofline fidelity and latency under load, end to end: Little's law, SLOs, trade-offs, infeasible recipes."""

from pathlib import Path

import numpy as np
import pytest

import mcsim
import mcsim.execution.api
from mcsim.perf import factor as perf
from mcsim.scenario import draw_uncertain, load_scenario, resolve

ROOT = Path(__file__).resolve().parents[1]
DENSE = ROOT / "scenarios" / "dense-node.toml"


@pytest.fixture(scope="module")
def dense():
    return mcsim.run(DENSE, samples=3, requests=3000, workers=1)


def test_littles_law_inside_the_batching_simulator(dense):
    # Time-averaged requests in the decode simulator = arrival rate x mean time in system.
    np.testing.assert_allclose(dense.little_law_ratio.values, 1.0, atol=0.05)
    assert np.all(dense.saturated.values == 0)


def test_latency_quantiles_are_ordered_and_consistent(dense):
    for name in ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s"):
        q = dense[name].values
        assert np.all(np.diff(q, axis=-1) >= 0), name
    assert np.all(dense.e2e_s.sel(request_quantile=0.5) > dense.ttft_s.sel(request_quantile=0.5))
    assert np.all((dense.slo_attainment >= 0) & (dense.slo_attainment <= 1))


def test_overload_is_flagged_as_saturated():
    # One fixed node offered far more than it can serve: the queue grows without bound and the run says so.
    ds = mcsim.run(DENSE, samples=1, requests=3000, workers=1,
                   overrides=["deployment.fleet=fixed", "deployment.instances=1", "workload.rate_rps=60"])
    assert int(ds.saturated.values[0]) == 1
    assert float(ds.queue_wait_s.sel(request_quantile=0.5)[0]) > 10.0


def test_batch_cap_trades_latency_for_throughput():
    # More sequences per GPU: higher throughput per GPU and longer time per token (roofline, busy fleet).
    ds = mcsim.sweep(DENSE, ["deployment.max_batch_per_gpu=2,8,32"], samples=2, requests=2000,
                     overrides=["performance.simulate_batching=false", "workload.rate_rps=200"])
    tput = ds.decode_tok_s_per_gpu.median("sample").values
    tpot = ds.tpot_s.sel(request_quantile=0.5).median("sample").values
    assert np.all(np.diff(tput) > 0) and np.all(np.diff(tpot) > 0)


def test_infeasible_layout_stays_in_a_sweep():
    # TP1 x 8 data-parallel replicas of a 70B model: 70 GB of FP8 weights per 80 GB GPU leave no room for KV.
    ds = mcsim.sweep(DENSE, ["deployment.tp=1,8"], samples=1, requests=1000,
                     overrides=["performance.simulate_batching=false"])
    assert ds.feasible.sel({"deployment_tp": 1}).values.tolist() == [0]
    assert ds.feasible.sel({"deployment_tp": 8}).values.tolist() == [1]
    reasons = ds.infeasible_reason.attrs["flag_meanings"].split()
    assert reasons[int(ds.infeasible_reason.sel({"deployment_tp": 1}).values[0])] == "weights_do_not_fit_in_HBM"


def test_roofline_pass_against_the_roofline_directly():
    # The engine's pass time at a batch equals the roofline's instance step verifying k+1 tokens, plus k plain
    # one-token steps of drafting at draft_cost each.
    from mcsim.perf import roofline
    from mcsim.perf.roofline_model import RooflineStepModel, _hardware, options
    from mcsim.stages.workload import generate

    scn = load_scenario(DENSE)
    p = resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 1).items()})
    req = generate(p, scn.classes, 500, np.random.default_rng(0), 131072)
    passes = np.maximum(req.output_tokens // 2, 1)
    model = RooflineStepModel(p, req, passes, {"expert_efficiency": 1.0})
    context = float(req.prompt_tokens.mean() + req.output_tokens.mean() / 2)
    k = p["speculative.draft_tokens"]

    def step(verify):
        return roofline.step_cost(perf._model(p), _hardware(p), decode_seqs=16 * 8, decode_context=context,
                                  verify_tokens=verify, **options(p)).t_step

    expected = step(k + 1) + k * p["speculative.draft_cost"] * step(1)
    assert model.pass_s(16.0) == pytest.approx(expected, rel=1e-12)
    assert model.tokens_per_pass == pytest.approx(req.output_tokens.sum() / passes.sum())


def test_step_log_of_one_sample():
    log = mcsim.step_log(DENSE, max_steps=300, requests=1500)
    assert log.sizes["step"] == 300
    # steps follow each other: each starts when the previous one ends, or later when the engine was idle
    ends = log.start_s.values[:-1] + log.step_s.values[:-1]
    assert np.all(log.start_s.values[1:] >= ends - 1e-9)
    assert np.all(log.step_s.values > 0) and log.decode_seqs.max() > 1


@pytest.mark.parametrize("mode", ["representative", "replicas"])
def test_a_verifying_sequence_takes_k_plus_one_tokens_of_the_budget(mode):
    # dense-node verifies 3 drafts: each decoding sequence runs 4 tokens a pass, so a step of d decodes has
    # 96 - 4 d tokens left for prefill chunks (charging 1 a sequence, steps ran up to 126 tokens)
    extra = ["deployment.fleet_simulation=replicas", "deployment.routing=least-outstanding"] if mode == "replicas" \
        else []
    log = mcsim.step_log(DENSE, requests=400, max_steps=3000,
                         overrides=["deployment.disaggregated=false", "performance.token_budget=96",
                                    "performance.chunk_tokens=0", *extra])
    d, prefill = log.decode_seqs.values, log.prefill_tokens.values
    assert np.all(4 * d + prefill <= 96)
    assert np.sum((d > 0) & (prefill > 0) & (4 * d + prefill == 96)) > 100  # the budget binds, at k + 1 a sequence


def test_host_costs_follow_each_request():
    # detokenizing is per emitted token, inside TPOT (and the first token's inside TTFT); tokenizing is by each
    # request's own prompt, so its share of TTFT spreads as the prompts do (a mean prompt would shift every
    # quantile alike)
    base = ["performance.simulate_batching=false", "host.request_overhead_s=0", "host.tokenize_s_per_token=0",
            "host.detokenize_s_per_token=0"]

    def run(*changes):
        return mcsim.run(DENSE, samples=1, requests=2000, workers=1, overrides=[*base, *changes])

    plain, detok, tokenize = run(), run("host.detokenize_s_per_token=0.002"), run("host.tokenize_s_per_token=0.001")
    np.testing.assert_allclose((detok.tpot_s - plain.tpot_s).values, 0.002, rtol=1e-9)
    np.testing.assert_allclose((detok.ttft_s - plain.ttft_s).values, 0.002, rtol=1e-9)
    shift = (tokenize.ttft_s - plain.ttft_s).sel(sample=0).values  # at the 50, 90 and 99 % quantiles
    mean_shift = 0.001 * float(plain.mean_input_tokens.values[0])
    assert shift[0] < mean_shift < shift[-1] and shift[-1] > 2 * shift[0]


def test_capacity_is_what_a_gpu_sustains_and_load_what_it_does():
    ds = mcsim.sweep(DENSE, ["deployment.instances=1,3", "deployment.tpot_target_s=0.02,0.05"], samples=1,
                     requests=600, overrides=["performance.simulate_batching=false", "deployment.fleet=fixed"])
    capacity, load = ds.decode_capacity_tok_s_per_gpu, ds.decode_tok_s_per_gpu
    # the same requests over three times the GPUs: a third of the load each, the same capacity
    np.testing.assert_allclose(capacity.isel(deployment_instances=0), capacity.isel(deployment_instances=1),
                               rtol=1e-12)
    assert np.all(load.isel(deployment_instances=1) < load.isel(deployment_instances=0))
    assert np.all(load <= capacity * (1 + 1e-9))
    # a looser TPOT target admits larger batches: more tokens per GPU-second
    assert np.all(capacity.isel(deployment_tpot_target_s=1) > capacity.isel(deployment_tpot_target_s=0))
    assert ds.decode_capacity_tok_s_per_gpu.attrs["long_name"] == "decode capacity per GPU"
