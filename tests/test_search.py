"""mcsim search: the racing rule's statistics against closed forms, the regret and fronts against slow loops, and the
search's robust optimum against the one an exhaustive sweep of the same space gives (plain NumPy on the sweep)."""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

import mcsim
from mcsim.cli import main
from mcsim.optimize import criteria
from mcsim.results.search_report import pareto_front

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "dense-node.toml"
LOAD = 'workload.rate_rps={dist="uniform",low=30,high=60}'  # enough load that the fleet size depends on the recipe
SPACE = ["deployment.tp=2,8", "deployment.max_batch_per_gpu=16,256", "hardware.preset=h100,h200"]
SMALL = dict(samples=8, requests=600, overrides=[LOAD])
CONSTRAINT = "slo_attainment>=0.95"
VOLATILE = {"created", "history", "command_line", "parts_reused", "parts_recomputed", "fingerprint"}


# -- the statistics of the rule ----------------------------------------------------------------------------------

def test_clopper_pearson_upper_bound_closed_forms():
    # no success in n: the bound solves (1 - p)^n = alpha
    for n in (1, 4, 9):
        assert criteria.clopper_pearson_upper(0, n, 0.1) == pytest.approx(1 - 0.1 ** (1 / n), rel=1e-9)
    # otherwise the p at which P(Binomial(n, p) <= k) = alpha
    for k, n in ((3, 4), (1, 8), (6, 10)):
        assert criteria.clopper_pearson_upper(k, n, 0.05) == pytest.approx(_cp_root(k, n, 0.05), rel=1e-9)
    assert criteria.clopper_pearson_upper(4, 4, 0.05) == 1.0


def _cp_root(k, n, alpha):
    """The p with P(Binomial(n, p) <= k) = alpha, by bisection over the exact binomial sum."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        p = (lo + hi) / 2
        cdf = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))
        lo, hi = (p, hi) if cdf > alpha else (lo, p)
    return (lo + hi) / 2


def test_sign_test_against_the_binomial_sum():
    for n in range(1, 13):
        for wins in range(n + 1):
            exact = sum(math.comb(n, i) for i in range(wins, n + 1)) / 2 ** n
            assert criteria.sign_test_p(wins, n) == pytest.approx(exact, rel=1e-12)


def test_round_schedule():
    assert criteria.round_schedule(16, 4) == [4, 8, 16]
    assert criteria.round_schedule(20, 4) == [4, 8, 16, 20]
    assert criteria.round_schedule(3, 4) == [3]


def test_constraint_and_metric_parsing():
    c = criteria.parse_constraint("ttft_s@0.99 <= 2")
    assert (c.metric.name, c.metric.request_quantile, c.op, c.threshold) == ("ttft_s", 0.99, "<=", 2.0)
    assert list(c.holds(np.array([1.0, 2.0, 3.0, np.nan]))) == [True, True, False, False]
    with pytest.raises(criteria.SearchError, match="--constraint 'slo>=0.9'.*did you mean slo_attainment"):
        criteria.parse_constraint("slo>=0.9")
    with pytest.raises(criteria.SearchError, match="expected NAME>=VALUE"):
        criteria.parse_constraint("slo_attainment=0.9")
    with pytest.raises(criteria.SearchError, match="ttft_s@Q"):
        criteria.parse_metric("ttft_s", "--objective")


def _regret_reference(loss, met):
    """Slow loops: per sample the best met loss; per candidate its share of bests and regret quantiles."""
    k, n = loss.shape
    share, p50, p90 = [], [], []
    for c in range(k):
        best_count, gaps = 0, []
        for s in range(n):
            best = min((loss[b, s] for b in range(k) if met[b, s]), default=None)
            if best is None:
                continue
            if met[c, s] and loss[c, s] == best:
                best_count += 1
            elif met[c, s]:
                gaps.append(loss[c, s] - best)
        share.append(best_count / n)
        p50.append(np.quantile(gaps, 0.5) if gaps else np.nan)
        p90.append(np.quantile(gaps, 0.9) if gaps else np.nan)
    return np.array(share), np.array(p50), np.array(p90)


def test_regret_against_loops():
    rng = np.random.default_rng(3)
    objective = rng.integers(1, 6, size=(5, 9)).astype(float)  # ties on purpose
    met = rng.random((5, 9)) < 0.7
    for maximize in (False, True):
        q = criteria.Question(criteria.Metric("cost_usd_per_mtok"), maximize)
        got = criteria.regret(q, objective, met, np.full(5, 9))
        share, p50, p90 = _regret_reference(-objective if maximize else objective, met)
        np.testing.assert_allclose(got["best_share"], share)
        np.testing.assert_allclose(got["regret_p50"], p50)
        np.testing.assert_allclose(got["regret_p90"], p90)


def test_pareto_front_against_pairs():
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 6, 40).astype(float), rng.integers(0, 6, 40).astype(float)
    front = pareto_front(x, y, True, False)
    for i in range(40):
        beaten = any(x[j] >= x[i] and y[j] <= y[i] and (x[j] > x[i] or y[j] < y[i]) for j in range(40))
        assert front[i] == (not beaten)


# -- ties on the objective ---------------------------------------------------------------------------------------

COST = criteria.Question(criteria.Metric("cost_usd_per_mtok"))


def _tied_costs():
    """Five candidates over three samples. #0, #1 and #2 have median cost 3 (from different samples), #3 is cheaper
    but fails the constraints, #4 costs more. #0 needs 16 GPUs, #1 and #2 need 8; of those, #2 has the higher median
    decode throughput per GPU (70 against 50)."""
    cost = np.array([[2.0, 3, 5], [3, 3, 4], [1, 3, 9], [1, 1, 1], [4, 4, 4]])
    met = np.ones((5, 3), dtype=bool)
    met[3] = False
    gpus = np.array([[16.0] * 3, [8] * 3, [8] * 3, [8] * 3, [8] * 3])
    throughput = np.array([[100.0] * 3, [50] * 3, [60, 70, 80], [90] * 3, [90] * 3])
    return cost, met, gpus, throughput


def _pick(cost, met, gpus, throughput, question=COST, runs=None):
    runs = np.full(cost.shape[0], cost.shape[1]) if runs is None else runs
    pick = criteria.pick_optimum(question, cost, met, runs, gpus=gpus, throughput=throughput)
    return pick.optimum, np.flatnonzero(pick.tied).tolist(), pick.decided_by


def test_ties_go_to_fewer_gpus_then_higher_throughput_then_space_order():
    cost, met, gpus, throughput = _tied_costs()
    assert _pick(cost, met, gpus, throughput) == (2, [0, 1, 2], "decode_tok_s_per_gpu")
    # the same question maximized over the negated objective ties the same candidates
    maximized = criteria.Question(criteria.Metric("cost_usd_per_mtok"), maximize=True)
    assert _pick(-cost, met, gpus, throughput, maximized) == (2, [0, 1, 2], "decode_tok_s_per_gpu")
    # #0 with the fewest GPUs wins on GPUs whatever its throughput
    fewer = gpus.copy()
    fewer[0] = 4
    assert _pick(cost, met, fewer, throughput) == (0, [0, 1, 2], "gpus")
    # #1 and #2 equal on throughput as well: the first in the space's order
    same = throughput.copy()
    same[2] = 50
    assert _pick(cost, met, gpus, same) == (1, [0, 1, 2], "candidate order")
    # a candidate without a GPU figure ranks last on GPUs
    unknown = gpus.copy()
    unknown[1] = np.nan
    assert _pick(cost, met, unknown, throughput) == (2, [0, 1, 2], "gpus")
    unknown[2] = np.nan
    assert _pick(cost, met, unknown, throughput) == (0, [0, 1, 2], "gpus")
    # no tie: the objective decides alone, and the racing rule's leader is the same pick
    cheaper = cost.copy()
    cheaper[1] = 2.5
    assert _pick(cheaper, met, gpus, throughput) == (1, [1], "objective")
    assert criteria.robust_optimum(COST, cost, met, np.full(5, 3), gpus=gpus, throughput=throughput) == 2
    # nobody qualifies: no optimum, nothing tied
    assert _pick(cost, np.zeros_like(met), gpus, throughput) == (None, [], "none")


@pytest.mark.parametrize("relative, tied", [(0.0, True), (4e-13, True), (-4e-13, True), (1e-11, False),
                                            (-1e-11, False)])
def test_a_tie_is_equality_within_a_relative_1e_12(relative, tied):
    assert criteria.TIE_RTOL == 1e-12
    cost = np.array([[3.0], [3.0 * (1 + relative)]])
    gpus = np.array([[16.0], [8.0]])  # the second wins a tie on GPUs
    best = 1 if relative < 0 or tied else 0
    expected = (1, [0, 1], "gpus") if tied else (best, [best], "objective")
    assert _pick(cost, np.ones((2, 1), dtype=bool), gpus, None) == expected


def test_a_tie_at_zero_is_exact_equality():
    cost = np.array([[0.0], [1e-300], [0.0]])
    gpus = np.array([[16.0], [8.0], [8.0]])
    assert _pick(cost, np.ones((3, 1), dtype=bool), gpus, None) == (2, [0, 2], "gpus")


def test_the_racing_leader_is_the_tie_breaks_pick():
    cost, met, gpus, throughput = _tied_costs()
    decision = criteria.decide(COST, cost, met, np.full(5, 3), 3, 0.1, gpus=gpus, throughput=throughput)
    assert decision.leader == 2 and np.flatnonzero(decision.tied).tolist() == [0, 1, 2]
    assert decision.decided_by == "decode_tok_s_per_gpu"
    # a candidate that ran fewer samples is not one the optimum is chosen from: it ties with nobody
    cost[0, 2], met[0, 2] = np.nan, False
    cost[0, :2] = 3.0  # median 3 over its two samples
    decision = criteria.decide(COST, cost, met, np.array([2, 3, 3, 3, 3]), 3, 0.1, gpus=gpus,
                               throughput=throughput)
    assert decision.leader == 2 and np.flatnonzero(decision.tied).tolist() == [1, 2]


TIE_SPACE = ["deployment.instances=1,2", "deployment.tp=4,8"]


def test_search_prints_and_records_exact_ties(tmp_path):
    """A fixed fleet at a light load (2 requests/s) meets every SLO whatever the recipe, so maximizing SLO
    attainment ties all four candidates exactly (1 in every sample). One 8-GPU instance beats two; of the two
    one-instance recipes the one with the higher median decode throughput per GPU wins."""
    from helpers import invoke

    out = tmp_path / "ties.nc"
    result = invoke("search", SCENARIO, *[x for s in TIE_SPACE for x in ("--space", s)], "--objective",
                    "slo_attainment", "--maximize", "--set", "deployment.fleet=fixed", "--set", "workload.rate_rps=2",
                    "--samples", "2",
                    "--requests", "200", "--first-round", "2", "--workers", "1", "--no-progress", "-o", out)
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        # the premise, from the samples: an exact tie, every sample feasible, 8 GPUs per instance
        assert (ds.slo_attainment.values == 1).all() and (ds.feasible.values == 1).all()
        instances = np.array([1, 1, 2, 2])  # C order: tp fastest
        np.testing.assert_array_equal(ds.deployment_instances.values, instances)
        np.testing.assert_array_equal(ds.gpus.values, 8.0 * instances[:, None] * np.ones((1, 2)))
        # the pick by plain NumPy over the samples: fewest median GPUs, then highest median throughput
        throughput = np.median(ds.decode_tok_s_per_gpu.values, axis=1)
        assert throughput[0] != throughput[1]
        expected = int(np.argmax(throughput[:2]))
        assert ds.attrs["robust_optimum_candidate"] == expected
        assert ds.tied_with_best.values.tolist() == [1, 1, 1, 1]
        assert ds.attrs["robust_optimum_tied"] == "0 1 2 3"
        assert ds.attrs["robust_optimum_decided_by"] == "decode_tok_s_per_gpu"
        assert "fewer GPUs (gpus)" in ds.attrs["search_tie_rule"] and ds.attrs["search_tie_rtol"] == 1e-12
        np.testing.assert_array_equal(ds.gpus_at_quantile.values, [8, 8, 16, 16])
        np.testing.assert_allclose(ds.decode_tok_s_per_gpu_at_quantile.values, throughput, rtol=1e-15)
    text = " ".join(result.output.split())
    assert "4 candidates tie on slo_attainment at quantile 0.5 (within a relative 1e-12): #0, #1, #2, #3" in text
    assert (f"#{expected} was picked because it has the highest decode throughput per GPU among those with the "
            "fewest GPUs") in text
    assert "tie-break rule: Best objective at the search quantile" in text and "then to the first candidate" in text
    # each tied candidate's row: its index, axes, objective, GPUs and throughput; the pick marked
    for c, (tp, gpus) in enumerate(((4, 8), (8, 8), (4, 16), (8, 16))):
        row = next(line for line in result.output.splitlines()
                   if line.startswith(f"{c}  ") and f"{throughput[c]:.6g}" in line)
        assert row.split()[:5] == [str(c), f"instances={instances[c]}", f"tp={tp}", "1", str(gpus)], row
        assert row.endswith("picked") == (c == expected), row


def test_a_parameter_of_a_switched_off_lever_ties_and_the_first_candidate_wins():
    """With speculative decoding off its draft length changes nothing: both candidates are equal in every sample and
    on every key, and the first in the space's order is the optimum (mcsim.search returns the tie as well)."""
    ds = mcsim.search(SCENARIO, ["speculative.draft_tokens=2,4"], samples=1, requests=150, first_round=1,
                      workers=1, overrides=["speculative.enabled=false"])
    for name in ("cost_usd_per_mtok", "gpus", "decode_tok_s_per_gpu", "slo_attainment"):
        np.testing.assert_array_equal(ds[name].values[0], ds[name].values[1], err_msg=name)
    assert ds.tied_with_best.values.tolist() == [1, 1]
    assert ds.attrs["robust_optimum_candidate"] == 0 and ds.attrs["robust_optimum"] == "speculative.draft_tokens=2"
    assert ds.attrs["robust_optimum_decided_by"] == "candidate order"


# -- the search against the exhaustive sweep ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def sweep():
    return mcsim.sweep(SCENARIO, SPACE, workers=2, **SMALL)


@pytest.fixture(scope="module")
def searched():
    return mcsim.search(SCENARIO, SPACE, constraints=[CONSTRAINT], confidence=0.9, first_round=2, workers=2, **SMALL)


def _sweep_optimum(sw: xr.Dataset, confidence=0.9, quantile=0.5) -> dict:
    """The robust optimum of an exhaustive sweep, plain NumPy: feasible and SLO met in >= confidence of the samples,
    then the lowest median cost over feasible samples; among costs within a relative 1e-12 of the lowest, the fewest
    median GPUs, then the highest median decode throughput per GPU, then the first grid point."""
    dims = ["deployment_tp", "deployment_max_batch_per_gpu", "hardware_preset"]

    def per_point(name):
        return sw[name].transpose(*dims, "sample").values.reshape(-1, sw.sizes["sample"])

    cost, gpus, throughput = per_point("cost_usd_per_mtok"), per_point("gpus"), per_point("decode_tok_s_per_gpu")
    feasible = per_point("feasible") == 1
    met = feasible & (per_point("slo_attainment") >= 0.95)
    ranked = []
    for i in range(cost.shape[0]):
        if met[i].mean() >= confidence:
            f = feasible[i]
            ranked.append((np.quantile(cost[i][f], quantile), np.quantile(gpus[i][f], quantile),
                           -np.quantile(throughput[i][f], quantile), i))
    lowest = min(r[0] for r in ranked)
    value, _, _, best = min((r for r in ranked if abs(r[0] - lowest) <= 1e-12 * abs(lowest)), key=lambda r: r[1:])
    combos = list(itertools.product(*(sw[d].values for d in dims)))
    return {"point": dict(zip(dims, combos[best])), "value": value}


def test_search_finds_the_sweeps_optimum_with_fewer_sample_runs(sweep, searched):
    reference = _sweep_optimum(sweep)
    best = int(searched.attrs["robust_optimum_candidate"])
    assert best >= 0
    for name, value in reference["point"].items():
        assert searched[name].values[best] == value, name
    assert searched.attrs["robust_optimum_objective"] == reference["value"]
    runs = searched.samples_run.values
    assert runs[best] == 8 and runs.min() < 8  # the race dropped some candidates
    # the runs counted from the samples themselves (a sample not run holds no trace), not from samples_run
    ran = int(np.isfinite(searched.trace_duration_s.values).sum())
    assert searched.attrs["search_sample_runs"] == runs.sum() == ran < 64


def test_every_sample_run_is_the_sweeps_sample(sweep, searched):
    """Common random numbers: a candidate's value in a sample is the sweep's, bit for bit."""
    for c in range(searched.sizes["candidate"]):
        point = {d: searched[d].values[c] for d in ("deployment_tp", "deployment_max_batch_per_gpu",
                                                   "hardware_preset")}
        n = int(searched.samples_run.values[c])
        for name in ("cost_usd_per_mtok", "slo_attainment", "decode_tok_s_per_gpu"):
            np.testing.assert_array_equal(searched[name].values[c, :n], sweep[name].sel(point).values[:n])
            assert np.isnan(searched[name].values[c, n:]).all()
        assert (searched.constraints_met.values[c, n:] == -1).all()


def test_settings_and_rule_are_recorded(searched):
    a = searched.attrs
    assert a["search_objective"] == "cost_usd_per_mtok" and a["search_direction"] == "minimize"
    assert a["search_constraints"] == CONSTRAINT and a["search_rounds"] == "2 4 8"
    assert "Clopper-Pearson" in a["search_rule"] and "Risk:" in a["search_rule"]
    assert searched.deployment_tp.attrs["path"] == "deployment.tp"
    assert all("." not in str(n) for n in [*searched.variables, *searched.dims])


def test_search_report_writes_fronts_and_regret(searched, tmp_path):
    from mcsim.results.dataset import write_netcdf

    path = write_netcdf(searched, tmp_path / "s.nc")
    result = CliRunner().invoke(main, ["report", str(path), "-o", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    files = {p.name for p in (tmp_path / "rep").iterdir()}
    assert {"pareto_throughput.png", "pareto_cost.png", "regret.csv", "summary.md"} <= files
    text = (tmp_path / "rep" / "summary.md").read_text()
    assert "## Robust optimum" in text and "## Regret" in text
    best = int(searched.attrs["robust_optimum_candidate"])
    rows = (tmp_path / "rep" / "regret.csv").read_text().splitlines()
    assert rows[1].split(",")[0] == str(best)  # best first


def test_bad_search_options_are_one_line_errors(tmp_path):
    runner = CliRunner()
    for args, expected in ((["--constraint", "slo_attainment=>0.9"], "--constraint"),
                           (["--objective", "cost"], "--objective"),
                           (["--space", "deployment.tp"], "--space")):
        words = ["search", str(SCENARIO), "--space", "deployment.tp=2,8", *args, "-o", str(tmp_path / "x.nc")]
        result = runner.invoke(main, words)
        assert result.exit_code == 2, result.output
        assert expected in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1


# -- nothing lost ------------------------------------------------------------------------------------------------

def _cli(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "mcsim", *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_interrupted_search_resumes_to_the_uninterrupted_result(searched, tmp_path):
    args = ["search", SCENARIO, *[x for s in SPACE for x in ("--space", s)], "--constraint", CONSTRAINT,
            "--first-round", "2", "--samples", "8", "--requests", "600", "--set", LOAD, "--workers", "1",
            "--no-progress"]
    out, parts = tmp_path / "s.nc", tmp_path / "s.nc.parts"
    proc = _cli(*args, "-o", out)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(parts.glob("*.npz"))) < 3 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert "--resume" in proc.stderr.read() and not out.exists()
    assert 3 <= len(list(parts.glob("*.npz"))) < 20
    # the same command, run in this process from here on: only the interruption needs a process of its own
    refused = CliRunner().invoke(main, [str(a) for a in (*args, "-o", out)])
    assert refused.exit_code == 2 and "--resume" in refused.stderr
    resumed = CliRunner().invoke(main, [str(a) for a in (*args, "-o", out, "--resume")])
    assert resumed.exit_code == 0, resumed.output
    assert not parts.exists()
    with xr.open_dataset(out) as got:
        assert got.attrs["parts_reused"] >= 3
        assert {k: v for k, v in got.attrs.items() if k not in VOLATILE} == \
            {k: v for k, v in searched.attrs.items() if k not in VOLATILE}
        for name in ("cost_usd_per_mtok", "slo_attainment", "samples_run", "survived_round", "regret_p90",
                     "objective_at_quantile", "constraints_met_probability"):
            np.testing.assert_array_equal(got[name].values, searched[name].values, err_msg=name)


@pytest.mark.parametrize("space, message", [
    (["deployment.tp=2,,4"], "an empty value"),
    (["deployment.tp=2,4", "deployment.tp=8"], "given twice"),
    (["meta.name=a,b"], "[meta] keys"),
    (["workload.rate_rps=1:100:3000"], "3,000 candidates"),
    (["deployment.tp=2,2"], "grid values repeat"),
    (["deployment.nonsense=1,2"], "nonsense"),
    (["deployment.tp=two,four"], "deployment.tp"),
])
def test_a_search_space_is_validated_like_a_grid(space, message):
    from helpers import invoke

    args = [a for text in space for a in ("--space", text)]
    result = invoke("search", ROOT / "scenarios" / "dense-node.toml", *args, "--samples", "2", "--requests", "200")
    assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
