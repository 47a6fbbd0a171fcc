"""The report: files, figures and tables of result Datasets shaped as mcsim writes them."""

import csv
import json
import re

import matplotlib.image
import numpy as np
import pytest
import scipy.stats

from mcsim.results.dataset import MODEL_STATEMENT
from mcsim.results.report import LEVELS, quantiles, waterfall_steps, write_report
from mcsim.results.variables import TIERS

from helpers import REPORT_INPUTS, make_result

INPUTS = REPORT_INPUTS


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_report(ds, out, summary, expect_figures=()):
    """What every report must satisfy; returns the quantile rows checked against numpy."""
    assert summary == out / "summary.md"
    for name in ("quantiles.csv", "quantiles.json", "sensitivity.csv", "summary.md"):
        assert (out / name).is_file(), name
    text = summary.read_text()
    assert ds.attrs["scenario_name"] in text and "modelled" in text and MODEL_STATEMENT in text
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links and all((out / link).is_file() for link in links), links
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert set(pngs) <= set(links), "every figure is linked from the summary"
    for prefix in expect_figures:
        assert any(p.startswith(prefix) for p in pngs), prefix
    for png in pngs:
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(out / png)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    rows = read_csv(out / "quantiles.csv")
    grid = [d for d in ds["gross_margin"].dims if d not in ("sample", "variant")]
    checked = 0
    for row in rows:
        da = ds[row["variable"]]
        if row["request_quantile"]:
            da = da.sel(request_quantile=float(row["request_quantile"]))
        if "tier=" in row["selection"]:
            da = da.sel(tier=row["selection"].split("tier=")[1])
        for dim in grid + (["variant"] if "variant" in ds.dims else []):
            match = [c for c in ds[dim].values if str(c.item()) == row[dim]]
            assert len(match) == 1, (dim, row[dim])
            da = da.sel({dim: match[0]})
        values = da.values.astype(float)
        values = values[~np.isnan(values)]
        assert int(row["samples"]) == values.size
        if values.size and np.all(np.isfinite(values)):  # (payback under rental pricing has no values)
            expected = np.quantile(values, LEVELS)
            got = [float(row[f"p{100 * q:g}"]) for q in LEVELS]
            np.testing.assert_allclose(got, expected, rtol=1e-12)
            checked += 1
    assert checked >= len(rows) // 2
    meta = json.loads((out / "quantiles.json").read_text())
    assert len(meta["rows"]) == len(rows)
    return rows


def test_run_without_grid_or_variant(tmp_path):
    ds = make_result()
    summary = write_report(ds, tmp_path)
    rows = check_report(ds, tmp_path, summary, expect_figures=("dist_", "tornado_"))
    metrics = {r["metric"] for r in rows}
    assert {"gross_margin", "cost_usd_per_mtok", "ttft_s p50", "ttft_s p99", "tpot_s p99"} <= metrics
    assert not list(tmp_path.glob("heatmap_*")) and not list(tmp_path.glob("waterfall_*"))
    sens = read_csv(tmp_path / "sensitivity.csv")
    margin = {r["input"]: r for r in sens if r["output"] == "gross_margin"}
    assert set(margin) == set(INPUTS)
    gain = margin["efficiency.fused_kernel_gain"]
    expected = scipy.stats.spearmanr(ds["efficiency_fused_kernel_gain"], ds["gross_margin"]).statistic
    assert float(gain["spearman"]) == pytest.approx(expected, abs=1e-12)
    assert float(gain["prcc"]) > 0.9 and float(gain["sobol_first_order"]) > 0.8
    assert float(gain["prcc_low"]) <= float(gain["prcc"]) <= float(gain["prcc_high"])
    assert abs(float(margin["workload.rate_rps"]["prcc"])) < 0.45
    # the strongest driver leads the summary's sensitivity table
    table = summary.read_text().split("## Sensitivity")[1]
    assert table.index("efficiency.fused_kernel_gain") < table.index("speculative.draft_cost")


def test_one_numeric_axis_with_variants(tmp_path):
    ds = make_result(grid={"speculative.draft_tokens": [0, 1, 3]}, variants=["baseline", "factory"], n=40)
    summary = write_report(ds, tmp_path, metrics=["gross_margin", "cost_usd_per_mtok", "ttft_s"])
    rows = check_report(ds, tmp_path, summary, expect_figures=("dist_", "tornado_", "waterfall_"))
    assert len(rows) == 4 * 3 * 2  # (2 metrics + ttft at p50 and p99) x 3 grid values x 2 variants
    assert not list(tmp_path.glob("heatmap_*"))
    sens = read_csv(tmp_path / "sensitivity.csv")
    assert len(sens) == 4 * 3 * 2 * len(INPUTS)
    # n = 40 < 64: no Sobol index, and the note says why
    assert all(r["sobol_first_order"] == "" and "64" in r["note"] for r in sens)
    # intervals only at the plotted point (first grid value, factory)
    with_ci = {(r["speculative_draft_tokens"], r["variant"]) for r in sens if r["prcc_low"]}
    assert with_ci == {("0", "factory")}
    start, steps, end, how = waterfall_steps(ds, "cost_usd_per_mtok")
    assert steps == [] and "no lever" in how
    first = ds["cost_usd_per_mtok"].isel({"speculative_draft_tokens": 0})
    assert start == pytest.approx(float(np.median(first.sel(variant="baseline"))))
    assert end == pytest.approx(float(np.median(first.sel(variant="factory"))))


def test_two_axes_one_categorical(tmp_path):
    ds = make_result(grid={"hardware.preset": ["H100", "H200", "B200"], "cache.dram_gb_per_node": [0.0, 512.0]},
                     variants=["baseline", "factory"], n=30)
    summary = write_report(ds, tmp_path, metrics=["gross_margin", "payback_months"])
    check_report(ds, tmp_path, summary, expect_figures=("heatmap_gross_margin", "dist_payback_months"))
    text = summary.read_text()
    assert "`hardware.preset` = H100, H200, B200" in text
    assert "hardware.preset=H100, cache.dram_gb_per_node=0, factory" in text


def test_big_grid_caps_the_summary_table(tmp_path):
    ds = make_result(grid={"a.x": [1, 2, 3, 4], "b.y": ["p", "q", "r"], "c.z": [0.5, 1.5, 2.5]},
                     variants=["baseline", "factory"], n=12)
    summary = write_report(ds, tmp_path, metrics=["gross_margin"])
    check_report(ds, tmp_path, summary, expect_figures=("heatmap_gross_margin",))
    text = summary.read_text()
    assert "First 30 of 72 grid points" in text
    assert len(read_csv(tmp_path / "quantiles.csv")) == 72


def test_shapley_waterfall(tmp_path):
    levers = ["kv_tiers", "speculative", "experts"]
    ds = make_result(grid={"speculative.draft_tokens": [1, 2]}, variants=["baseline", "factory"], n=24,
                     shapley_levers=levers)
    summary = write_report(ds, tmp_path, metrics=["cost_usd_per_mtok"])
    check_report(ds, tmp_path, summary, expect_figures=("waterfall_cost_usd_per_mtok", "waterfall_gross_margin"))
    _, steps, _, how = waterfall_steps(ds, "gross_margin")
    assert "Shapley" in how and sorted(s[0] for s in steps) == sorted(levers)
    # linear scale: each step is the lever's mean Shapley value, largest first
    phi = ds["shapley_gross_margin"].isel({"speculative_draft_tokens": 0}).values
    means = {lever: sum(row) / len(row) for lever, row in zip(levers, phi.tolist())}
    expected = sorted(means.items(), key=lambda kv: -abs(kv[1]))
    assert [s[0] for s in steps] == [k for k, _ in expected]
    np.testing.assert_allclose([s[1] for s in steps], [v for _, v in expected], rtol=1e-12)


def test_one_lever_at_a_time_waterfall(tmp_path):
    variants = ["baseline", "factory", "without:kv_tiers", "without:speculative"]
    ds = make_result(variants=variants, n=20)
    _, steps, _, how = waterfall_steps(ds, "gross_margin")
    margin = ds["gross_margin"]
    assert [s[0] for s in steps] == ["kv_tiers", "speculative"] and "without" in how
    for lever, value in steps:
        paired = margin.sel(variant="factory").values - margin.sel(variant=f"without:{lever}").values
        assert value == pytest.approx(float(np.median(paired)))
    summary = write_report(ds, tmp_path, metrics=["gross_margin"])
    check_report(ds, tmp_path, summary, expect_figures=("waterfall_gross_margin",))


def test_without_uncertain_inputs(tmp_path):
    ds = make_result(with_inputs=False, n=10)
    summary = write_report(ds, tmp_path, metrics=["gross_margin", "cache_hit_rate_by_tier"])
    rows = check_report(ds, tmp_path, summary, expect_figures=("dist_gross_margin", "dist_cache_hit_rate_by_tier_nvme"))
    assert [r["metric"] for r in rows] == ["gross_margin"] + [f"cache_hit_rate_by_tier {t}" for t in TIERS]
    assert read_csv(tmp_path / "sensitivity.csv") == []
    assert "No uncertain inputs" in summary.read_text()
    assert not list(tmp_path.glob("tornado_*"))


def test_unknown_metric_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="not_a_metric"):
        write_report(make_result(n=8), tmp_path, metrics=["not_a_metric"])


def test_quantiles_keep_infinities():
    values = np.array([1.0, 2.0, 3.0, np.inf, np.nan])
    # positions 0.2, 1.0, 2.0, 2.8 (of 0..3) among the four non-NaN values
    np.testing.assert_array_equal(quantiles(values, [0.05 * 4 / 3, 1 / 3, 2 / 3, 0.95]), [1.2, 2.0, 3.0, np.inf])
    finite = np.random.default_rng(0).normal(size=101)
    np.testing.assert_array_equal(quantiles(finite), np.quantile(finite, LEVELS))
    assert np.all(np.isnan(quantiles(np.array([np.nan]))))


def test_real_compare_result_from_file(tmp_path, factory_path):
    import mcsim

    ds = mcsim.compare(factory_path, samples=8, requests=500)
    path = tmp_path / "cmp.nc"
    ds.to_netcdf(path)
    # three metrics (the headline set's figures are drawn by the synthetic results' tests)
    summary = write_report(path, tmp_path / "report", metrics=["gross_margin", "cost_usd_per_mtok", "ttft_s"])
    check_report(ds, tmp_path / "report", summary, expect_figures=("dist_", "tornado_", "waterfall_"))
    assert "| baseline | factory |" in summary.read_text()


def test_summary_of_a_file_with_the_old_quantile_dim():
    # Results written before request_quantile had "quantile": the summary reads them the same way.
    from mcsim.results.summary import summarize

    new = make_result(n=12, seed=9)
    old = new.rename({"request_quantile": "quantile"})
    got, expected = summarize(old)["variants"]["factory"], summarize(new)["variants"]["factory"]
    assert "quantile" not in summarize(old).get("grid_axes", [])
    np.testing.assert_allclose(got["ttft_s p99"]["median"],
                               float(np.median(new.ttft_s.sel(request_quantile=0.99).values)))
    assert got["ttft_s p99"] == expected["ttft_s p99"]


def test_steady_state_advice_never_asks_a_trace_for_more_than_it_holds():
    from pathlib import Path

    import mcsim
    from mcsim.results.summary import steady_state_note

    root = Path(__file__).resolve().parents[1]
    ds = mcsim.run(root / "scenarios" / "factory.toml", samples=1, requests=1_000_000, workers=1,
                   overrides=['workload.trace="bundled:azure-code"'])  # 8,819 records
    ds["steady_state"][:] = 0  # as if the run had not settled, and needed far more requests
    ds["requests_for_steady_state"][:] = 1_200_000
    note = " ".join(steady_state_note(ds))
    assert "more than the replayed trace holds (about 8819)" in note and "mc.requests=" not in note
    # a run that did not exhaust the trace knows its size too (the trace_records attribute)
    short = mcsim.run(root / "scenarios" / "factory.toml", samples=1, requests=3000, workers=1,
                      overrides=['workload.trace="bundled:azure-code"'])
    assert short.attrs["trace_records"] == 8819
    short["steady_state"][:] = 0
    short["requests_for_steady_state"][:] = 20_000
    note = " ".join(steady_state_note(short))
    assert "more than the replayed trace holds (about 8819)" in note and "mc.requests=" not in note
    short["requests_for_steady_state"][:] = 6_000
    note = " ".join(steady_state_note(short))
    assert "--set mc.requests=6000" in note and "(the replayed trace holds 8819)" in note


def test_fleet_counts_are_whole_in_the_summary():
    from mcsim.results.summary import WHOLE_COUNTS, band

    # two samples of 6 and 7 prefill instances: the median is a fleet that exists, the lower middle sample's
    assert band([6, 7], whole=True) == {"median": 6.0, "p5": 6.0, "p95": 7.0}
    assert band([8, 8, 16, 24], whole=True)["median"] == 8.0  # GPUs of 8-GPU instances: never 12
    assert band([6, 7])["median"] == 6.5  # a rate stays interpolated
    assert {"gpus", "prefill_instances", "decode_instances"} <= WHOLE_COUNTS
