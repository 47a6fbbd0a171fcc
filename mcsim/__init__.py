"""mcsim: a Monte Carlo laboratory for the economics of serving large language models."""

__version__ = "0.1.0"
