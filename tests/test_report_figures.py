"""The report's figures: waterfalls in the metric's units, paired comparisons, load curves, focus, layout.

References are plain Python (loops, sorted lists), never the figure code's own helpers.
"""

import itertools
import math

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from mcsim.cli import main
from mcsim.results.figures import build_figures
from mcsim.results.figures.paired import paired
from mcsim.results.figures.tornado import s1_text
from mcsim.results.figures.waterfalls import bars, waterfall_figure
from mcsim.results.layout import ReportError, Series, _Layout
from mcsim.results.report import write_report
from mcsim.results.variables import attrs_for
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
    lines = [line for line in ax.get_lines() if len(line.get_xdata()) == 3]
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
    assert "4 of 20 infeasible samples left out" in " ".join(fig.get_suptitle().split())
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
    quantities = report._series(ds, ["gross_margin", "cost_usd_per_mtok", "decode_tok_s_per_gpu", "ttft_s",
                                     "expert_efficiency", "cache_hit_rate_by_tier", "slo_attainment", "queue_wait_s"])
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
    assert len(drawn) >= 8


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
    texts = sorted(float(t.get_text()) for ax in panels for t in ax.texts)
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
