"""mcsim: a Monte Carlo laboratory for the economics of serving large language models.

Importing the package compiles nothing; the Python API is loaded on first use:

- :func:`mcsim.run` — run a scenario, return the result :class:`xarray.Dataset`;
- :func:`mcsim.compare` — baseline vs factory on identical draws (a ``variant`` dim);
- :func:`mcsim.sweep` — a grid of parameter values on Dask;
- :func:`mcsim.search` — the robust optimum of a configuration space, by racing its candidates on samples;
- :func:`mcsim.capacity` — the highest arrival rate a deployment serves within its SLOs, per sample;
- :func:`mcsim.step_time` — one step of one instance, op by op, and the memory of each pool;
- :func:`mcsim.load_scenario` — read and validate a scenario file;
- :func:`mcsim.sel` — select a result by dotted scenario paths (``mcsim.sel(ds, "hardware.preset", "h200")``).
"""

import importlib

__version__ = "0.1.0"

_LAZY = {
    "run": ("mcsim.execution.api", "run"),
    "compare": ("mcsim.execution.api", "compare"),
    "sweep": ("mcsim.execution.api", "sweep"),
    "search": ("mcsim.optimize.api", "search"),
    "capacity": ("mcsim.optimize.capacity", "capacity"),
    "open_results": ("mcsim.execution.api", "open_results"),
    "step_log": ("mcsim.execution.api", "step_log"),
    "step_time": ("mcsim.execution.api", "step_time"),
    "load_scenario": ("mcsim.scenario", "load_scenario"),
    "sel": ("mcsim.results.names", "sel"),
    "dataset_name": ("mcsim.results.names", "dataset_name"),
    "ScenarioError": ("mcsim.scenario", "ScenarioError"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'mcsim' has no attribute {name!r}")
