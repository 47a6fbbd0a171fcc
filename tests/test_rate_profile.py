"""A diurnal arrival rate (workload.rate_profile) against closed forms and a pure-Python thinning of the same rate."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from click.testing import CliRunner
from scipy import stats

from mcsim.cli import main
from mcsim.scenario import ScenarioError, load_scenario, resolve
from mcsim.scenario.grid import parse_grid_option, validate_axes
from mcsim.stages import workload

#: Hourly relative rates of a day, from midnight: quiet from 2 to 5 am (no traffic), a peak in the afternoon.
DAY = [0.3, 0.2, 0.0, 0.0, 0.0, 0.2, 0.5, 1.0, 1.5, 2.0, 2.2, 2.4,
       2.5, 2.6, 2.7, 2.6, 2.4, 2.2, 2.0, 1.8, 1.5, 1.2, 0.8, 0.5]

SESSIONS = """
[workload]
rate_rps = 10.0
think_time_s = 5.0
system_prompts = 20
[workload.classes.chat]
share = 0.7
turns = 3.0
[workload.classes.code]
share = 0.3
"""


def profile_of(rates, period_s, start_s) -> workload.RateProfile:
    return workload.RateProfile.from_params({"workload.rate_profile": tuple(rates),
                                             "workload.rate_profile_period_s": period_s,
                                             "workload.rate_profile_start_s": start_s})


def arrivals(n, rate, rates, period_s, start_s, seed, process="poisson", burstiness=1.0):
    return workload.profiled_arrivals(n, rate, process, burstiness, np.random.default_rng(seed),
                                      profile_of(rates, period_s, start_s))


def generated(extra: str, n: int, seed: int = 3):
    scn = load_scenario("t.toml", text=SESSIONS.replace("[workload]\n", "[workload]\n" + extra))
    return workload.generate(resolve(scn, {}), scn.classes, n, np.random.default_rng(seed), 1_000_000)


def thinning(rate, rates, period_s, start_s, horizon_s, seed) -> list[float]:
    """Lewis-Shedler thinning: candidates of a Poisson process at the highest rate, each kept with probability
    rate(t) / highest; a non-homogeneous Poisson process of rate(t) on (0, horizon_s)."""
    rnd = random.Random(seed)
    mean = sum(rates) / len(rates)
    top = rate * max(rates) / mean
    width = period_s / len(rates)
    t, kept = 0.0, []
    while True:
        t += rnd.expovariate(top)
        if t >= horizon_s:
            return kept
        here = rate * rates[int(((start_s + t) % period_s) // width)] / mean
        if rnd.random() * top < here:
            kept.append(t)


def test_operational_time_and_its_inverse_by_hand():
    # Rates 2, 0, 6, 0 (mean 2: relative 1, 0, 3, 0) over 400 s slices of 100 s; the sample starts 150 s into the
    # period, inside the first slice of rate 0. Q(t), the integral of the relative rate from the start, by hand:
    p = profile_of([2, 0, 6, 0], 400.0, 150.0)
    t = np.array([0, 50, 100, 150, 250, 300, -150, -400, 400_000 + 100])
    q = np.array([0, 0, 150, 300, 300, 350, -100, -400, 400_000 + 150])
    np.testing.assert_allclose(p.operational(t), q, atol=1e-9)
    # The inverse takes the end of a flat stretch (a slice of rate 0): 0 -> 50 (the next slice with traffic
    # starts at 200 s of the period), 300 -> 250 (the end of the last slice), -100 -> -150, -400 -> -350.
    np.testing.assert_allclose(p.wall([0, 150, 300, 350, -100, -400, 400_150]),
                               [50, 100, 250, 300, -150, -350, 400_100], atol=1e-9)


def test_counts_per_slice_follow_the_profile():
    # A non-homogeneous Poisson process of rate(t) = rate_rps x profile_i / mean(profile) puts independent
    # Poisson(rate(t) x covered seconds) counts in the slices of a fixed window. Chi-square over every (period,
    # slice) cell of 4 periods of a 24-slice profile starting 13.5 slices in (partial first and last cells),
    # against the closed-form means: 4 x 21 cells with traffic (the zero cells must be empty), each >= 120 expected.
    rate, width = 20.0, 100.0
    period, start = 24 * width, 13.5 * width
    horizon = 4 * period
    t = arrivals(220_000, rate, DAY, period, start, seed=11)
    assert t[-1] > horizon  # the fixed window is covered (the mean count in it is 4 x 2400 x 20 = 192,000)
    t = t[(t > 0) & (t < horizon)]  # the first arrival is placed at 0 by construction
    cells = np.arange(int(start // width), int((start + horizon) // width) + 1)
    covered = np.minimum((cells + 1) * width, start + horizon) - np.maximum(cells * width, start)
    expected = rate * np.array(DAY)[cells % 24] / np.mean(DAY) * covered
    observed = np.bincount(((start + t) // width).astype(np.int64) - cells[0], minlength=len(cells))
    assert observed.sum() == len(t)
    assert np.all(observed[expected == 0] == 0)
    busy = expected > 0
    assert expected[busy].min() > 120
    chi2 = np.sum((observed[busy] - expected[busy]) ** 2 / expected[busy])
    # P(chi-square with 84 degrees of freedom > this) = 1e-4
    assert chi2 < stats.chi2.ppf(1 - 1e-4, busy.sum()), chi2


def test_poisson_arrivals_match_a_thinned_reference():
    # Same rate function, two constructions: operational time mapped through the cumulative intensity, and
    # Lewis-Shedler thinning in pure Python. Over 3 periods of an 8-slice profile (one slice of rate 0), the phases
    # of the arrivals and their gaps have one distribution (two-sample KS; a seeded run, P(p < 1e-3) = 1e-3 for a
    # random seed).
    rates, period, start, rate = [1, 3, 0.5, 0, 2, 4, 1, 2], 160.0, 30.0, 15.0
    horizon = 3 * period
    t = arrivals(10_000, rate, rates, period, start, seed=5)
    assert t[-1] > horizon
    mine = t[(t > 0) & (t < horizon)]
    ref = np.array(thinning(rate, rates, period, start, horizon, seed=6))
    assert len(mine) == pytest.approx(rate * horizon, abs=4 * np.sqrt(rate * horizon))
    assert len(ref) == pytest.approx(rate * horizon, abs=4 * np.sqrt(rate * horizon))
    assert stats.ks_2samp((start + mine) % period, (start + ref) % period).pvalue > 1e-3
    assert stats.ks_2samp(np.diff(mine), np.diff(ref)).pvalue > 1e-3


def test_no_arrival_falls_in_a_slice_of_rate_0():
    # Rates 0, 2, 0, 0, 1, 0 over 60 s; the sample starts at 55 s, in a slice of rate 0 that runs into the next
    # period's first slice (also 0): the first arrival falls at 10 s of the period, the start of the next slice
    # with traffic, and every arrival in [10, 20] or [40, 50] s of the period (a slice's end included). The
    # generator's whole path (sessions, lead-in) runs.
    req = generated("rate_profile = [0, 2, 0, 0, 1, 0]\nrate_profile_period_s = 60\nrate_profile_start_s = 55\n",
                    5000)
    phase = (10.0 + req.arrival_s) % 60.0
    tol = 1e-9 * (1 + req.arrival_s)
    inside = ((phase >= 10 - tol) & (phase <= 20 + tol)) | ((phase >= 40 - tol) & (phase <= 50 + tol))
    assert inside.all(), phase[~inside][:5]
    # twice the rate in the first busy slice: 2/3 of the arrivals of the whole periods (binomial bound)
    whole = req.arrival_s < 60.0 * np.floor(req.arrival_s[-1] / 60.0)
    first = (phase < 30) & whole
    assert whole.sum() > 4000
    assert first.sum() / whole.sum() == pytest.approx(2 / 3, abs=4 * np.sqrt(2 / 9 / whole.sum()))


#: sha256 (first 16 hex digits) of arrival_s, class_id, prompt_tokens, output_tokens, session_id and block_ids of
#: ``generate`` for the scenario in ``test_an_empty_profile_changes_nothing`` without a profile, recorded with the
#: generator as a stream of chunks (before rate profiles existed: 521c7f1a32ac9c71 and 6c3b906961b9e546, from
#: one random stream).
BEFORE_PROFILES = {"poisson": "35cab0da52c886fb", "gamma": "65d27aef91b1d8cd"}


@pytest.mark.parametrize("process", ["poisson", "gamma"])
def test_an_empty_profile_changes_nothing(process):
    text = ('[workload]\nrate_rps = 10.0\nthink_time_s = 5.0\nsystem_prompts = 20\narrivals = "{}"\n'
            "burstiness = 3.0\n[workload.classes.chat]\nshare = 0.7\nturns = 3.0\n[workload.classes.code]\n"
            "share = 0.3\n").format(process)
    for extra in ("", "rate_profile = []\nrate_profile_start_s = 3600\n"):
        scn = load_scenario("t.toml", text=text.replace("[workload]\n", "[workload]\n" + extra))
        req = workload.generate(resolve(scn, {}), scn.classes, 3000, np.random.default_rng(7), 1_000_000)
        digest = hashlib.sha256()
        for a in (req.arrival_s, req.class_id, req.prompt_tokens, req.output_tokens, req.session_id, req.block_ids):
            digest.update(np.ascontiguousarray(a).tobytes())
        assert digest.hexdigest()[:16] == BEFORE_PROFILES[process]


def test_a_flat_profile_is_the_identity():
    # Q(t) = t for a constant profile, whatever its level, so gamma arrivals keep their renewal times.
    plain = workload.renewal_arrivals(5000, 8.0, "gamma", 4.0, np.random.default_rng(2))
    flat = arrivals(5000, 8.0, [3, 3, 3], 90.0, 40.0, seed=2, process="gamma", burstiness=4.0)
    np.testing.assert_allclose(flat, plain, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("hour, n", [(1, 4000), (14, 8000)])
def test_the_start_places_a_short_sample_at_its_hour(hour, n):
    # n requests at a mean 10 requests/s stay inside one hour at 1 am (0.2 / mean) or 2 pm (2.7 / mean): the
    # gaps are exponential at rate = rate_rps x DAY[hour] / mean(DAY) (the mean of n of them has a relative
    # standard error of 1 / sqrt(n)). The turns of a session still follow each other after think_time_s = 5 s of
    # wall-clock time: the k-th turn takes the k-th arrival, so two turns of a session are the other turns of those
    # seconds (rate x 5 on average) and one more gap apart, 5 + 1 / rate s on average (pairs cut by the window's
    # ends are a little shorter; seeds spread the mean by about 7 %, as at a constant rate). A think time in
    # operational time would make them 5 x mean / DAY[hour]: 33 s at 1 am, 2.4 s at 2 pm.
    profile = ", ".join(str(x) for x in DAY)
    req = generated(f"rate_profile = [{profile}]\nrate_profile_start_s = {hour * 3600}\n", n)
    q = DAY[hour] / np.mean(DAY)
    assert req.arrival_s[-1] < 3600
    gaps = np.diff(req.arrival_s)
    assert gaps.mean() == pytest.approx(1 / (10.0 * q), rel=4 / np.sqrt(len(gaps)))
    order = np.lexsort((req.arrival_s, req.session_id))
    same = np.diff(req.session_id[order]) == 0
    think = np.diff(req.arrival_s[order])[same]
    assert same.sum() > 1000
    assert think.mean() == pytest.approx(5.0 + 1 / (10.0 * q), rel=0.15)


# -- bad input ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, key, fragment", [
    ("rate_profile = [1, -1]", "workload.rate_profile", "got -1 at position 2"),
    ("rate_profile = [0, 0, 0]", "workload.rate_profile", "got only zeros (3)"),
    ('rate_profile = [1, "a"]', "workload.rate_profile", "got 'a' at position 2"),
    ("rate_profile = [true]", "workload.rate_profile", "got True at position 1"),
    ("rate_profile = 3", "workload.rate_profile", "e.g. [1, 2, 1], got 3"),
    ("rate_profile = [1, nan]", "workload.rate_profile", "got nan"),
    ("rate_profile_period_s = 0", "workload.rate_profile_period_s", "expected a number in [0.001, 3.2e+08]"),
    ('rate_profile_period_s = { dist = "uniform", low = 1, high = 2 }', "workload.rate_profile_period_s",
     "cannot be uncertain"),
    ("rate_profile_start_s = -1", "workload.rate_profile_start_s", "expected a number in [0, 3.2e+08]"),
    ("rate_profile_start_s = 86400", "workload.rate_profile_start_s", "expected a time in [0, 86400) s"),
    ("rate_profile_period_s = 60\nrate_profile_start_s = 90", "workload.rate_profile_start_s",
     "expected a time in [0, 60) s"),
    ('rate_profile_start_s = { dist = "uniform", low = 0, high = 90000 }', "workload.rate_profile_start_s",
     "a uniform distribution up to 90000"),
    ('rate_profile_start_s = { dist = "choice", values = [0, 86400] }', "workload.rate_profile_start_s",
     "a choice distribution up to 86400"),
    ('trace = "bundled:mooncake"\nrate_profile = [1, 2]', "workload.rate_profile",
     "a trace replay brings its own arrival times"),
])
def test_bad_profiles_are_one_line_errors_naming_file_and_key(text, key, fragment):
    with pytest.raises(ScenarioError) as err:
        load_scenario("day.toml", text=f"[workload]\n{text}\n")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"day.toml: {key}: ") and fragment in message, message


def test_good_profiles_load_from_the_file_and_set():
    scn = load_scenario("day.toml", text="[workload]\nrate_profile = [1, 2.5, 0]\n"
                        'rate_profile_start_s = { dist = "uniform", low = 0, high = 86400 }\n')
    assert scn["workload.rate_profile"] == (1.0, 2.5, 0.0)
    assert "workload.rate_profile_start_s" in scn.uncertain()
    scn = load_scenario("day.toml", text="", overrides=["workload.rate_profile=[3, 1]",
                                                      "workload.rate_profile_start_s=43200"])
    assert scn["workload.rate_profile"] == (3.0, 1.0) and scn["workload.rate_profile_start_s"] == 43200.0
    assert load_scenario("day.toml", text="")["workload.rate_profile"] == ()
    # a trace with an empty profile is a plain replay
    load_scenario("day.toml", text='[workload]\ntrace = "bundled:mooncake"\nrate_profile = []\n')


@pytest.mark.parametrize("override, fragment", [
    ("workload.rate_profile=[1,-2]", "got -2 at position 2"),
    ("workload.rate_profile=1,2,3", "e.g. [1, 2, 1], got '1,2,3'"),
    ("workload.rate_profile=[0]", "got only zeros (1)"),
    ("workload.rate_profile_start_s=90000", "expected a time in [0, 86400) s"),
])
def test_bad_set_is_an_error(override, fragment):
    with pytest.raises(ScenarioError, match=None) as err:
        load_scenario("day.toml", text="", overrides=[override])
    assert fragment in str(err.value) and override.split("=")[0] in str(err.value)


@pytest.mark.parametrize("grid, key, fragment", [
    ("workload.rate_profile_start_s=0,90000", "workload.rate_profile_start_s", "expected a time in [0, 86400) s"),
    ("workload.rate_profile_period_s=86400,3600", "workload.rate_profile_start_s", "expected a time in [0, 3600) s"),
    ("workload.rate_profile=1,2", "workload.rate_profile", "a list-valued key cannot be a grid axis"),
    ("workload.trace=bundled:mooncake", "workload.rate_profile", "a trace replay brings its own arrival times"),
])
def test_bad_grid_is_an_error(grid, key, fragment):
    scn = load_scenario("day.toml", text="[workload]\nrate_profile = [1, 2]\nrate_profile_start_s = 7200\n")
    with pytest.raises(ScenarioError) as err:
        validate_axes(scn, [parse_grid_option(grid)])
    assert f"{key}: " in str(err.value) and fragment in str(err.value), str(err.value)
    ok = validate_axes(scn, [parse_grid_option("workload.rate_profile_start_s=0,50400")])
    assert ok[0].values == (0, 50400)


def test_run_exits_2_on_a_bad_profile(tmp_path):
    scenario = tmp_path / "day.toml"
    scenario.write_text('[workload]\nrate_profile = [1, 2]\n')
    for extra in (["--set", "workload.rate_profile=[1,-1]"], ["--set", "workload.trace=bundled:azure-code"],
                  ["--grid", "workload.rate_profile_start_s=0,1e6"]):
        result = CliRunner().invoke(main, ["run", str(scenario), "--samples", "1", "--requests", "50",
                                           "--no-progress", "-o", str(tmp_path / "out.nc"), *extra])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(scenario) in lines[0] and "workload.rate_profile" in lines[0], lines
    assert not (tmp_path / "out.nc").exists()


def test_huge_relative_rates_are_the_same_profile():
    # Relative rates: scaling them changes nothing, even where their mean would overflow to inf (it once hung
    # the run on NaN arrival times).
    a = arrivals(2000, 3.0, [1e308, 1e308, 5e307], 60.0, 10.0, seed=4)
    b = arrivals(2000, 3.0, [2.0, 2.0, 1.0], 60.0, 10.0, seed=4)
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_a_rate_profiles_drift_is_not_extrapolated_into_a_request_count():
    """A result written before the checks compared whole periods (no ``steady_state_windows`` attribute): under a
    rate profile its last two quarters saw different loads, so the summary says the drift may be the profile's and
    gives no extrapolated count (a whole day once advised 700 million requests)."""
    import xarray as xr

    from mcsim.results.summary import steady_state_note

    ds = xr.Dataset({"steady_state": ("sample", np.array([0.0, 1.0])),
                     "requests_for_steady_state": ("sample", np.array([7e8, 2000.0]))},
                    attrs={"rate_profile_slices": 24})
    text = " ".join(steady_state_note(ds))
    assert "may be the profile's own" in text and "700000000" not in text and "may still depend" in text
    ds.attrs["rate_profile_slices"] = 0
    assert "--set mc.requests=700000000" in " ".join(steady_state_note(ds))
