"""The benchmark report: the plain-text table and the PNG of the scaling curves."""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from mcsim.text import si

#: The end-to-end targets (benchmarks/README.md): seconds of one sample per million requests, every stage on, and
#: the parallel efficiency of a sweep from 1 to 2 workers.
END_TO_END_S_PER_M = 1.0
PARALLEL_EFFICIENCY = 0.95

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _ratio(value) -> str:
    return "-" if value is None else (f"{value:,.0f}x" if value >= 10 else f"{value:.1f}x")


def format_table(result: dict) -> str:
    """The report as plain text: kernels, scaling, performance targets."""
    m = result["machine"]
    lines = [(f"mcsim bench ({result['suite']}): {m['processor']}, {m['cpu_count']} cores, Python {m['python']}, "
              f"NumPy {m['numpy_version']}, Numba {m['numba_version']}; load {m['load_average_1min']:.2f} at start; "
              f"{result['seconds']:.0f} s"),
             "throughput per second on one thread; ratios against references measured in this run", ""]
    lines += format_kernels(result["kernels"])
    lines += format_scaling(result["scaling"])
    previous = result.get("against_previous")
    if previous and previous["rows"]:
        lines += ["", f"against the run before in this folder ({previous['created']}; > 1x: faster now):"]
        lines += [f"  {r['figure']}: {r['speedup']:.2f}x ({r['before']:.4g} -> {r['now']:.4g})"
                  for r in previous["rows"]]
    lines += ["", "Performance targets (benchmarks/README.md):"]
    for t in result["targets"]:
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"  {verdict:>12}  {t['target']}: {t['figure']}")
    if result.get("paths"):
        lines += [""] + [f"wrote {p}" for p in result["paths"].values()]
    return "\n".join(lines)


def format_kernels(rows: list[dict]) -> list[str]:
    """Lines of the kernel table: throughput per second of the kernel and its references, ratios, targets."""
    lines = []
    header = ("kernel", "unit", "kernel/s", "reference/s", "ratio", "NumPy/s", "ratio", "target")
    table = [header]
    for r in rows:
        target = r["target"]
        table.append((r["name"], r["unit"], si(r["fast"]), si(r["reference"]), _ratio(r["ratio"]),
                      "-" if r["numpy"] is None else si(r["numpy"]), _ratio(r["ratio_numpy"]),
                      "-" if target is None else f"{'met' if target['met'] else 'NOT met'} ({target['figure']})"))
    if len(table) > 1:
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        right = {2, 3, 4, 5, 6}
        for row in table:
            lines.append("  ".join(c.rjust(w) if i in right else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return lines


def format_scaling(sc: dict) -> list[str]:
    """Lines of the scaling report (any of its parts may be missing)."""
    lines = []
    if sc.get("routing"):
        rows = sc["routing"]["rows"]
        lines += ["", "least-outstanding routing (tournament tree) vs round-robin, us per simulated request, 80 % load "
                      "per instance:"]
        for r in rows:
            lines.append(f"  {r['instances']:>4} instances ({r['requests']:,} requests): least-outstanding "
                         f"{r['least-outstanding'] * 1e6:.2f}, round-robin {r['round-robin'] * 1e6:.2f}")
        lines.append(f"  largest / smallest fleet: {sc['routing']['ratio']:.2f}x (round-robin "
                     f"{sc['routing']['ratio_round_robin']:.2f}x)")
    if sc.get("small"):
        ph, c = sc["small"]["phases"], sc["small"].get("command")
        head = f"a small run, {ph['requests']:,} requests of dense-node, process start to file"
        lines += ["", head + (f": {c['cpu_s']:.2f} s of CPU, {c['wall_s']:.2f} s wall (mcsim run, best of "
                              f"{len(c['runs_cpu_s']) - 1})" if c else ":")]
        parts = ", ".join(f"{name} {ph[key]:.3f}" for name, key in (
            ("interpreter", "interpreter_s"), ("imports", "imports_s"), ("scenario", "scenario_s"),
            ("Numba's runtime", "numba_runtime_s"), ("kernel load", "kernel_load_s"), ("simulate", "simulate_s"),
            ("assemble", "assemble_s"), ("write", "write_s")) if key in ph)
        lines.append(f"  CPU s by phase (one process): {parts}; total {ph['total_s']:.2f} s = "
                     f"{ph['ratio_to_simulate']:.0f}x the simulation alone")
    for key, label in (("requests", "one sample, every stage on (bench-factory scenario, 64-token blocks)"),
                       ("requests_light", "one sample, 512-token blocks")):
        if sc.get(key):
            pinned = all(r.get("cores") == 1 for r in sc[key] if "skipped" not in r)
            lines += ["", f"{label}, {'on one core' if pinned else 'on every core the process had'}:"]
            for r in sc[key]:
                if "skipped" in r:
                    lines.append(f"  {r['requests']:>12,} requests: skipped ({r['skipped']})")
                else:
                    lines.append(f"  {r['requests']:>12,} requests: {r['seconds']:7.2f} s "
                                 f"({si(r['requests_per_s'])} requests/s; first call {r['first_call_s']:.2f} s), "
                                 f"peak memory +{r['peak_memory_mib']:,.0f} MiB")
    if sc.get("grid"):
        g = sc["grid"]
        lines += ["", f"sweep on one worker, {g['samples']} samples x {g['requests']:,} requests per grid point:"]
        for r in g["rows"]:
            lines.append(f"  {r['points']:>3} points ({r['tasks']:>3} tasks): {r['seconds']:6.2f} s, "
                         f"peak memory +{r['peak_memory_mib']:,.0f} MiB")
        lines.append(f"  {g['seconds_per_point']:.2f} s per grid point, {g['fixed_seconds']:.2f} s fixed (fit)")
    if sc.get("workers"):
        w = sc["workers"]
        lines += ["", (f"parallel efficiency, {w['points']} grid points x {w['samples']} samples x "
                       f"{w['requests']:,} requests ({w['tasks']} tasks):")]
        names = {"threads": "Dask threads", "processes": "Dask processes",
                 "independent": "independent processes, no Dask (the machine's ceiling)"}
        for kind in ("threads", "processes", "independent"):
            if kind in w:
                figures = ", ".join(f"{n}: {s:.2f} s ({100 * e:.0f} %)" for n, s, e in
                                    zip(w["workers"], w[kind]["seconds"], w[kind]["efficiency"]))
                lines.append(f"  {names[kind]}: {figures}")
    if sc.get("overhead"):
        o = sc["overhead"]
        lines += ["", (f"Dask per task ({o['tasks']} tasks of one {o['requests']}-request sample, one worker): "
                       f"{o['overhead_ms_per_task']:.2f} ms ({o['dask_s'] / o['direct_s']:.2f}x a plain loop)")]
    if sc.get("frontier"):
        d = sc["frontier"]
        lines += ["", (f"the frontier day (scenarios/frontier-day.toml), one sample of {d['requests']:,} requests, "
                       f"one worker, fresh process: {d['seconds']:.1f} s ({si(d['requests_per_s'])} requests/s), "
                       f"peak RSS {d['peak_rss_mib'] / 1024:.2f} GiB")]
    if sc.get("compile"):
        lines += ["", "Numba, fresh process:"]
        for kind, label in (("compiled", "cache off (compiles)"), ("cached", "on-disk cache (loads)")):
            if kind in sc["compile"]:
                c = sc["compile"][kind]
                stages = ", ".join(f"{k} {v:.1f} s" for k, v in c["stages_s"].items())
                lines.append(f"  {label}: {c['total_s']:.1f} s = import {c['import_s']:.1f} s + {stages} + "
                             f"engine {c['engine_s']:.1f} s")
    return lines


def scaling_png(result: dict) -> bytes:
    """The scaling curves as a PNG (matplotlib Figure on an Agg canvas; no pyplot state)."""
    sc = result["scaling"]
    fig = Figure(figsize=(12, 8.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2)
    m = result["machine"]
    fig.suptitle(f"mcsim bench ({result['suite']}): {m['processor']}, {m['cpu_count']} cores")

    ax_time, ax_mem = axes[0]
    measured = [r for key in ("requests", "requests_light") for r in (sc.get(key) or []) if "seconds" in r]
    where = "one core" if measured and all(r.get("cores") == 1 for r in measured) else "every core it had"
    for key, label, marker in (("requests", "64-token blocks", "o"), ("requests_light", "512-token blocks", "s")):
        rows = [r for r in (sc.get(key) or []) if "seconds" in r]
        if not rows:
            continue
        n = [r["requests"] for r in rows]
        line, = ax_time.plot(n, [r["seconds"] for r in rows], marker=marker, label=f"{label}, best call")
        ax_time.plot(n, [r["first_call_s"] for r in rows], marker=marker, linestyle="--", color=line.get_color(),
                     alpha=0.6, label=f"{label}, first call")
        ax_mem.plot(n, [max(r["peak_memory_mib"], 0.1) for r in rows], marker=marker, label=label)
    ax_time.plot([1e6], [END_TO_END_S_PER_M], marker="*", markersize=12, linestyle="none", color="grey",
                 label=f"target: 1 M requests in <= {END_TO_END_S_PER_M:g} s")
    for ax, ylabel, title in ((ax_time, "seconds per sample", f"Cost of one sample (every stage on, {where})"),
                              (ax_mem, "peak memory growth, MiB", "Peak memory of one sample")):
        ax.set(xscale="log", yscale="log", xlabel="requests per sample", ylabel=ylabel, title=title)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: si(v)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.grid(True, which="both", alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize="small")

    ax_grid, ax_eff = axes[1]
    grid = sc.get("grid")
    if grid:
        points = [r["points"] for r in grid["rows"]]
        ax_grid.plot(points, [r["seconds"] for r in grid["rows"]], marker="o", label="sweep, one worker")
        fit = [grid["fixed_seconds"] + grid["seconds_per_point"] * p for p in points]
        ax_grid.plot(points, fit, linestyle=":", color="grey",
                     label=f"fit: {grid['seconds_per_point']:.2f} s/point + {grid['fixed_seconds']:.2f} s")
        ax_mem_grid = ax_grid.twinx()
        ax_mem_grid.plot(points, [r["peak_memory_mib"] for r in grid["rows"]], marker="s", color="tab:red",
                         label="peak memory growth")
        ax_mem_grid.set_ylabel("peak memory growth, MiB", color="tab:red")
        ax_mem_grid.set_ylim(bottom=0)
        handles = ax_grid.get_legend_handles_labels()[0] + ax_mem_grid.get_legend_handles_labels()[0]
        ax_grid.legend(handles=handles, fontsize="small", loc="lower right")
        ax_grid.set_xticks(points)
        ax_grid.set_title(f"Cost of a sweep ({grid['samples']} samples x {grid['requests']:,} requests per point)")
    else:
        ax_grid.set_title("Cost of a sweep (not measured)")
    ax_grid.set(xlabel="grid points", ylabel="seconds")
    ax_grid.set_ylim(bottom=0)
    ax_grid.grid(True, alpha=0.3)

    workers = sc.get("workers")
    if workers:
        labels = {"threads": "Dask threads", "processes": "Dask processes",
                  "independent": "independent processes (ceiling)"}
        for kind, marker in (("threads", "o"), ("processes", "s"), ("independent", "^")):
            if kind in workers:
                ax_eff.plot(workers["workers"], [100 * e for e in workers[kind]["efficiency"]], marker=marker,
                            label=labels[kind])
        ax_eff.set_xticks(workers["workers"])
        ax_eff.legend(fontsize="small", loc="lower left")
    ax_eff.axhline(100 * PARALLEL_EFFICIENCY, color="grey", linestyle=":")
    ax_eff.set(xlabel="workers", ylabel="parallel efficiency t(1) / (n t(n)), %", ylim=(0, 110),
               title=f"Parallel efficiency of a sweep (target: {100 * PARALLEL_EFFICIENCY:g} % at 2 workers)")
    ax_eff.grid(True, alpha=0.3)

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
