"""The best configuration under uncertainty: ``mcsim search`` and :func:`mcsim.search`.

A search explores a configuration space (grid axes, as a sweep's) on common random numbers and returns the
*robust optimum*: the candidate whose objective at a quantile over the Monte Carlo samples is best among those that
meet every constraint with probability >= a confidence over the samples (infeasible samples count as constraint
failures). It races the candidates (:mod:`~mcsim.optimize.racing`): few samples for all of them, more for those
that could still be the robust optimum, by the rule in :func:`mcsim.optimize.criteria.decide`.

- :mod:`~mcsim.optimize.criteria` -- objective, constraints, the robust optimum, the racing rule, regret (NumPy);
- :mod:`~mcsim.optimize.racing` -- the rounds on Dask, resumable parts (the sweep executor's);
- :mod:`~mcsim.optimize.api` -- :func:`search`, what the CLI calls.
"""
