"""Calibration files of ``mcsim calibrate``: :func:`build` makes one from the fits of :mod:`mcsim.calibration.fit`.

The file format (reading, writing, the regime a calibration holds for) is :mod:`mcsim.scenario.calibration_file`,
since a scenario reads its calibration when it loads; its names are re-exported here.
"""

from __future__ import annotations

import numpy as np

from mcsim.calibration.fit import scenario_scale
from mcsim.scenario.calibration_file import (
    CHECKED,
    FORMAT,
    REGIME_KEYS,
    Calibration,
    CalibrationError,
    check_regime,
    dumps,
    load,
    new_calibration,
    parameter,
    regime_of,
    save,
)

__all__ = ["CHECKED", "FORMAT", "REGIME_KEYS", "Calibration", "CalibrationError", "build", "check_regime", "dumps",
           "load", "new_calibration", "parameter", "regime_of", "save"]


def build(fits, regime: dict, *, source: str, seed: int, notes: dict | None = None) -> Calibration:
    """A calibration from :class:`~mcsim.calibration.fit.ClassFit` objects (all with the same replicate count)."""
    parameters, classes, surfaces = {}, {}, {}
    for f in fits:
        for key in f.keys:
            scale = scenario_scale(key)
            parameters[key] = parameter(f.cls, np.asarray(f.replicates[key], float) * scale, f.estimate[key] * scale)
        classes[f.cls] = {"rows": f.rows, "shapes": f.shapes, "fit_mape": f.fit_mape, "cv_mape": f.cv_mape,
                          "cv_scheme": f.cv_scheme, "sources": f.sources}
        if f.cv_bands:
            classes[f.cls]["cv_bands"] = dict(f.cv_bands)
        if f.surface is not None:
            surfaces[f.cls] = f.surface.points()
    return new_calibration(regime, parameters, classes, source=source, seed=seed, notes=notes, surfaces=surfaces)
