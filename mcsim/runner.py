"""Fan samples out over Dask and gather one Dataset: :func:`run` and :func:`compare`.

Tasks are chunks of samples. Each sample draws its own inputs and random streams from (seed, sample index), so
results are bit-identical whatever the chunk size, number of workers or scheduler.
"""

from __future__ import annotations

import os

import numpy as np

from mcsim import results
from mcsim.scenario import Scenario, draw_uncertain, load_scenario


def _as_scenario(scenario, overrides) -> Scenario:
    if isinstance(scenario, Scenario):
        if not overrides:
            return scenario
        # Re-read the text with every override, so --set values get the same checks as the file's.
        return load_scenario(scenario.source, overrides=[*scenario.overrides, *overrides], text=scenario.text)
    return load_scenario(scenario, overrides=overrides)


def _chunk_task(scn: Scenario, variants: tuple, indices: np.ndarray, seed: int, n_requests: int, n_samples: int):
    from mcsim.engine import simulate_sample

    draws = draw_uncertain(scn, indices, seed, n_samples=n_samples)
    rows = []
    for j, sample in enumerate(indices):
        rows.append(simulate_sample(scn, variants, int(sample), seed, n_requests,
                                    {k: float(v[j]) for k, v in draws.items()}))
    return rows


def _compile_kernels():
    """Compile (or load from the cache) every kernel in this process before threads start using them."""
    import mcsim.kernels.experts  # noqa: F401
    import mcsim.kernels.kv_tiers  # noqa: F401
    import mcsim.kernels.speculative  # noqa: F401


def simulate(scn: Scenario, variants=("factory",), samples: int | None = None, requests: int | None = None,
             seed: int | None = None, workers: int | None = None, chunk_size: int | None = None,
             progress: bool = False, command: str | None = None):
    """Run ``samples`` Monte Carlo samples of every variant and return the result Dataset.

    Parameters
    ----------
    scn : Scenario
    variants : tuple of str
    samples, requests, seed : int, optional
        Override ``[mc]``.
    workers : int, optional
        Dask threads (default: the machine's cores).
    chunk_size : int, optional
        Samples per Dask task (default: about four tasks per worker).
    progress : bool
        Show a progress bar on stderr for runs that take more than a couple of seconds.
    """
    import dask

    samples = int(samples or scn["mc.samples"])
    requests = int(requests or scn["mc.requests"])
    seed = int(scn["mc.seed"] if seed is None else seed)
    workers = int(workers or os.cpu_count() or 1)
    if chunk_size is None:
        chunk_size = max(1, -(-samples // (4 * workers)))
    chunks = [np.arange(i, min(i + chunk_size, samples)) for i in range(0, samples, chunk_size)]
    _compile_kernels()
    tasks = [dask.delayed(_chunk_task, pure=False)(scn, tuple(variants), c, seed, requests, samples) for c in chunks]
    if progress:
        with _ProgressBar(len(tasks), samples):
            parts = dask.compute(*tasks, scheduler="threads", num_workers=workers)
    else:
        parts = dask.compute(*tasks, scheduler="threads", num_workers=workers)
    rows = [row for part in parts for row in part]
    draws = draw_uncertain(scn, np.arange(samples), seed, n_samples=samples)
    attrs = results.provenance(scn, seed, samples, requests, command, {"variants": " ".join(variants)})
    return results.build_dataset(rows, tuple(variants), draws, attrs)


def run(scenario, *, samples=None, requests=None, seed=None, overrides=(), workers=None, progress=False,
        output=None, force=False, command=None):
    """Run a scenario (file path or :class:`~mcsim.scenario.Scenario`) as written.

    Returns the result :class:`xarray.Dataset` (dims ``sample``, ``tier``, ``quantile``); writes it to ``output``
    as NetCDF when given.

    Examples
    --------
    >>> import mcsim
    >>> ds = mcsim.run("scenarios/factory.toml", samples=8, requests=2000)  # doctest: +SKIP
    >>> ds.gross_margin.quantile([0.05, 0.5, 0.95], dim="sample")  # doctest: +SKIP
    """
    scn = _as_scenario(scenario, overrides)
    ds = simulate(scn, ("factory",), samples, requests, seed, workers, progress=progress, command=command)
    if output is not None:
        results.write_netcdf(ds, output, force=force)
    return ds


def compare(scenario, *, samples=None, requests=None, seed=None, overrides=(), workers=None, progress=False,
            output=None, force=False, command=None):
    """Run ``baseline`` and ``factory`` on identical requests and draws; the Dataset has a ``variant`` dim."""
    scn = _as_scenario(scenario, overrides)
    ds = simulate(scn, ("baseline", "factory"), samples, requests, seed, workers, progress=progress, command=command)
    if output is not None:
        results.write_netcdf(ds, output, force=force)
    return ds


class _ProgressBar:
    """tqdm over finished Dask tasks; appears only when the run lasts more than two seconds."""

    def __init__(self, n_tasks: int, n_samples: int):
        from dask.callbacks import Callback
        from tqdm import tqdm

        self.bar = tqdm(total=n_tasks, desc="samples", unit="chunk", delay=2.0, leave=False)
        bar = self.bar

        class _CB(Callback):
            def _posttask(self, key, result, dsk, state, worker_id):
                if isinstance(key, tuple) or str(key).startswith("_chunk_task"):
                    bar.update(1)

        self.cb = _CB()

    def __enter__(self):
        self.cb.__enter__()
        return self

    def __exit__(self, *exc):
        self.cb.__exit__(*exc)
        self.bar.close()
