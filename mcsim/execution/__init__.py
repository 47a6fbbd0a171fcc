"""Running scenarios: one sample (:mod:`~mcsim.execution.sample`), the Dask fan-out (:mod:`~mcsim.execution.executor`)
and the Python API (:mod:`~mcsim.execution.api`)."""
