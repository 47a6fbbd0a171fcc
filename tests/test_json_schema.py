"""The JSON Schema of scenario files: every bundled scenario validates; what the loader refuses, it refuses too."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from mcsim.cli import main
from mcsim.scenario import ScenarioError, load_scenario
from mcsim.scenario.json_schema import DRAFT, scenario_schema

SCENARIOS = sorted((Path(__file__).resolve().parents[1] / "scenarios").glob("*.toml"))


@pytest.fixture(scope="module")
def validator():
    schema = scenario_schema()
    jsonschema.Draft202012Validator.check_schema(schema)  # a well-formed draft 2020-12 schema
    return jsonschema.Draft202012Validator(schema)


def test_the_schema_is_draft_2020_12():
    assert scenario_schema()["$schema"] == DRAFT == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_bundled_scenario_validates(validator, path):
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(tomllib.loads(
        path.read_text()))]
    assert errors == []


REFUSED = {
    "wrong type": '[cache]\nblock_tokens = "64"',
    "unknown key": "[cache]\nblock_tokes = 64",
    "unknown section": "[cachee]\nblock_tokens = 64",
    "above the range": "[economics]\ntarget_utilization = 1.5",
    "below an open range": "[workload]\nrate_rps = 0",
    "an integer key given a fraction": "[speculative]\ndraft_tokens = 1.5",
    "not a choice": '[deployment]\nfleet = "elastic"',
    "unknown preset": '[hardware]\npreset = "h900"',
    "a distribution on a plain key": '[mc]\nsamples = { dist = "uniform", low = 1, high = 4 }',
    "a distribution on a switch": '[cache]\nenabled = { dist = "choice", values = [0, 1] }',
    "an unknown distribution": '[workload]\nrate_rps = { dist = "gauss", mean = 1, sd = 1 }',
    "a missing parameter": '[workload]\nrate_rps = { dist = "uniform", low = 5 }',
    "an unknown parameter": '[workload]\nrate_rps = { dist = "uniform", low = 5, high = 9, mode = 7 }',
    "a support below the range": '[workload]\nrate_rps = { dist = "uniform", low = -5, high = 10 }',
    "an unbounded normal on a bounded key": '[economics]\npue = { dist = "normal", mean = 1.3, sd = 0.1 }',
    "a lognormal on a key at most 1": '[economics]\nbilled_fraction = { dist = "lognormal", median = 0.9, sigma = 0.1 }',
    "a nested distribution on a model input": '[economics]\npue = { dist = "uniform", low = { dist = "uniform", '
                                              'low = 1, high = 1.2 }, high = 1.5 }',
    "a class key misspelt": "[workload.classes.chat]\nshares = 1",
    "an [mc] grid axis": '[sweep]\n"mc.samples" = [1, 2]',
    "an unknown grid axis": '[sweep]\n"speculative.draft_tokes" = [1, 2]',
    "a grid range beyond the key's range": '[sweep]\n"speculative.draft_tokens" = { start = 0, stop = 100, num = 3 }',
    "a per-request grid axis": '[sweep]\n"workload.system_prompt_tokens" = [100, 200]',
    "a bad grid value": '[sweep]\n"deployment.fleet" = ["fixed", "elastic"]',
    "a workload key in [baseline]": '[baseline]\n"workload.rate_rps" = 5',
    "a block size in [baseline]": "[baseline.cache]\nblock_tokens = 32",
    "a negative rate in a rate profile": "[workload]\nrate_profile = [1, -1]",
    "a rate profile of zeros": "[workload]\nrate_profile = [0, 0]",
    "a rate profile of strings": '[workload]\nrate_profile = ["1", "2"]',
    "a rate profile with a trace": '[workload]\ntrace = "bundled:mooncake"\nrate_profile = [1, 2]',
    "a distribution on a rate profile's period": '[workload]\nrate_profile_period_s = { dist = "uniform", '
                                                 "low = 1, high = 2 }",
    "a rate profile as a grid axis": '[sweep]\n"workload.rate_profile" = [[1, 2], [2, 1]]',
}

ACCEPTED = {
    "a preset in capitals": '[hardware]\npreset = "H800"',
    "an uncertain parameter of a per-request field": '[workload.classes.chat]\nacceptance = { dist = "beta", '
                                                     'a = { dist = "uniform", low = 10, high = 20 }, b = 3 }',
    "a bounded normal on a bounded key": '[economics]\npue = { dist = "normal", mean = 1.3, sd = 0.1, low = 1 }',
    "an integral float on an integer key": "[speculative]\ndraft_tokens = 2.0",
    "nested sweep tables": "[sweep.speculative]\ndraft_tokens = [0, 1]\n[sweep.workload.classes.chat]\nshare = [1, 2]",
    "a dotted class axis": '[sweep]\n"workload.classes.chat.turns" = { start = 1, stop = 4, num = 4 }',
    "a lever in [baseline]": '[baseline]\n"speculative.enabled" = true\n[baseline.moe]\nredundant_experts = 64',
    "a daily rate profile": '[workload]\nrate_profile = [1, 2.5, 0]\nrate_profile_start_s = { dist = "uniform", '
                            "low = 0, high = 86400 }",
    "a trace with an empty rate profile": '[workload]\ntrace = "bundled:mooncake"\nrate_profile = []',
    "a catalog field with a distribution": '[hardware]\nprice_usd = { dist = "triangular", low = 2e4, mode = 2.5e4, '
                                           'high = 3e4 }',
}


@pytest.mark.parametrize("text", REFUSED.values(), ids=REFUSED.keys())
def test_what_the_loader_refuses_the_schema_refuses(validator, text, tmp_path):
    with pytest.raises(ScenarioError):
        load_scenario(tmp_path / "bad.toml", text=text)
    assert not validator.is_valid(tomllib.loads(text))


@pytest.mark.parametrize("text", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_what_the_loader_accepts_the_schema_accepts(validator, text, tmp_path):
    load_scenario(tmp_path / "good.toml", text=text)
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(tomllib.loads(text))]
    assert errors == []


def test_keys_carry_their_facts():
    defs = scenario_schema()["$defs"]
    fidelity = defs["key.performance.fidelity"]
    assert fidelity["enum"] == ["factor", "roofline"] and fidelity["default"] == "roofline"
    assert "roofline fidelity only" in defs["key.performance.gemm_floor_s"]["description"]
    assert defs["key.economics.target_utilization"]["anyOf"][0] == {"type": "number", "exclusiveMinimum": 0,
                                                                    "maximum": 1}
    assert defs["key.mc.samples"] == {"type": "integer", "minimum": 1, "maximum": 1_000_000, "default": 32,
                                      "description": defs["key.mc.samples"]["description"]}
    profile = defs["key.workload.rate_profile"]
    assert profile["type"] == "array" and profile["items"] == {"type": "number", "minimum": 0}
    assert profile["default"] == [] and "axis.workload.rate_profile" not in defs


def test_schema_command_prints_and_writes_it(tmp_path):
    runner = CliRunner()
    printed = runner.invoke(main, ["schema", "--json"])
    assert printed.exit_code == 0, printed.output
    assert json.loads(printed.stdout) == scenario_schema()
    out = tmp_path / "scenario.schema.json"
    written = runner.invoke(main, ["schema", "-o", str(out)])
    assert written.exit_code == 0, written.output
    assert json.loads(out.read_text()) == scenario_schema()
    again = runner.invoke(main, ["schema", "-o", str(out)])
    assert again.exit_code == 2 and "--force" in again.stderr
    assert runner.invoke(main, ["schema", "-o", str(out), "--force"]).exit_code == 0
