"""The benchmark suite that ``mcsim bench`` runs: every kernel against its references, and how a run scales.

* :mod:`mcsim.bench.kernels` — each compiled kernel against its pure-Python reference
  (:mod:`mcsim.reference`) and, where one is natural, a NumPy-vectorized reference;
* :mod:`mcsim.bench.scaling` — cost against requests per sample (with peak memory), against grid points,
  and against workers (parallel efficiency next to the machine's own ceiling), and Numba compile time;
* :mod:`mcsim.bench.run` — :func:`~mcsim.bench.run.run_suite` and :func:`~mcsim.bench.run.bench_command`
  (``mcsim bench``): a table, ``bench.json`` and ``scaling.png``, drawn by :mod:`mcsim.bench.report`.

Speed is claimed here, never in tests: every kernel figure is a ratio against references measured in the
same run, because absolute times on shared machines vary from run to run. Importing this package compiles
nothing and imports no kernel.
"""
