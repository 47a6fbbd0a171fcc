"""``mcsim calibrate``: measured files in, a calibration file out (what the command line calls; a notebook can too).

Example
-------
>>> from mcsim.calibration.vidur import bundled_collectives
>>> cal, fits = calibrate([bundled_collectives("h100_dgx", "all_reduce")], hardware="h100", replicates=5)
>>> sorted(cal.parameters)  # doctest: +NORMALIZE_WHITESPACE
['hardware.allreduce_bus_gb_s', 'hardware.collective_base_us', 'hardware.collective_hop_us',
 'performance.allreduce_error']
"""

from __future__ import annotations

from pathlib import Path

from mcsim.calibration import fit as fitting
from mcsim.calibration import measurements
from mcsim.calibration.files import Calibration, CalibrationError, build
from mcsim.scenario.calibration_file import SURFACE_KEYS
from mcsim.calibration.vidur import MeasurementError
from mcsim.calibration import aiconfigurator
from mcsim.scenario import catalog

#: Fitting order: the step class is fitted last, on top of the others' point fits.
ORDER = ("gemm", "elementwise", "allreduce", "allreduce_nodes", "send", "attention", "experts", "experts_fp8",
         "experts_fp4", "mla", "step")
DTYPES = ("fp32", "bf16", "fp8", "fp4")


def infer_hardware(paths) -> str | None:
    """The hardware preset named by the files' folders (Vidur's ``h100``, ``h100_dgx``, ``a100_pairwise_nvlink``)."""
    names = set(catalog.hardware())
    found = set()
    for path in paths:
        for part in Path(path).resolve().parts:
            head = part.split("_", 1)[0].lower()
            if head in names:
                found.add(head)
    return found.pop() if len(found) == 1 else None


def calibrate(paths, *, hardware: str | None = None, dtype: str = "bf16", stack: str = "", stack_version: str = "",
              replicates: int = 200, seed: int = 0, cross_validation: bool = True,
              command: str = "") -> tuple[Calibration, list]:
    """Fit every op class the files measure; returns the calibration and the :class:`~.fit.ClassFit` list.

    Raises :class:`~mcsim.calibration.vidur.MeasurementError` for a file it cannot read and
    :class:`~mcsim.calibration.files.CalibrationError` when the hardware is unknown or ambiguous.
    """
    if not paths:
        raise CalibrationError("mcsim calibrate", "no measurement files given")
    if dtype not in DTYPES:
        raise CalibrationError("--dtype", f"expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if replicates < 2:
        raise CalibrationError("--replicates", f"expected at least 2 bootstrap replicates, got {replicates}")
    kinds = {Path(p): measurements.kind_of(p) for p in paths}
    step_hw = set()
    for path, kind in kinds.items():
        if kind == "steps":
            step_hw |= {row["hardware"] for row in measurements.read_steps(path)}
    if hardware is None:
        hardware = infer_hardware([p for p, k in kinds.items() if k != "steps"])
        if hardware is None and len(step_hw) == 1:
            hardware = next(iter(step_hw))
        if hardware is None:
            raise CalibrationError("mcsim calibrate", "cannot tell which hardware was measured from the file "
                                   "names; give --hardware NAME (one of " + ", ".join(sorted(catalog.hardware()))
                                   + ")")
    if hardware not in catalog.hardware():
        raise CalibrationError("--hardware", f"unknown hardware preset {hardware!r}; known: "
                               + ", ".join(sorted(catalog.hardware())))
    named = infer_hardware([p for p, k in kinds.items() if k != "steps"])
    if named is not None and named != hardware:
        raise CalibrationError("--hardware", f"{hardware!r}, but the files' folders say they were measured on "
                               f"{named!r}: a calibration holds for the GPU measured (give --hardware {named}, or "
                               "files measured on this one)")
    if step_hw - {hardware}:
        raise CalibrationError("mcsim calibrate", f"the step CSV measures {', '.join(sorted(step_hw))}, the "
                               f"calibration is for {hardware}: one calibration holds for one hardware")
    hw = catalog.hardware_preset(hardware)
    parts = {cls: [] for cls in ORDER}
    for path, kind in kinds.items():
        if kind == "vidur-mlp":
            gemm, elementwise = measurements.linear_observations(path, hw, dtype)
            parts["gemm"].append(gemm)
            parts["elementwise"].append(elementwise)
        elif kind == "vidur-all_reduce":
            parts["allreduce"].append(measurements.allreduce_observations(path))
            nodes = measurements.allreduce_node_observations(path, int(hw["gpus_per_node"]))
            if nodes is not None:
                parts["allreduce_nodes"].append(nodes)
        elif kind == "vidur-send_recv":
            parts["send"].append(measurements.send_observations(path))
        elif kind.startswith("aiconfigurator-"):
            if kind == "aiconfigurator-moe" and dtype not in aiconfigurator.EXPERTS_CLASSES:
                raise CalibrationError("--dtype", f"a fused MoE table is fitted for bf16, fp8 (block-scaled) or fp4 "
                                       f"(NVFP4) experts, not {dtype}")
            columns, what, observe = {
                "aiconfigurator-gemm": (aiconfigurator.COLUMNS, "a GEMM table",
                                        lambda t: aiconfigurator.gemm_observations(
                                            t, hw, aiconfigurator.TABLE_DTYPE[dtype], source=str(path))),
                "aiconfigurator-attention": (aiconfigurator.ATTENTION_COLUMNS, "an attention table",
                                             lambda t: aiconfigurator.attention_observations(t, hw, source=str(path))),
                "aiconfigurator-mla": (aiconfigurator.MLA_COLUMNS, "an MLA module table",
                                       lambda t: aiconfigurator.mla_observations(t, hw, source=str(path))),
                "aiconfigurator-moe": (aiconfigurator.MOE_COLUMNS, "a fused MoE table",
                                       lambda t: aiconfigurator.experts_observations(t, hw, dtype, source=str(path))),
                "aiconfigurator-nccl": (aiconfigurator.NCCL_COLUMNS, "an NCCL table",
                                        lambda t: aiconfigurator.nccl_allreduce_observations(t, source=str(path))),
            }[kind]
            try:
                obs = observe(aiconfigurator.read_table(path, columns, what))
            except ValueError as err:  # one line naming the file, whatever the reader or the fit refused
                raise MeasurementError(str(err) if str(err).startswith(str(path)) else f"{path}: {err}") from None
            parts[obs.cls].append(obs)
    fits = []
    for cls in ORDER[:-1]:
        if parts[cls]:
            fits.append(fitting.fit_class(measurements.concat(parts[cls]), replicates=replicates, seed=seed,
                                          cross_validation=cross_validation))
    step_files = [p for p, k in kinds.items() if k == "steps"]
    if step_files:
        values = _point_values(fits)
        obs = measurements.concat([measurements.step_observations(p, dtype, values) for p in step_files])
        fits.append(fitting.fit_class(obs, replicates=replicates, seed=seed, cross_validation=cross_validation))
    regime = {"hardware": hardware, "dtype": dtype, "fidelity": "roofline", "stack": stack,
              "stack_version": stack_version}
    source = command or ("mcsim calibrate " + " ".join(str(p) for p in paths) + f" --hardware {hardware}")
    return build(fits, regime, source=source, seed=seed), fits


def _point_values(fits) -> dict:
    """The point fits as scenario values (SI units for ``performance.*`` keys, the catalog's for ``hardware.*``)."""
    return {key: f.estimate[key] * fitting.scenario_scale(key) for f in fits for key in f.keys
            if not key.endswith("_error")}


def report(cal: Calibration) -> str:
    """What ``mcsim calibrate`` prints: per class its fit and cross-validated error, then every parameter."""
    lines = [f"calibration for {cal.regime['hardware']}, {cal.regime['dtype']} matmuls, roofline fidelity"
             + (f", {cal.regime['stack']} {cal.regime['stack_version']}".rstrip() if cal.regime.get("stack") else "")
             + f"; {cal.replicates} bootstrap replicates over shapes", ""]
    header = ("op class", "rows", "shapes", "fit MAPE", "cross-validated MAPE", "cross-validation")
    rows = [(cls, str(c["rows"]), str(c["shapes"]), f"{100 * c['fit_mape']:.1f} %",
             "-" if c["cv_mape"] != c["cv_mape"] else f"{100 * c['cv_mape']:.1f} %", c["cv_scheme"])
            for cls, c in cal.classes.items()]
    lines += _table(header, rows)
    lines.append("")
    banded = {cls: c["cv_bands"] for cls, c in cal.classes.items() if c.get("cv_bands")}
    for cls, bands in banded.items():
        unit = "rows" if cls == "gemm" else "tokens"
        lines.append(f"{cls}, cross-validated MAPE by {unit}: "
                     + ", ".join(f"{label.replace('rows', unit)} {100 * value:.1f} %"
                                 for label, value in bands.items()))
    for cls, table in cal.surfaces.items():
        what = ("each GEMM by its rows, columns and depth" if cls == "gemm"
                else "each MoE layer's routed experts by their width on the GPU, hidden size and tokens")
        lines.append(f"{cls}: the measured surface ({len(table['n'])} points, {len(set(zip(table['n'], table['k'])))} "
                     f"shapes) corrects {what} (mcsim.perf.gemm_surface); a scenario using this file takes it as "
                     + SURFACE_KEYS[cls])
    if banded or cal.surfaces:
        lines.append("")
    header = ("parameter", "estimate", "90 % interval", "class")
    rows = [(key, f"{p['estimate']:.4g}", f"{p['low']:.4g} .. {p['high']:.4g}", p["class"])
            for key, p in cal.parameters.items()]
    lines += _table(header, rows)
    lines.append("")
    lines.append("performance.<class>_error is the model's error against one measurement drawn at random (measured / "
                 "modelled): a run draws it with the parameters, so its bands include the model's spread.")
    return "\n".join(lines)


def _table(header, rows) -> list:
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows)]


__all__ = ["calibrate", "report", "infer_hardware", "MeasurementError"]
