"""Results: the variable registry, the result dataset, summaries, reports and figures, sensitivity, attribution."""
