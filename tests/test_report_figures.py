"""The report's figures: waterfalls in the metric's units, paired comparisons, load curves, focus, layout.

References are plain Python (loops, sorted lists), never the figure code's own helpers.
"""

import itertools
import math

import matplotlib
import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner
from matplotlib.colors import same_color
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from mcsim.cli import main
from mcsim.results.figures import build_figures
from mcsim.results.figures.common import log_tick_text
from mcsim.results.figures.paired import paired
from mcsim.results.figures.tornado import s1_text, tornado
from mcsim.results.figures.waterfalls import bars, waterfall_figure
from mcsim.results.layout import ReportError, Series, _Layout
from mcsim.results.report import write_report
from mcsim.results.variables import FEASIBLE_REASONS, attrs_for
from mcsim.results.waterfall import waterfall

from helpers import make_result

LEVERS = ["kv_cache", "speculative", "low_precision", "fused_kernels", "comm_overlap"]


def ablation_result(n=20, seed=1):
    """A compare --ablate result: 12 variants, per-sample Shapley values that add up to factory - baseline."""
    variants = (["baseline", "factory"] + [f"without:{lever}" for lever in LEVERS]
                + [f"only:{lever}" for lever in LEVERS])
    ds = make_result(variants=variants, n=n, seed=seed)
    rng = np.random.default_rng(seed)
    base_cost = rng.uniform(8, 15, n)
    phi_cost = -np.abs(rng.normal([0.7, 0.6, 0.15, 0.05, 0.04], 0.05, (n, len(LEVERS)))).T  # (lever, sample)
    base_margin = rng.uniform(-1.2, -0.6, n)
    phi_margin = rng.normal([0.1, 0.5, 0.45, 0.07, 0.05], 0.05, (n, len(LEVERS))).T
    phi_cost[:, 3] = np.nan  # an infeasible subset in sample 3: no Shapley values there
    cost = ds["cost_usd_per_mtok"].values.copy()
    margin = ds["gross_margin"].values.copy()
    cost[0], cost[1] = base_cost, base_cost * np.exp(np.nansum(phi_cost, axis=0))
    margin[0], margin[1] = base_margin, base_margin + phi_margin.sum(axis=0)
    ds["cost_usd_per_mtok"] = (("variant", "sample"), cost, attrs_for("cost_usd_per_mtok"))
    ds["gross_margin"] = (("variant", "sample"), margin, attrs_for("gross_margin"))
    ds = ds.assign_coords(lever=LEVERS)
    ds["shapley_cost_usd_per_mtok"] = (("lever", "sample"), phi_cost, {"units": "log of the ratio", "scale": "log"})
    ds["shapley_gross_margin"] = (("lever", "sample"), phi_margin, {"units": "1", "scale": "linear"})
    ds["feasible"][:] = 1
    return ds


def reference_waterfall(base, fact, phi, log):
    """Slow reference: ends and steps (in metric units) from per-sample Shapley values, plain Python."""
    keep = [s for s in range(len(base)) if all(math.isfinite(phi[i][s]) for i in range(len(phi)))]
    mean = [sum(phi[i][s] for s in keep) / len(keep) for i in range(len(phi))]
    order = sorted(range(len(phi)), key=lambda i: -abs(mean[i]))
    if log:
        start = math.exp(sum(math.log(base[s]) for s in keep) / len(keep))
        end = math.exp(sum(math.log(fact[s]) for s in keep) / len(keep))
        steps, level = [], start
        for i in order:
            steps.append((i, level * math.exp(mean[i]) - level))
            level *= math.exp(mean[i])
    else:
        start = sum(base[s] for s in keep) / len(keep)
        end = sum(fact[s] for s in keep) / len(keep)
        steps = [(i, mean[i]) for i in order]
    return start, steps, end, len(keep)


def drawn_bars(fig):
    ax = fig.axes[0]
    return [(p.get_y(), p.get_height()) for p in ax.patches if isinstance(p, Rectangle) and p.get_width() < 1]


@pytest.mark.parametrize("metric, log, factor", [("cost_usd_per_mtok", True, 1.0), ("gross_margin", False, 100.0)])
def test_shapley_waterfall_in_metric_units(metric, log, factor):
    ds = ablation_result()
    base = ds[metric].sel(variant="baseline").values.tolist()
    fact = ds[metric].sel(variant="factory").values.tolist()
    phi = ds[f"shapley_{metric}"].values.tolist()
    start, steps, end, used = reference_waterfall(base, fact, phi, log)
    w = waterfall(ds, metric)
    assert w.exact and w.samples == used == (19 if log else 20) and w.left_out == 20 - used
    assert w.start == pytest.approx(start, rel=1e-12) and w.end == pytest.approx(end, rel=1e-12)
    assert [lever for lever, _ in w.steps] == [LEVERS[i] for i, _ in steps]
    np.testing.assert_allclose([d for _, d in w.steps], [d for _, d in steps], rtol=1e-10)
    # the bars add up exactly to factory - baseline, in the metric's units; no "interactions" bar
    assert sum(d for _, d in w.steps) == pytest.approx(end - start, rel=1e-10)
    assert all(kind != "rest" for *_, kind in bars(w))
    # the drawn artists: baseline, one bar per lever (bottom = the running level), factory; in display units
    name, fig, _ = waterfall_figure(ds, _Layout(ds), metric)
    drawn = drawn_bars(fig)
    assert len(drawn) == len(LEVERS) + 2
    np.testing.assert_allclose(drawn[0], (0.0, start * factor), rtol=1e-10)
    np.testing.assert_allclose(drawn[-1], (0.0, end * factor), rtol=1e-10)
    level = start
    for (bottom, height), (_, delta) in zip(drawn[1:-1], steps):
        np.testing.assert_allclose((bottom, height), (level * factor, delta * factor), rtol=1e-10, atol=1e-12)
        level += delta
    assert level == pytest.approx(end, rel=1e-10)
    units = "USD/Mtok" if log else "%"
    assert units in fig.axes[0].get_ylabel()


def test_paired_shares_and_ratios():
    # H200 is 1 % to 5 % dearer than H100 in 29 of 30 paired samples, though the boxes overlap completely
    n = 30
    ds = make_result(grid={"hardware.preset": ["h100", "h200"]}, n=n, seed=3)
    rng = np.random.default_rng(3)
    h100 = rng.uniform(1.0, 3.0, n)
    h200 = h100 * rng.uniform(1.01, 1.05, n)
    h200[7] = h100[7] * 0.9
    ds["cost_usd_per_mtok"] = (("hardware_preset", "sample"), np.stack([h100, h200]), attrs_for("cost_usd_per_mtok"))
    ds["feasible"][:] = 1
    layout = _Layout(ds)
    rows, hidden = paired(ds, layout, Series("cost_usd_per_mtok", "cost_usd_per_mtok"), "hardware_preset")
    assert hidden == 0 and len(rows) == 1 and rows[0]["kind"] == "ratio" and rows[0]["value"] == "h200"
    assert rows[0]["higher"] == pytest.approx(29 / 30) and rows[0]["lower"] == pytest.approx(1 / 30)
    np.testing.assert_allclose(sorted(rows[0]["paired"]), sorted(b / a for a, b in zip(h100, h200)), rtol=1e-12)
    # margins compare as differences in percentage points
    rows, _ = paired(ds, layout, Series("gross_margin", "gross_margin"), "hardware_preset")
    margin = ds["gross_margin"].values
    assert rows[0]["kind"] == "difference"
    np.testing.assert_allclose(sorted(rows[0]["paired"]), sorted(100 * (margin[1] - margin[0])), rtol=1e-12)


def test_load_curves_medians_over_samples(tmp_path):
    rates = [10.0, 20.0, 40.0]
    ds = make_result(grid={"workload.rate_rps": rates}, variants=["baseline", "factory"], n=25, seed=4,
                     with_inputs=False)
    ds["feasible"][:] = 1
    layout = _Layout(ds)
    figures = build_figures(ds, layout, [Series("slo_attainment", "slo_attainment")], [], {})
    (name, fig), = figures["load"]
    assert name == "load_workload.rate_rps.png"
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert [line.get_label() for line in lines] == ["baseline", "factory"]
    for v, line in enumerate(lines):
        np.testing.assert_array_equal(line.get_xdata(), rates)
        for i in range(3):
            values = sorted(ds["slo_attainment"].values[i, v].tolist())
            median = (values[12] if len(values) == 25 else None) * 100  # 25 samples: the 13th value, in %
            assert line.get_ydata()[i] == pytest.approx(median, rel=1e-12)
    assert "(%)" in ax.get_ylabel()
    # a report of such a sweep links the load figure
    summary = write_report(ds, tmp_path / "r", metrics=["gross_margin", "slo_attainment", "queue_wait_s"])
    assert "load_workload.rate_rps.png" in summary.read_text()


def test_infeasible_samples_left_out_and_constants_noted():
    ds = make_result(n=20, seed=5)
    ttft = ds["ttft_s"].values.copy()
    ttft[:4] = 1e6  # infeasible samples' latencies would stretch the axis
    ds["ttft_s"] = (ds["ttft_s"].dims, ttft, attrs_for("ttft_s"))
    ds["feasible"][:] = 1
    ds["feasible"][:4] = 0
    ds["expert_efficiency"][:] = 1.0
    layout = _Layout(ds)
    figures = dict(build_figures(ds, layout, [Series("ttft_s p99", "ttft_s", (("request_quantile", 0.99),)),
                                              Series("expert_efficiency", "expert_efficiency")], [], {})["distributions"])
    fig = figures["dist_ttft_s_p99.png"]
    assert "4 of 20 samples infeasible, left out" in " ".join(fig.get_suptitle().split())
    assert fig.axes[0].get_ylim()[1] < 1e3
    fig = figures["dist_expert_efficiency.png"]
    assert "constant: 100 %" in " ".join(fig.get_suptitle().split())
    assert not [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_alpha() == 0.55]


def test_negative_first_order_index_is_shown_as_noise():
    assert s1_text(-0.04) == "S1 = 0 (< 0, noise)" and s1_text(0.314) == "S1 = 0.31"


def test_focus_point_and_bad_options(tmp_path):
    ds = make_result(grid={"hardware.preset": ["h100", "h200"], "cache.dram_gb_per_node": [0.0, 512.0]},
                     variants=["baseline", "factory"], n=30)
    summary = write_report(ds, tmp_path / "r", metrics=["gross_margin"],
                           at={"hardware.preset": "h200", "cache.dram_gb_per_node": "512"})
    text = summary.read_text()
    assert "hardware.preset=h200, cache.dram_gb_per_node=512, factory" in text
    import csv
    with open(tmp_path / "r" / "sensitivity.csv") as f:
        with_ci = {(r["hardware_preset"], r["cache_dram_gb_per_node"]) for r in csv.DictReader(f) if r["prcc_low"]}
    assert with_ci == {("h200", "512.0")}
    with pytest.raises(ReportError, match=r"hardware\.preset=h999.*values: h100, h200"):
        write_report(ds, tmp_path / "x", at={"hardware.preset": "h999"})
    with pytest.raises(ReportError, match=r"hardware\.prest.*grid axes: hardware\.preset, cache\.dram_gb_per_node"):
        write_report(ds, tmp_path / "x", at={"hardware.prest": "h200"})
    path = tmp_path / "res.nc"
    ds.to_netcdf(path)
    for args, words in ((["--at", "hardware.preset=h999"], ["h999", "h100, h200"]),
                        (["--metrics", "gross_margn"], ["gross_margn", "gross_margin"]),
                        (["--at", "hardware.preset"], ["PATH=VALUE"])):
        result = CliRunner().invoke(main, ["report", str(path), "-o", str(tmp_path / "cli"), *args])
        assert result.exit_code == 2, result.output
        message = result.output.strip()
        assert message.startswith("error:") and "\n" not in message and all(w in message for w in words), message
    result = CliRunner().invoke(main, ["report", str(path), "-o", str(tmp_path / "cli"), "--metrics",
                                       "gross_margin,cost_usd_per_mtok", "--at", "hardware.preset=h200"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "cli").glob("dist_*")) == ["dist_cost_usd_per_mtok.png",
                                                                       "dist_gross_margin.png"]


def undotted(ds):
    """The same result with dotted dims renamed (make_result already names them as results do; this checks a
    result whose dims were renamed by hand reads the same)."""
    renames = {d: d.replace(".", "_") for d in ds.dims if "." in d}
    renames.update({n: n.replace(".", "_") for n in ds.data_vars if "." in n})
    out = ds.rename(renames)
    for old, new in renames.items():
        out[new].attrs["path"] = old
    return out


def sweep_result(n=12):
    return make_result(grid={"speculative.draft_tokens": [0, 1, 2, 3], "cache.dram_gb_per_node": [0.0, 128.0,
                             256.0, 384.0, 512.0], "hardware.preset": ["h800", "h200"]}, n=n, seed=6)


def _drawn_texts(fig):
    """Every text a drawn figure shows: ticks outside their axis's view keep stale labels that are not drawn."""
    hidden, ticks = set(), {}
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            span = (hi - lo) * 1e-9
            drawn = []
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                shown = lo - span <= tick.get_loc() <= hi + span
                for label in (tick.label1, tick.label2):
                    if not shown:
                        hidden.add(id(label))
                    elif label.get_visible() and label.get_text().strip():
                        drawn.append(label)
            ticks[id(axis)] = drawn
    texts = [t for t in fig.findobj(Text) if id(t) not in hidden and t.get_visible() and t.get_text().strip()]
    return texts, ticks


def _inside(outer, inner, tol=1.0):
    return (inner.x0 >= outer.x0 - tol and inner.y0 >= outer.y0 - tol and inner.x1 <= outer.x1 + tol
            and inner.y1 <= outer.y1 + tol)


@pytest.mark.parametrize("kind", ["ablation", "sweep-undotted", "load", "point"])
def test_no_text_is_clipped_and_tick_labels_do_not_overlap(tmp_path, kind):
    ds = {"ablation": ablation_result, "sweep": sweep_result, "ablation-undotted": lambda: undotted(ablation_result()),
          "sweep-undotted": lambda: undotted(sweep_result()),
          "load": lambda: make_result(grid={"workload.rate_rps": [5.0, 10.0, 20.0, 40.0, 80.0],
                                            "hardware.preset": ["h100", "h200"]}, n=16, with_inputs=False),
          "point": lambda: make_result(n=80)}[kind]()
    from mcsim.results import report

    layout = _Layout(ds)
    # every quantity's distribution (each its own range of values and ticks) for one point; on grids, where each
    # distribution figure shows every point, the three of the sensitivity figures and the two of the load curves
    names = ["gross_margin", "cost_usd_per_mtok", "decode_tok_s_per_gpu", "ttft_s", "expert_efficiency",
             "cache_hit_rate_by_tier", "slo_attainment", "queue_wait_s"]
    quantities = report._series(ds, names if kind == "point" else [*names[:4], "slo_attainment"])
    _, focus = report._sensitivity_rows(ds, layout, quantities[:3])
    figures = build_figures(ds, layout, quantities, quantities[:3], focus,
                            lambda labels: [s for s in quantities if s.label in labels])
    drawn = [item for items in figures.values() for item in items]
    expected = {"ablation": {"distributions", "paired", "tornado", "waterfall"},
                "sweep": {"distributions", "paired", "tornado", "heatmap"},
                "load": {"distributions", "paired", "heatmap", "load"},
                "point": {"distributions", "tornado"}}[kind.split("-")[0]]
    assert {k for k, v in figures.items() if v} == expected
    for name, fig in drawn:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        texts, ticks = _drawn_texts(fig)
        for text in texts:
            extent = text.get_window_extent(renderer)
            assert _inside(box, extent), (name, text.get_text(), extent, box)
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                labels = ticks[id(axis)]
                extents = [t.get_window_extent(renderer) for t in labels]
                for (a, ea), (b, eb) in itertools.combinations(zip(labels, extents), 2):
                    assert not ea.overlaps(eb), (name, a.get_text(), b.get_text())
    assert len(drawn) >= 8 if kind == "point" else len(drawn) >= 6


def test_heatmap_of_a_narrow_range_is_relative_and_every_panel_drawn():
    ds = make_result(grid={"a.x": [1, 2, 3], "b.y": [10.0, 20.0], "hardware.preset": ["h100", "h200"]}, n=9,
                     with_inputs=False)
    cost = 2.0 * (1 + 0.002 * np.arange(12).reshape(3, 2, 2, 1)) * np.ones((1, 1, 1, 9))
    ds["cost_usd_per_mtok"] = (("a_x", "b_y", "hardware_preset", "sample"), cost, attrs_for("cost_usd_per_mtok"))
    ds["feasible"][:] = 1
    layout = _Layout(ds)
    (name, fig), = build_figures(ds, layout, [Series("cost_usd_per_mtok", "cost_usd_per_mtok")], [], {})["heatmap"]
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert [ax.get_title() for ax in panels] == ["hardware.preset = h100", "hardware.preset = h200"]
    colourbar = next(ax for ax in fig.axes if ax not in panels)
    label = " ".join(colourbar.get_ylabel().split())
    assert "% relative to 2.02 USD/Mtok" in label  # the median of the 12 cells: 2 x (1 + 0.002 x 5.5)
    # the cells still print the medians themselves, in the metric's units
    texts = sorted(float(t.get_text()) for ax in panels for t in ax.texts if "unsteady" not in t.get_text())
    np.testing.assert_allclose(texts, sorted(2.0 * (1 + 0.002 * k) for k in range(12)), rtol=1e-3)
    assert "(GB" not in panels[0].get_xlabel() and panels[0].get_xlabel() == "b.y"


def test_labels_use_display_units_when_units_are_cf():
    # CF-clean results carry units "1" for an amount of money per token and the readable form in display_units
    ds = make_result(grid={"cache_dram_gb_per_node": [0.0, 512.0]}, n=8, with_inputs=False)
    ds["cost_usd_per_mtok"].attrs.update(units="1", display_units="USD/Mtok")
    ds["cache_dram_gb_per_node"].attrs.update(path="cache.dram_gb_per_node", units="Gbyte", display_units="GB")
    (name, fig), = build_figures(ds, _Layout(ds), [Series("cost_usd_per_mtok", "cost_usd_per_mtok")], [],
                                 {})["distributions"]
    assert fig.axes[0].get_ylabel() == "cost per million output tokens (USD/Mtok)"
    assert fig.axes[0].get_xlabel() == "cache.dram_gb_per_node (GB)"


def marked_result(n=10):
    """baseline/factory runs with known flags: factory samples 0-2 and baseline 5 and 9 not at steady state;
    factory sample 9 infeasible (SLO not met). Drawn: 19 runs, 5 unsteady; pairs: 9 compared, 4 unsteady."""
    ds = make_result(variants=["baseline", "factory"], n=n, seed=8)
    ds["feasible"][:] = 1
    ds["feasible"][1, 9] = 0
    ds["steady_state"][:] = 1
    ds["steady_state"][1, [0, 1, 2]] = 0
    ds["steady_state"][0, [5, 9]] = 0
    reason = np.zeros((2, n), dtype=np.int8)
    reason[1, 9] = FEASIBLE_REASONS.index("SLO not met")
    ds["infeasible_reason"] = (("variant", "sample"), reason)
    for name in ("cost_usd_per_mtok", "decode_tok_s_per_gpu"):  # infeasible samples carry NaN, as results do
        ds[name][1, 9] = np.nan
    return ds


def _hollow_points(ax):
    return sum(len(line.get_xdata()) for line in ax.get_lines() if line.get_markerfacecolor() == "none")


def _words(fig):
    return " ".join(fig.get_suptitle().split())


def test_log_axes_are_labelled_in_plain_numbers():
    # the factory costs 0.001-1 x the baseline: both the distribution and the paired ratios are drawn on log axes
    ds = make_result(variants=["baseline", "factory"], n=12, seed=2, with_inputs=False)
    cost = ds["cost_usd_per_mtok"].values.copy()
    cost[1] = cost[0] * np.geomspace(1e-3, 1, 12)
    ds["cost_usd_per_mtok"] = (("variant", "sample"), cost, attrs_for("cost_usd_per_mtok"))
    ds["feasible"][:] = 1
    figures = build_figures(ds, _Layout(ds), [Series("cost_usd_per_mtok", "cost_usd_per_mtok")], [], {})
    logs = 0
    for name, fig in figures["distributions"] + figures["paired"]:
        with matplotlib.rc_context({"text.parse_math": False}):  # as the report draws and saves them
            fig.canvas.draw()
        for axis in (a for ax in fig.axes for a in (ax.xaxis, ax.yaxis) if a.get_scale() == "log"):
            logs += 1
            lo, hi = sorted(axis.get_view_interval())
            shown = [(t.get_loc(), t.label1.get_text()) for t in axis.get_major_ticks() + axis.get_minor_ticks()
                     if lo <= t.get_loc() <= hi and t.label1.get_text()]
            assert len(shown) >= 2, (name, shown)
            for loc, text in shown:  # plain numbers, each the value at its tick: no mathtext left unparsed
                assert "$" not in text and "mathdefault" not in text, (name, text)
                assert float(text.replace(",", "")) == pytest.approx(loc, rel=1e-9), (name, text)
    assert logs == 2
    assert [log_tick_text(x) for x in (0.002, 0.5, 1.0, 20.0, 3000.0, 1e-6, 2e7)] == [
        "0.002", "0.5", "1", "20", "3,000", "10\u207b\u2076", "2\u00d710\u2077"]


def test_unsteady_and_infeasible_samples_marked_on_distributions_and_pairs():
    ds = marked_result()
    layout = _Layout(ds)
    cost = Series("cost_usd_per_mtok", "cost_usd_per_mtok")
    figures = build_figures(ds, layout, [cost, Series("decode_tok_s_per_gpu", "decode_tok_s_per_gpu")], [], {})
    fig = dict(figures["distributions"])["dist_cost_usd_per_mtok.png"]
    (legend,) = fig.legends  # below the plots
    assert [t.get_text() for t in legend.get_texts()] == ["sample", "not at steady state (5 of 19)"]
    assert _hollow_points(fig.axes[0]) == 5
    assert "1 of 20 samples infeasible, left out (SLO not met: 1)" in _words(fig)
    (name, fig), = figures["paired"]
    (legend,) = fig.legends  # both panels count the same pairs: one legend, below them
    assert [t.get_text() for t in legend.get_texts()] == ["sample", "not at steady state (4 of 9)"]
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert [_hollow_points(ax) for ax in fig.axes] == [4, 4]
    assert "1 of 10 pairs with an infeasible side, left out (SLO not met: 1 runs)" in _words(fig)
    rows, hidden = paired(ds, layout, cost, "variant")
    assert hidden == 1 and rows[0]["unsteady"].tolist() == [True, True, True, False, False, True, False, False, False]
    # the waterfall and the tornado aggregate: their subtitles count (a sample infeasible anywhere counts as that)
    _, fig, _ = waterfall_figure(ds, layout, "cost_usd_per_mtok")
    assert "1 of 10 samples infeasible in some variant" in _words(fig)
    assert "4 of 10 samples not at steady state in some variant (kept" in _words(fig)
    result = {"inputs": ["efficiency.fused_kernel_gain"], "prcc": np.array([0.5]), "low": np.array([0.2]),
              "high": np.array([0.7]), "spearman": np.array([0.4]), "sobol": np.array([np.nan]), "samples": 9}
    _, fig = tornado(ds, layout, cost, result)  # at the factory variant: samples 0-2 unsteady, 9 infeasible
    assert "1 of 10 samples infeasible, left out (SLO not met: 1)" in _words(fig)
    assert "3 of 9 samples not at steady state (kept" in _words(fig)


def test_unsteady_and_infeasible_samples_counted_on_heatmaps_and_load_curves():
    rates, dram = [1.0, 2.0, 4.0], [0.0, 512.0]
    ds = make_result(grid={"workload.rate_rps": rates, "cache.dram_gb_per_node": dram}, n=6, seed=9,
                     with_inputs=False)
    ds["feasible"][:] = 1
    ds["feasible"][2, 1, :2] = 0  # rate 4, 512 GB: two infeasible samples
    ds["steady_state"][:] = 1
    ds["steady_state"][2, :, 3:] = 0  # rate 4: samples 3-5 unsteady at both DRAM sizes
    ds["steady_state"][0, 0, 0] = 0
    for name in ("cost_usd_per_mtok", "slo_attainment"):
        ds[name][2, 1, :2] = np.nan
    layout = _Layout(ds)
    series = [Series("cost_usd_per_mtok", "cost_usd_per_mtok"), Series("slo_attainment", "slo_attainment")]
    figures = build_figures(ds, layout, series, [], {})
    fig = dict(figures["heatmap"])["heatmap_cost_usd_per_mtok.png"]
    marks = sorted((round(t.get_position()[0]), round(t.get_position()[1]), t.get_text())
                   for t in fig.axes[0].texts if "unsteady" in t.get_text() or "infeasible" in t.get_text())
    assert marks == [(0, 0, "1 unsteady"), (0, 2, "3 unsteady"), (1, 2, "3 unsteady\n2 infeasible")]
    assert "2 of 36 samples infeasible, left out" in _words(fig)
    assert "7 of 34 samples not at steady state (kept" in _words(fig)
    (_, fig), = figures["load"]
    ax = fig.axes[0]
    hollow = {(colour, x) for line in ax.get_lines() if line.get_markerfacecolor() == "white"
              for colour in ("C0", "C1") if same_color(line.get_markeredgecolor(), colour) for x in line.get_xdata()}
    assert hollow == {("C0", 1.0), ("C0", 4.0), ("C1", 4.0)}  # C0: 0 GB, C1: 512 GB
    assert "some samples not at steady state (7 of 34 in all)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert "2 of 36 samples infeasible, left out" in _words(fig)
