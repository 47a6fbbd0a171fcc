"""Step-time models: the factor model, the roofline and its collectives and capacity, latency and batching."""
