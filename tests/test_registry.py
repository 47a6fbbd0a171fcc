"""The variable registry: every output that reaches a result Dataset is a registered variable."""

from __future__ import annotations

import pytest

from mcsim.results.dataset import rows_to_table
from mcsim.results.variables import FLAGS, REGISTRY, UnknownVariable, attrs_for, check_metrics, variable


def _metrics(**extra) -> dict:
    return {**{name: 0.0 for name in REGISTRY}, "infeasible_reason": "ok", **extra}


def test_a_registered_variable_is_found():
    assert variable("ttft_s").units == "s"
    check_metrics(_metrics())
    assert set(FLAGS) == {"infeasible_reason"}


def test_an_unknown_variable_is_refused_with_the_nearest_names():
    with pytest.raises(UnknownVariable, match=r"'ttft' is not a registered output variable \(did you mean ttft_s"):
        variable("ttft")
    with pytest.raises(UnknownVariable, match="not a registered output variable"):
        attrs_for("no_such_metric")


def test_a_sample_with_an_unknown_metric_does_not_reach_the_dataset():
    rows = [{"factory": _metrics(ttft_p99_s=1.0), "__coords__": {"workload_class": ("chat",)}}]
    with pytest.raises(UnknownVariable, match="'ttft_p99_s' is not a registered output variable"):
        rows_to_table(rows, ("factory",))


def test_a_sample_missing_a_registered_metric_is_refused():
    metrics = _metrics()
    del metrics["gpu_hours"]
    with pytest.raises(KeyError, match="variant factory lacks the registered output"):
        rows_to_table([{"factory": metrics}], ("factory",))
