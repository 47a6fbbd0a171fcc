"""mcsim validate: every check passes at quick sizes, the reports carry every column, failures set the exit code."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mcsim import validate
from mcsim.scenario import catalog
from mcsim.validate import Check, run_validation, validate_command

COLUMNS = ("check", "mcsim", "reference", "tolerance", "unit", "result", "source", "tolerance basis")


@pytest.fixture(scope="module")
def checks():
    return run_validation(quick=True)


def test_every_check_passes(checks):
    failed = [f"{c.name}: mcsim {c.mcsim} vs {c.reference} ± {c.tolerance} ({c.source})" for c in checks
              if not c.passed and not c.target]
    assert not failed, "\n".join(failed)


def test_fidelity_targets_are_reported_not_enforced(checks, tmp_path):
    targets = [c for c in checks if c.target]
    assert len(targets) == 86 and {c.result for c in targets} <= {"met", "missed"}
    assert all(c.result == ("met" if c.passed else "missed") for c in targets)


def test_the_checks_cover_every_stage(checks):
    names = [c.name for c in checks]
    assert len(names) == len(set(names))
    assert sum(name.startswith("Speculative tokens per pass") for name in names) >= 3
    for model in catalog.models():
        assert f"KV bytes/token BF16, {model}" in names
    for expected in ("Expert load, uniform routing: per-expert mean (worst of 64)",
                     "Expert load, uniform routing: per-expert variance",
                     "EPLB placement, README example layer 0: phy2log",
                     "EPLB placement, README example layer 1: phy2log",
                     "Mooncake trace: cache ratio, unlimited cache", "Mooncake trace: mean input",
                     "Azure 2023 code: mean input", "Azure 2023 conversation: mean output",
                     "Batching simulator: Little's law L / (lambda W), stable run",
                     "Batching simulator: one request at a time, E2E = sum of its step times",
                     "Fleet, 8 replicas, random routing at rho=0.7: mean queue wait",
                     "Fleet, 8 replicas, least-outstanding routing: mean wait below random's M/D/1 wait",
                     "DeepSeek day: cost", "DeepSeek day: cost-profit margin"):
        assert expected in names
    by_name = {c.name: c for c in checks}
    assert by_name["KV bytes/token BF16, llama-3-70b"].reference == 327_680
    assert by_name["KV bytes/token BF16, deepseek-v3"].reference == 70_272
    assert by_name["DeepSeek day: cost-profit margin"].reference == 5.45
    assert all(c.source and (c.tolerance > 0 or c.basis == "exact") for c in checks)


def test_comparison_rule():
    assert validate._check("near", 1.04, 1.0, 0.05, "s").passed
    assert not validate._check("far", 1.06, 1.0, 0.05, "s").passed
    assert not validate._check("nan", float("nan"), 1.0, 0.05, "s").passed
    assert validate._check("same", [1, 2], (1, 2), 0, "s").passed
    assert not validate._check("order", [2, 1], (1, 2), 0, "s").passed


def _checks_already_run(checks):
    """run_validation as the command calls it, answering with the checks the fixture ran (at quick sizes)."""
    def run_validation(quick=False):
        assert quick is True
        return list(checks)
    return run_validation


def test_command_writes_both_reports(tmp_path, capsys, monkeypatch, checks):
    monkeypatch.setattr(validate, "run_validation", _checks_already_run(checks))
    out = tmp_path / "validation"
    assert validate_command(out, False, quick=True) == 0
    printed = capsys.readouterr().out
    assert "checks pass" in printed and "FAIL" not in printed
    md = (out / "validation.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| check"))
    assert [cell.strip() for cell in header.strip("|").split("|")] == list(COLUMNS)
    payload = json.loads((out / "validation.json").read_text())
    assert payload["passed"] is True and payload["quick"] is True
    fields = [field.name for field in dataclasses.fields(Check)]
    assert payload["checks"] and all(list(check) == fields for check in payload["checks"])
    assert len(md.splitlines()) - md.splitlines().index(header) - 2 == len(payload["checks"])


def test_json_output_and_failure_exit_code(tmp_path, capsys, monkeypatch, checks):
    failing = validate._check("DeepSeek day: cost", 90_000, 87_072, 0.5, "test", "USD/day")
    assert "DeepSeek day: cost" in [c.name for c in checks]
    monkeypatch.setattr(validate, "run_validation", _checks_already_run(
        [failing if c.name == failing.name else c for c in checks]))
    assert validate_command(tmp_path, True, quick=True) == 1
    payload = json.loads(capsys.readouterr().out)
    assert payload["passed"] is False
    assert [c["name"] for c in payload["checks"] if not c["passed"] and not c["target"]] == ["DeepSeek day: cost"]
    assert "**FAIL**" in (tmp_path / "validation.md").read_text()
