"""The bundled scenarios, installed as package data of ``mcsim.scenarios`` (see :func:`mcsim.scenario.bundled`)."""
