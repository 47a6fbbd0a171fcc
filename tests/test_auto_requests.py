"""``--requests auto``: runs grow until every sample is at steady state, by the stated rule, within the cap."""

import numpy as np
import pytest
import xarray as xr

import mcsim
from mcsim.execution.auto_requests import GROWTH, RequestsError, parse
from tests.helpers import MD1, invoke


@pytest.fixture(scope="module")
def busy_md1(tmp_path_factory):
    """The M/D/1 instance at rho = 0.78 (rate 1.8/s, 0.435 s a request): its queue wait drifts over a few hundred
    requests and settles over thousands."""
    path = tmp_path_factory.mktemp("auto") / "busy.toml"
    path.write_text(MD1.replace('fleet = "utilization"', 'fleet = "fixed"').replace("rate_rps = 1.0", "rate_rps = 1.8")
                    .replace("requests = 4000", "requests = 500"))
    return path


def test_auto_grows_by_the_rule_and_ends_with_what_a_plain_run_gives(busy_md1):
    ds = mcsim.run(busy_md1, samples=2, requests="auto:9000", workers=2)
    note = ds.attrs["requests_auto"]
    tried = [int(n.replace(",", "")) for n in note.split(" (cap")[0].removeprefix("requests per sample ").split(" -> ")]
    assert tried[0] == 500 and tried[-1] <= 9000 and len(tried) >= 2
    # each step, checked against plain runs at the requests tried: while some sample is unsteady the next run has
    # max(2 n, the largest extrapolated need of an unsteady sample), capped at 9000
    for n, following in zip(tried, tried[1:]):
        plain = mcsim.run(busy_md1, samples=2, requests=n, workers=2)
        unsteady = plain.steady_state.values == 0
        assert unsteady.any()
        need = plain.requests_for_steady_state.values[unsteady]
        assert following == min(9000, max(2 * n, int(np.max(need[np.isfinite(need)], initial=0))))
    last = mcsim.run(busy_md1, samples=2, requests=tried[-1], workers=2)
    assert (last.steady_state.values == 1).all() or tried[-1] == 9000
    for name in last.data_vars:
        np.testing.assert_array_equal(ds[name].values, last[name].values, err_msg=name)


def test_a_steady_run_is_not_grown_and_the_cli_says_so(busy_md1, tmp_path):
    out = tmp_path / "quiet.nc"
    result = invoke("run", busy_md1, "--samples", "2", "--requests", "auto", "--set", "workload.rate_rps=0.2",
                    "--set", "mc.requests=3000", "-o", out, "--workers", "1")
    assert result.exit_code == 0, result.output
    assert f"requests per sample 3,000 (cap {GROWTH * 3000:,}): every sample run at steady state" in \
        " ".join(result.output.split())
    with xr.open_dataset(out) as ds:
        assert ds.attrs["requests_per_sample"] == 3000 and (ds.steady_state.values == 1).all()


def test_bad_requests_are_refused_in_one_line(busy_md1, tmp_path):
    assert parse("auto", 600) == (600, GROWTH * 600)
    assert parse("auto:1000", 600) == (600, 1000) and parse("auto:100", 600) == (100, 100)
    assert parse(800, 600) is None and parse("800", 600) is None
    with pytest.raises(RequestsError, match="auto:N"):
        parse("several", 600)
    # the cap never passes mc.requests' own range: a grown run is never longer than a run the schema accepts
    assert parse("auto", 90_000_000) == (90_000_000, 100_000_000)
    with pytest.raises(RequestsError, match="between 1 and 100,000,000"):
        parse("auto:1000000000000", 600)
    out = tmp_path / "never.nc"
    for args, words in [(["run", "--requests", "autox"], "'auto' or 'auto:N'"),
                        (["run", "--requests", "auto:10000000000"], "between 1 and 100,000,000"),
                        (["run", "--requests", "\u00b2"], "expected a count of requests"),
                        (["run", "--requests", "auto", "--resume"], "exclude each other"),
                        (["capacity", "--requests", "auto"], "only run, compare and sweep")]:
        bad = invoke(args[0], busy_md1, *args[1:], "-o", out, "--samples", "1")
        assert bad.exit_code == 2 and words in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1 and "Traceback" not in bad.output
    assert not out.exists()
