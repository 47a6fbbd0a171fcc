"""``mcsim capacity``: the highest rate meeting the SLOs, against the M/D/1 closed form and a fixed-fleet sweep."""

import math

import numpy as np
import pytest
from scipy.optimize import brentq

import mcsim
from mcsim.optimize.capacity import CapacityError, Settings
from tests.helpers import MD1, invoke


@pytest.fixture(scope="module")
def md1(tmp_path_factory):
    path = tmp_path_factory.mktemp("capacity") / "md1.toml"
    path.write_text(MD1)
    # The service: at a rate so low that no request waits, every TTFT is the prefill step and every end-to-end
    # latency the whole service time D (one request at a time, each alike).
    quiet = mcsim.run(path, samples=1, requests=300, workers=1, overrides=["workload.rate_rps=0.001", "deployment.fleet=fixed"])
    ttft, e2e = quiet.ttft_s.values.ravel(), quiet.e2e_s.values.ravel()
    assert np.ptp(ttft) < 1e-9 and np.ptp(e2e) < 1e-9
    return path, float(ttft[0]), float(e2e[0])


def md1_wait_cdf(x: float, rho: float, service_s: float) -> float:
    """P(W <= x) of the M/D/1 queue (Erlang 1909): (1 - rho) sum_{k=0}^{floor(x/D)} (lam (kD - x))^k / k!
    exp(-lam (kD - x))."""
    lam = rho / service_s
    return (1 - rho) * sum((lam * (k * service_s - x)) ** k / math.factorial(k) * math.exp(-lam * (k * service_s - x))
                           for k in range(int(x // service_s) + 1))


def test_capacity_of_an_md1_queue_is_the_closed_form_rate(md1):
    """The TTFT target is the prefill step plus two service times at the 0.9 quantile: the capacity is the rate at
    which P(W <= 2D) = 0.9 for the M/D/1 waiting time W (rho* = 0.587)."""
    path, first_token_s, service_s = md1
    rho = brentq(lambda r: md1_wait_cdf(2 * service_s, r, service_s) - 0.9, 1e-6, 0.999)
    assert rho == pytest.approx(0.587, abs=1e-3)  # (1 - rho)(e^{2 rho} - rho e^rho) = 0.9
    ds = mcsim.capacity(path, samples=3, requests=40_000, rtol=0.01, workers=2,
                        overrides=[f"deployment.ttft_target_s={first_token_s + 2 * service_s!r}"])
    expected = rho / service_s
    assert (ds.capacity_outcome.values == 0).all()
    # the waiting-time quantile of 40 k requests: within 3 % (0.99-1.0 at 60 k requests, 1.02-1.04 at 10 k)
    np.testing.assert_allclose(ds.capacity_rps.values, expected, rtol=0.03)
    assert (ds.breaking_rps.values <= ds.capacity_rps.values * 1.01 + 1e-12).all()
    assert (ds.breaking_rps.values > ds.capacity_rps.values).all()


def test_a_fixed_fleet_sweep_confirms_each_sample(md1, tmp_path):
    """At every rate of a fixed-fleet sweep, a sample meets its SLOs (judged here from the sweep's own figures) at
    rates up to its capacity and breaks them from its breaking rate on; the result records every rate it tried;
    the answer does not depend on the workers."""
    path = md1[0]
    one = mcsim.capacity(path, samples=3, requests=3000, workers=1)
    two = mcsim.capacity(path, samples=3, requests=3000, workers=2, output=tmp_path / "c.nc")
    np.testing.assert_array_equal(one.capacity_rps.values, two.capacity_rps.values)
    again = mcsim.open_results(tmp_path / "c.nc")
    np.testing.assert_array_equal(again.capacity_rps.values, one.capacity_rps.values)
    cap, brk = one.capacity_rps.values, one.breaking_rps.values
    assert (brk <= cap * 1.02 + 1e-12).all()
    rates = sorted({*np.round(cap * 0.98, 6), *np.round(brk * 1.02, 6), float(np.median(cap))})
    sweep = mcsim.sweep(path, [f"workload.rate_rps={','.join(map(str, rates))}"], samples=3, requests=3000,
                        overrides=["deployment.fleet=fixed"], workers=2)
    for rate in rates:
        s = sweep.sel(workload_rate_rps=rate)
        met = ((s.feasible == 1) & (s.saturated == 0) & (s.ttft_at_slo_quantile_s <= 1.0)).values
        assert met[cap >= rate].all() and not met[brk <= rate].any(), rate
    tried, held = one.rate_tried_rps.values, one.slo_met_tried.values
    for i in range(3):
        ok = held[i] >= 0
        assert cap[i] == tried[i][ok][held[i][ok] == 1].max()
        assert brk[i] == tried[i][ok][(held[i][ok] == 0) & (tried[i][ok] > cap[i])].min()


def test_high_caps_the_rate_and_infeasible_deployments_have_no_capacity(md1):
    path = md1[0]
    capped = mcsim.capacity(path, samples=2, requests=1000, workers=1, low=0.1, high=0.2)
    np.testing.assert_array_equal(capped.capacity_rps.values, [0.2, 0.2])
    assert (capped.capacity_outcome.values == 1).all()  # SLOs met at the highest rate tried: a lower bound
    assert np.nanmax(capped.rate_tried_rps.values) == 0.2
    too_big = mcsim.capacity(path, samples=2, requests=500, workers=1, overrides=["model.preset=llama-3.1-70b"])
    assert np.isnan(too_big.capacity_rps.values).all()
    assert (too_big.capacity_outcome.values == 3).all()
    assert (too_big.infeasible_reason.values == 1).all()  # weights do not fit in HBM


def test_capacity_command_prints_the_band_and_refuses_in_one_line(md1, tmp_path):
    path = md1[0]
    out = tmp_path / "cap.nc"
    result = invoke("capacity", str(path), "--samples", "2", "--requests", "800", "-o", str(out), "--workers", "1")
    assert result.exit_code == 0, result.output
    assert "capacity_rps" in result.output and "bracketed: 2 of 2" in result.output
    assert "TTFT p90 <= 1.0 s" in " ".join(result.output.split()) and f"wrote {out}" in result.output
    # its report (once an internal error on the trial dim): the capacity figure and the capacity's own quantiles
    report = invoke("report", str(out), "-o", str(tmp_path / "rep"))
    assert report.exit_code == 0, report.output
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "## Capacity question" in summary and "![capacity](capacity.png)" in summary
    assert (tmp_path / "rep" / "capacity.png").stat().st_size > 10_000
    import csv
    import xarray as xr

    rows = [r for r in csv.DictReader(open(tmp_path / "rep" / "quantiles.csv")) if r["metric"] == "capacity_rps"]
    with xr.open_dataset(out) as ds:
        assert float(rows[0]["p50"]) == pytest.approx(float(np.median(ds.capacity_rps.values)), rel=1e-6)
    for args, words in [
        (["--set", "performance.closed_loop_users=8"], "closed loop"),
        (["--low", "5", "--high", "2"], "expected low < high"),
        (["--rtol", "2"], "--rtol"),
        (["--rtol", "1e-300"], "--rtol"),  # a bracket no float can narrow to: refused, never a loop without end
        (["--rtol", "1e-17"], "--rtol"),
    ]:
        bad = invoke("capacity", str(path), "--samples", "1", "--requests", "200", "-o", str(tmp_path / "x.nc"),
                     *args)
        assert bad.exit_code == 2, bad.output
        assert words in bad.output and "Traceback" not in bad.output
        assert len(bad.output.strip().splitlines()) == 1, bad.output
    assert not (tmp_path / "x.nc").exists()


def test_settings_refuse_nonsense():
    with pytest.raises(CapacityError, match="rtol"):
        Settings(rtol=0)
    with pytest.raises(CapacityError, match=r"\[0.0001, 1\]"):
        Settings(rtol=1e-17)
    with pytest.raises(CapacityError, match="--low"):
        Settings(low=float("nan"))


def test_a_sized_fleet_is_the_one_the_scenario_deploys_at_its_rate(md1):
    """A fleet sized by the SLOs is sized per sample at the scenario's own rate and then held: the capacity of the
    fleet that `mcsim run` deploys (once the default 4 instances, silently)."""
    path = md1[0]
    overrides = ["deployment.fleet=slo", "workload.rate_rps=2.5"]
    deployed = mcsim.run(path, samples=2, requests=600, workers=1, overrides=overrides)
    ds = mcsim.capacity(path, samples=2, requests=600, workers=1, overrides=overrides)
    np.testing.assert_array_equal(ds.decode_instances.values, deployed.decode_instances.values.ravel())
    assert "sized per sample at the scenario's own rate" in ds.attrs["capacity_deployment"]
    assert (ds.capacity_rps.values >= 2.5 * 0.98).all()  # the fleet sized to meet the SLOs at 2.5 meets them there
    # a run at capacity that has not settled is said (it once said nothing), with the requests it would need
    from mcsim.results.capacity_dataset import format_capacity

    unsettled = ds.copy()
    unsettled["steady_state"] = ("sample", np.array([0, 1], dtype=ds.steady_state.dtype))
    unsettled["requests_for_steady_state"] = ("sample", np.array([4200.0, 600.0]))
    text = " ".join(format_capacity(unsettled, width=200).split())
    assert "NOT AT STEADY STATE: 1 of 2 samples' runs at capacity" in text and "mc.requests=4200" in text
    assert "NOT AT STEADY STATE" not in format_capacity(ds.assign(steady_state=ds.steady_state * 0 + 1))
