"""Scenario loading: strict validation, overrides, [baseline], uncertain inputs and their draws."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from mcsim.scenario import catalog
from mcsim.scenario import (
    ScenarioError,
    draw_uncertain,
    load_scenario,
    parse_override,
    resolve,
)
from mcsim.scenario.distributions import Dist
from mcsim.scenario.schema import LEVERS

FACTORY = Path(__file__).resolve().parents[1] / "scenarios" / "factory.toml"
FACTORY_TEXT = FACTORY.read_text()

#: The uncertain inputs of scenarios/factory.toml and their kinds, read off the file by hand; their parameters
#: are read with plain tomllib below.
FACTORY_UNCERTAIN = {
    "workload.rate_rps": "uniform",
    "workload.classes.chat.output_tokens.median": "uniform",
    "speculative.draft_cost": "uniform",
    "speculative.verify_cost": "uniform",
    "moe.ffn_time_fraction": "uniform",
    "precision.decode_gain": "triangular",
    "precision.prefill_gain": "triangular",
    "efficiency.base_decode_tok_s_per_gpu": "triangular",
    "efficiency.base_prefill_tok_s_per_gpu": "triangular",
    "efficiency.batch_half_saturation": "uniform",
    "efficiency.fused_kernel_gain": "uniform",
    "efficiency.comm_overlap_gain": "uniform",
}


def toml_at(path: str):
    node = tomllib.loads(FACTORY_TEXT)
    for part in path.split("."):
        node = node[part]
    return node


def load(text: str, overrides=()):
    return load_scenario("test.toml", overrides=overrides, text=text)


def error_of(text: str = "", overrides=()) -> ScenarioError:
    with pytest.raises(ScenarioError) as err:
        load(text, overrides)
    message = str(err.value)
    assert "\n" not in message, "the CLI prints the message on one line"
    assert message.startswith("test.toml: ") or message.startswith("--set: ")
    return err.value


# -- the bundled scenario --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def factory():
    return load_scenario(FACTORY)


def test_factory_loads(factory):
    assert factory.name == "factory"
    assert factory.classes == ("chat", "code", "reasoning")
    assert factory.source == str(FACTORY)
    assert factory.text == FACTORY_TEXT
    assert factory["mc.samples"] == 32 and isinstance(factory["mc.samples"], int)
    assert factory["mc.seed"] == 20250301
    assert factory["deployment.routing"] == "pooled"
    assert factory["workload.classes.code.share"] == 0.25
    # DeepSeek's $2 per H800 GPU-hour is the catalog's own rental price, so a hardware sweep charges each its own
    assert factory["economics.rental_usd_per_gpu_hour"] == 0.0 and factory["hardware.rental_usd_per_hour"] == 2.0
    # catalog fields come from the named presets
    h800 = catalog.hardware_preset("h800")
    assert factory["hardware.hbm_gb"] == h800["hbm_gb"]
    assert factory["model.experts"] == catalog.model_preset("deepseek-v3")["experts"] == 256
    # defaults fill what the file leaves out
    assert factory["workload.classes.chat.system_prompt_share"] == 0.8


def test_factory_uncertain_inputs_are_exactly_its_distributions(factory):
    unc = factory.uncertain()
    assert list(unc) == sorted(FACTORY_UNCERTAIN)
    for path, kind in FACTORY_UNCERTAIN.items():
        table = toml_at(path)
        assert table["dist"] == kind
        assert (unc[path].kind, unc[path].params) == (kind, {k: v for k, v in table.items() if k != "dist"}), path
    # per-request variability is not uncertainty; fixed numbers are not either
    assert "workload.classes.chat.output_tokens" not in unc
    assert "workload.system_prompt_tokens" not in unc
    assert "workload.burstiness" not in unc
    assert factory["workload.burstiness"] == 2.0


def test_per_request_fields_are_distributions(factory):
    out = factory["workload.classes.chat.output_tokens"]
    assert isinstance(out, Dist) and out.kind == "lognormal"
    assert out.params["sigma"] == 0.9 and isinstance(out.params["median"], Dist)
    # a per-request field given as a plain number is a fixed distribution
    scn = load("[workload.classes.chat]\nturns = 2\nprompt_tokens = 100\n")
    assert scn["workload.classes.chat.prompt_tokens"].is_fixed
    assert scn["workload.classes.chat.prompt_tokens"].params["value"] == 100.0


def test_empty_file_takes_the_defaults():
    scn = load("")
    assert scn.name == "test"
    assert scn.classes == ("chat",)
    assert scn.uncertain() == {}
    assert load("", overrides=["meta.name=other"]).name == "other"


# -- strict validation ---------------------------------------------------------------------------------------

def test_misspelt_key_names_file_key_and_nearest(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("[cache]\ndram_gb_per_nod = 5\n")
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    message = str(err.value)
    assert message.startswith(f"{path}: cache.dram_gb_per_nod: ")
    assert "did you mean 'dram_gb_per_node'" in message
    assert "\n" not in message
    assert err.value.key == "cache.dram_gb_per_nod"


@pytest.mark.parametrize("text, key, fragment", [
    ("[chache]\nenabled = true\n", "chache", "did you mean 'cache'"),
    ("[nonsense]\nx = 1\n", "nonsense", "unknown section"),
    ("mc = 3\n", "mc", "expected a table"),
    ("[workload.classes.chat]\nsharre = 0.3\n", "workload.classes.chat.sharre", "did you mean 'share'"),
    ("[hardware]\nhbm_gbb = 96\n", "hardware.hbm_gbb", "did you mean 'hbm_gb'"),
    ("[model]\nlayer = 2\n", "model.layer", "did you mean 'layers'"),
    ("[speculative]\nenable = false\n", "speculative.enable", "did you mean 'enabled'"),
    ("[cache.tiers]\nhbm = 1\n", "cache.tiers", "expected [[cache.tiers]] tables"),
])
def test_unknown_keys_and_sections(text, key, fragment):
    err = error_of(text)
    assert err.key == key
    assert fragment in str(err)


@pytest.mark.parametrize("text, key, fragment", [
    ('[mc]\nsamples = "32"\n', "mc.samples", "an integer"),
    ("[mc]\nsamples = 3.5\n", "mc.samples", "an integer"),
    ("[mc]\nsamples = true\n", "mc.samples", "an integer"),
    ("[speculative]\ndraft_tokens = inf\n", "speculative.draft_tokens", "an integer"),
    ("[speculative]\ndraft_tokens = nan\n", "speculative.draft_tokens", "an integer"),
    ('[cache]\ndram_gb_per_node = "big"\n', "cache.dram_gb_per_node", "a number"),
    ("[cache]\ndram_gb_per_node = true\n", "cache.dram_gb_per_node", "a number"),
    ("[cache]\ndram_gb_per_node = [1, 2]\n", "cache.dram_gb_per_node", "a number"),
    ("[cache]\ndram_gb_per_node = nan\n", "cache.dram_gb_per_node", "finite"),
    ("[cache]\nenabled = 1\n", "cache.enabled", "true or false"),
    ('[cache]\nenabled = "yes"\n', "cache.enabled", "true or false"),
    ("[meta]\nname = 3\n", "meta.name", "a string"),
    ("[model]\npreset = 3\n", "model.preset", "a string"),
    ('[workload.classes.chat]\nacceptance = "high"\n', "workload.classes.chat.acceptance", "a number"),
    ("[model]\nlayers = 2.5\n", "model.layers", "an integer"),
    ('[hardware]\nhbm_gb = "96"\n', "hardware.hbm_gb", "a number"),
    ('[model]\nattention = 3\n', "model.attention", "a string"),
    ("[workload]\nclasses = 3\n", "workload.classes", "at least one"),
    ("[workload.classes]\nchat = 3\n", "workload.classes.chat", "a table"),
])
def test_wrong_types(text, key, fragment):
    err = error_of(text)
    assert err.key == key
    assert fragment in str(err)


@pytest.mark.parametrize("text, key, fragment", [
    ("[mc]\nwarmup_fraction = 0.95\n", "mc.warmup_fraction", "in [0, 0.9], got 0.95"),
    ("[mc]\nsamples = 0\n", "mc.samples", "in [1, 1e+06]"),
    ("[deployment]\nmemory_fraction = 0\n", "deployment.memory_fraction", "in (0, 1]"),
    ("[deployment]\nmemory_fraction = 1.01\n", "deployment.memory_fraction", "in (0, 1]"),
    ("[economics]\npue = 0.9\n", "economics.pue", "in [1, 100]"),
    ("[hardware]\nhbm_gb = -1\n", "hardware.hbm_gb", "in (0, 100000]"),
    ("[workload.classes.chat]\nacceptance = 1.2\n", "workload.classes.chat.acceptance", "in [0, 1]"),
    ('[mc]\nwarmup_fraction = { dist = "uniform", low = 0.1, high = 0.95 }\n', "mc.warmup_fraction",
     "uniform distribution's support [0.1, 0.95]"),
    ('[economics]\nbilled_fraction = { dist = "normal", mean = 0.5, sd = 0.1 }\n', "economics.billed_fraction",
     "range between its 1e-12 quantiles [-0.203448, 1.20345]"),
    ('[workload.classes.chat]\nacceptance = { dist = "beta", a = 2, b = 2, high = 1.5 }\n',
     "workload.classes.chat.acceptance", "support [0, 1.5]"),
    ('[workload.classes.chat]\nacceptance = { dist = "normal", mean = { dist = "uniform", low = 0.5, high = 0.9 },'
     ' sd = 0.1 }\n', "workload.classes.chat.acceptance", "support [-inf, inf]"),
    ('[workload.classes.chat]\noutput_tokens = { dist = "lognormal", sigma = 1,'
     ' median = { dist = "uniform", low = -5, high = 300 } }\n', "workload.classes.chat.output_tokens",
     "median > 0"),
    ('[workload.classes.chat]\noutput_tokens = { dist = "lognormal", sigma = 1,'
     ' median = { dist = "normal", mean = 300, sd = 50 } }\n', "workload.classes.chat.output_tokens",
     "can make this distribution invalid"),
])
def test_out_of_range(text, key, fragment):
    err = error_of(text)
    assert err.key == key
    assert fragment in str(err)


@pytest.mark.parametrize("text, path, expected", [
    ("[deployment]\nmemory_fraction = 1\n", "deployment.memory_fraction", 1.0),
    ("[mc]\nwarmup_fraction = 0.9\n", "mc.warmup_fraction", 0.9),
    ("[mc]\nwarmup_fraction = 0\n", "mc.warmup_fraction", 0.0),
    ("[mc]\nsamples = 4.0\n", "mc.samples", 4),
])
def test_range_ends_are_accepted(text, path, expected):
    value = load(text)[path]
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text, path", [
    # laws that never reach 0 are fine on a field open at 0
    ('[workload]\nrate_rps = { dist = "lognormal", median = 50, sigma = 0.5 }\n', "workload.rate_rps"),
    ('[speculative]\nacceptance_decay = { dist = "beta", a = 9, b = 1 }\n', "speculative.acceptance_decay"),
    ('[deployment]\nmemory_fraction = { dist = "uniform", low = 0.8, high = 1 }\n', "deployment.memory_fraction"),
])
def test_distributions_inside_an_open_range_are_accepted(text, path):
    assert path in load(text).uncertain()


def test_nested_parameter_with_a_valid_range_is_accepted():
    scn = load('[workload.classes.chat]\nacceptance = { dist = "beta", a = { dist = "uniform", low = 5, high = 20 },'
               ' b = 3 }\n')
    assert list(scn.uncertain()) == ["workload.classes.chat.acceptance.a"]


def test_nested_parameter_only_in_per_request_fields():
    err = error_of('[workload]\nrate_rps = { dist = "lognormal", median = { dist = "uniform", low = 1, high = 2 },'
                   ' sigma = 1 }\n')
    assert err.key == "workload.rate_rps.median"
    assert "per-request" in str(err)


def test_distribution_errors_name_the_dotted_key():
    err = error_of('[precision]\ndecode_gain = { dist = "triangulr", low = 1, mode = 1.2, high = 1.5 }\n')
    assert err.key == "precision.decode_gain.dist"
    assert "did you mean 'triangular'" in str(err)
    err = error_of('[precision]\ndecode_gain = { dist = "uniform", low = 2, high = 1 }\n')
    assert err.key == "precision.decode_gain" and "low <= high" in str(err)


@pytest.mark.parametrize("text, key, fragment", [
    ('[deployment]\nrouting = "prefix-afinity"\n', "deployment.routing", "did you mean 'prefix-affinity'"),
    ('[deployment]\nbatching = "contiuous"\n', "deployment.batching", "did you mean 'continuous'"),
    ('[mc]\nsampling = "LHS"\n', "mc.sampling", "one of 'random', 'lhs'"),
    ("[deployment]\nrouting = 3\n", "deployment.routing", "one of"),
    ('[model]\npreset = "llama-3-8b"\n', "model.preset", "Did you mean 'llama-3.1-8b'?"),
    ('[hardware]\npreset = "h100x"\n', "hardware.preset", "Did you mean 'h100'?"),
])
def test_invalid_choices_and_presets_suggest(text, key, fragment):
    err = error_of(text)
    assert err.key == key
    assert fragment in str(err)


def test_unreadable_files(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[mc]\nsamples = \n")
    with pytest.raises(ScenarioError, match=r"bad\.toml: not valid TOML.*line 2"):
        load_scenario(bad)
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('[meta]\nname = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ScenarioError, match="latin1.toml: not valid TOML"):
        load_scenario(latin1)


def test_expert_slots_must_divide_over_ranks():
    err = error_of("[deployment]\ngpus_per_instance = 32\n[moe]\nredundant_experts = 7\n")
    assert err.key == "moe.redundant_experts" and "divisible" in str(err)


def test_class_shares_must_not_all_be_zero():
    assert "must not all be 0" in str(error_of("[workload.classes.chat]\nshare = 0\n"))


# -- catalog fields -----------------------------------------------------------------------------------------

def test_catalog_fields_can_be_overridden():
    scn = load('[hardware]\npreset = "h800"\nhbm_gb = 96\n'
               'price_usd = { dist = "triangular", low = 25e3, mode = 30e3, high = 40e3 }\n'
               '[model]\npreset = "llama-3.1-8b"\nlayers = 40\n')
    assert scn["hardware.hbm_gb"] == 96.0
    assert scn["hardware.tdp_w"] == catalog.hardware_preset("h800")["tdp_w"]
    assert scn["model.layers"] == 40 and scn["model.hidden_size"] == catalog.model_preset("llama-3.1-8b")["hidden_size"]
    price = scn.uncertain()["hardware.price_usd"]
    assert (price.kind, price.params) == ("triangular", {"low": 25e3, "mode": 30e3, "high": 40e3})
    assert list(scn.uncertain()) == ["hardware.price_usd"]


# -- --set overrides ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("speculative.draft_tokens=2", ("speculative.draft_tokens", 2)),
    ("cache.dram_gb_per_node = 512.5", ("cache.dram_gb_per_node", 512.5)),
    ("cache.dram_gb_per_node=1e3", ("cache.dram_gb_per_node", 1000.0)),
    ("cache.enabled=false", ("cache.enabled", False)),
    ("model.preset=llama-3.1-8b", ("model.preset", "llama-3.1-8b")),
    ('meta.name="two words"', ("meta.name", "two words")),
    ("workload.trace=/data/my trace.jsonl", ("workload.trace", "/data/my trace.jsonl")),
    ("workload.trace=bundled:mooncake", ("workload.trace", "bundled:mooncake")),
    ("meta.description=a=b", ("meta.description", "a=b")),
    ('precision.decode_gain={dist="uniform", low=1.1, high=1.4}',
     ("precision.decode_gain", {"dist": "uniform", "low": 1.1, "high": 1.4})),
    ("workload.classes.chat.share=0.3", ("workload.classes.chat.share", 0.3)),
])
def test_parse_override(text, expected):
    path, value = parse_override(text)
    assert (path, value) == expected and type(value) is type(expected[1])


@pytest.mark.parametrize("text", ["speculative.draft_tokens", "=3", "a..b=1", ""])
def test_parse_override_refuses_malformed(text):
    with pytest.raises(ScenarioError) as err:
        parse_override(text)
    assert "PATH=VALUE" in str(err.value) and str(err.value).startswith("--set: ")


def test_overrides_apply_like_the_file():
    scn = load_scenario(FACTORY, overrides=[
        "speculative.draft_tokens=2", "cache.enabled=false", "model.preset=llama-3.1-8b",
        "deployment.gpus_per_instance=1", "deployment.tp=1", "moe.redundant_experts=0", "meta.name=small",
        "workload.classes.chat.share=0.3", "precision.decode_gain=1.25",
        'economics.pue={dist="uniform", low=1.1, high=1.4}',
    ])
    assert scn["speculative.draft_tokens"] == 2
    assert scn["cache.enabled"] is False
    assert scn["model.preset"] == "llama-3.1-8b"
    assert scn["model.layers"] == catalog.model_preset("llama-3.1-8b")["layers"]
    assert scn["model.experts"] == 0
    assert scn.name == "small"
    assert scn["workload.classes.chat.share"] == 0.3
    assert scn["workload.classes.code.share"] == 0.25
    unc = scn.uncertain()
    assert "precision.decode_gain" not in unc and scn["precision.decode_gain"] == 1.25
    assert unc["economics.pue"].params == {"low": 1.1, "high": 1.4}
    assert set(unc) == set(FACTORY_UNCERTAIN) - {"precision.decode_gain"} | {"economics.pue"}
    assert scn.overrides[0] == "speculative.draft_tokens=2"


@pytest.mark.parametrize("override, key, fragment", [
    ("cache.dram_gb_per_nod=5", "cache.dram_gb_per_nod", "did you mean 'dram_gb_per_node'"),
    ("speculative.draft_tokens=two", "speculative.draft_tokens", "an integer"),
    ("speculative.draft_tokens=1.5", "speculative.draft_tokens", "an integer"),
    ("deployment.routing=rando", "deployment.routing", "did you mean 'random'"),
    ("model.preset=deepsek-v3", "model.preset", "Did you mean 'deepseek-v3'?"),
    ("chache.enabled=false", "chache", "did you mean 'cache'"),
    ("workload.classes.chatt.share=0.3", "workload.classes.chatt.share", "did you mean 'chat'"),
    ("mc.samples.x=1", "mc.samples.x", "not a table"),
])
def test_bad_overrides(override, key, fragment):
    with pytest.raises(ScenarioError) as err:
        load_scenario(FACTORY, overrides=[override])
    assert err.value.key == key
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_override_into_the_default_class():
    scn = load("", overrides=["workload.classes.chat.share=0.5", "workload.classes.chat.turns=2"])
    assert scn.classes == ("chat",) and scn["workload.classes.chat.turns"] == 2.0
    with pytest.raises(ScenarioError, match="unknown workload class 'code'"):
        load("", overrides=["workload.classes.code.share=0.5"])


# -- [baseline] -------------------------------------------------------------------------------------------

BASELINE = """
[speculative]
draft_tokens = 2
[workload.classes.chat]
share = 0.6
[workload.classes.code]
share = 0.4
[baseline.deployment]
batching = "continuous"
[baseline.economics]
pue = 1.2
[baseline]
speculative.draft_tokens = 1
"""


def test_baseline_tables_are_flattened_and_applied():
    scn = load(BASELINE)
    assert scn.baseline["deployment.batching"] == "continuous"
    assert scn.baseline["economics.pue"] == 1.2
    assert scn.baseline["speculative.draft_tokens"] == 1
    base = scn.variant("baseline")
    # every lever off, then the file's own [baseline]
    for path, value in {k: v for lever in LEVERS.values() for k, v in lever.items()}.items():
        expected = "continuous" if path == "deployment.batching" else value
        assert base[path] == expected, path
    assert base["economics.pue"] == 1.2
    assert base["speculative.draft_tokens"] == 1
    # the factory is untouched
    assert scn.variant("factory") is scn
    assert scn["economics.pue"] == 1.3 and scn["speculative.draft_tokens"] == 2
    assert scn["cache.enabled"] is True
    with pytest.raises(ValueError, match="unknown variant"):
        scn.variant("both")


@pytest.mark.parametrize("text, key, fragment", [
    ("[baseline]\ncache.dram_gb_per_nod = 0\n", "cache.dram_gb_per_nod", "did you mean 'dram_gb_per_node'"),
    ("[baseline.cache]\nenabled = 3\n", "cache.enabled", "true or false"),
    ("[baseline]\nmc.warmup_fraction = 2\n", "mc.warmup_fraction", "in [0, 0.9]"),
    ("[baseline]\nworkload.classes.chatt.share = 0\n", "workload.classes.chatt.share", "did you mean 'chat'"),
    ("[baseline]\nworkload.classes.chat.sharee = 0\n", "workload.classes.chat.sharee", "did you mean 'share'"),
    ('[baseline]\nhardware.preset = "h100x"\n', "hardware.preset", "Did you mean 'h100'?"),
    ('[baseline]\neconomics.pue = { dist = "uniform", low = 1.1, high = 1.3 }\n', "economics.pue",
     "cannot add or change an uncertain input"),
    ('[economics]\npue = { dist = "uniform", low = 1.1, high = 1.4 }\n'
     '[baseline]\neconomics.pue = { dist = "uniform", low = 1.1, high = 1.3 }\n', "economics.pue",
     "cannot add or change an uncertain input"),
])
def test_baseline_is_validated(text, key, fragment):
    err = error_of(text)
    assert err.key == key
    assert fragment in str(err)


def test_baseline_may_fix_an_uncertain_input_or_repeat_it():
    scn = load('[economics]\npue = { dist = "uniform", low = 1.1, high = 1.4 }\n'
               '[precision]\ndecode_gain = { dist = "uniform", low = 1.1, high = 1.4 }\n'
               '[baseline]\neconomics.pue = { dist = "uniform", low = 1.1, high = 1.4 }\nprecision.decode_gain = 1\n')
    base = scn.variant("baseline")
    assert list(base.uncertain()) == ["economics.pue"]
    assert base["precision.decode_gain"] == 1.0


def test_baseline_on_other_hardware_takes_its_catalog_figures_but_the_files_own():
    # a value the file sets itself holds on whatever preset, as with --set hardware.preset=...
    scn = load('[hardware]\npreset = "h800"\nhbm_gb = 96\n[baseline]\nhardware.preset = "a100"\n')
    base = scn.variant("baseline")
    a100 = catalog.hardware_preset("a100")
    assert base["hardware.preset"] == "a100"
    assert base["hardware.tdp_w"] == a100["tdp_w"] and base["hardware.bf16_tflops"] == a100["bf16_tflops"]
    assert base["hardware.hbm_gb"] == scn["hardware.hbm_gb"] == 96.0


# -- drawing uncertain inputs ------------------------------------------------------------------------------

UNIFORMS = {  # path -> (low, high); fields whose ranges admit these
    "economics.billed_fraction": (0.0, 1.0),
    "efficiency.colocated_interference": (0.1, 0.3),
    "cache.dram_gb_per_node": (100.0, 2000.0),
}


def uniforms_text(paths=UNIFORMS, extra=""):
    sections: dict[str, list[str]] = {}
    for path in paths:
        section, key = path.split(".")
        lo, hi = UNIFORMS[path]
        sections.setdefault(section, []).append(f'{key} = {{ dist = "uniform", low = {lo}, high = {hi} }}')
    return "".join(f"[{s}]\n" + "\n".join(lines) + "\n" for s, lines in sections.items()) + extra


@pytest.mark.parametrize("sampling", ["random", "lhs"])
def test_same_seed_same_values(factory, sampling):
    a = draw_uncertain(factory, np.arange(16), seed=5, n_samples=16, sampling=sampling)
    b = draw_uncertain(factory, np.arange(16), seed=5, n_samples=16, sampling=sampling)
    c = draw_uncertain(factory, np.arange(16), seed=6, n_samples=16, sampling=sampling)
    assert list(a) == list(factory.uncertain())
    for path in a:
        assert a[path].shape == (16,)
        np.testing.assert_array_equal(a[path], b[path])
        assert not np.array_equal(a[path], c[path])


@pytest.mark.parametrize("sampling", ["random", "lhs"])
def test_values_do_not_depend_on_chunking(factory, sampling):
    n = 12
    whole = draw_uncertain(factory, np.arange(n), seed=1, n_samples=n, sampling=sampling)
    chunks = [np.array([7, 2]), np.array([0, 1, 3]), np.arange(4, 7), np.arange(8, 12)]
    for chunk in chunks:
        part = draw_uncertain(factory, chunk, seed=1, n_samples=n, sampling=sampling)
        for path in whole:
            np.testing.assert_array_equal(part[path], whole[path][chunk])


@pytest.mark.parametrize("sampling", ["random", "lhs"])
def test_values_do_not_depend_on_other_uncertain_inputs(sampling):
    both = draw_uncertain(load(uniforms_text()), np.arange(20), seed=9, n_samples=20, sampling=sampling)
    alone = draw_uncertain(load(uniforms_text(["cache.dram_gb_per_node"], "[economics]\nbilled_fraction = 0.5\n")),
                           np.arange(20), seed=9, n_samples=20, sampling=sampling)
    assert list(alone) == ["cache.dram_gb_per_node"]
    np.testing.assert_array_equal(alone["cache.dram_gb_per_node"], both["cache.dram_gb_per_node"])


FACTOR = '[performance]\nfidelity = "factor"\n'  # the fidelity that reads efficiency.* and precision.*_gain


def test_lhs_has_one_draw_per_stratum_per_input():
    scn = load(uniforms_text(extra=FACTOR))
    for n in (1, 7, 50):
        draws = draw_uncertain(scn, np.arange(n), seed=3, n_samples=n, sampling="lhs")
        for path, (lo, hi) in UNIFORMS.items():
            u = (draws[path] - lo) / (hi - lo)
            assert np.all((u >= 0) & (u < 1))
            np.testing.assert_array_equal(np.sort(np.floor(u * n)), np.arange(n))
        if n > 1:  # each input has its own permutation, else the inputs would be perfectly correlated
            strata = [tuple(np.floor((draws[p] - lo) / (hi - lo) * n)) for p, (lo, hi) in UNIFORMS.items()]
            assert len(set(strata)) == len(strata)
    # plain random sampling does not stratify (50 draws falling one per bin has probability 50!/50**50)
    draws = draw_uncertain(scn, np.arange(50), seed=3, n_samples=50, sampling="random")
    u = draws["economics.billed_fraction"]
    assert len(np.unique(np.floor(u * 50))) < 50


def test_sampling_defaults_to_the_scenario_and_lhs_needs_the_total():
    scn = load(uniforms_text(extra='[mc]\nsampling = "lhs"\n'))
    draws = draw_uncertain(scn, np.arange(10), seed=0, n_samples=10)
    np.testing.assert_array_equal(np.sort(np.floor(draws["economics.billed_fraction"] * 10)), np.arange(10))
    with pytest.raises(ValueError, match="total number of samples"):
        draw_uncertain(scn, np.arange(10), seed=0)


N_DRAWS = 2000


@pytest.mark.parametrize("sampling", ["random", "lhs"])
def test_draws_follow_the_distribution(sampling):
    scn = load('[cache]\ndram_gb_per_node = { dist = "uniform", low = 200, high = 600 }\n'
               '[precision]\ndecode_gain = { dist = "triangular", low = 1.15, mode = 1.3, high = 1.5 }\n'
               '[economics]\nelectricity_usd_per_kwh = { dist = "lognormal", median = 0.08, sigma = 0.3 }\n' + FACTOR)
    draws = draw_uncertain(scn, np.arange(N_DRAWS), seed=11, n_samples=N_DRAWS, sampling=sampling)
    refs = {
        "cache.dram_gb_per_node": stats.uniform(200, 400),
        "precision.decode_gain": stats.triang(c=0.15 / 0.35, loc=1.15, scale=0.35),
        "economics.electricity_usd_per_kwh": stats.lognorm(s=0.3, scale=0.08),
    }
    for path, ref in refs.items():
        x = draws[path]
        assert abs(x.mean() - ref.mean()) < 4 * ref.std() / math.sqrt(N_DRAWS), path
        assert stats.kstest(x, ref.cdf).statistic < 1.95 / math.sqrt(N_DRAWS), path


def test_integer_inputs_are_drawn_as_integers():
    scn = load('[deployment]\ninstances = { dist = "uniform", low = 1, high = 8 }\n')
    x = draw_uncertain(scn, np.arange(400), seed=0, n_samples=400)["deployment.instances"]
    np.testing.assert_array_equal(x, np.rint(x))
    assert set(x) == set(range(1, 9))
    p = resolve(scn, {"deployment.instances": x[0]})
    assert p["deployment.instances"] == x[0] and isinstance(p["deployment.instances"], int)


def test_resolve_gives_concrete_parameters(factory):
    draws = {k: float(v[0]) for k, v in draw_uncertain(factory, [0], seed=2, n_samples=1).items()}
    p = resolve(factory, draws)
    assert p["workload.rate_rps"] == draws["workload.rate_rps"]
    assert 550 <= p["workload.rate_rps"] <= 750
    out = p["workload.classes.chat.output_tokens"]
    assert out.kind == "lognormal" and not out.nested()
    assert out.params == {"median": draws["workload.classes.chat.output_tokens.median"], "sigma": 0.9}
    # fixed values pass through with their types
    assert p["mc.samples"] == 32 and p["deployment.routing"] == "pooled"
    assert not any(isinstance(v, Dist) and not v.is_fixed and v.nested() for v in p.values())


def test_scenario_errors_cross_to_worker_processes_intact():
    """A sample that fails in a Dask worker process sends its error back by pickle: the message and key hold."""
    import pickle

    from mcsim.scenario.distributions import DistributionError
    from mcsim.scenario.schema import ScenarioError

    for err in (ScenarioError("a.toml", "deployment.tp", "must divide gpus_per_instance (8)"),
                DistributionError("workload.rate_rps", "low must be below high")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.key == err.key


def test_bundled_scenarios_trust_the_fit_or_say_why():
    # a fitted figure (GEMM shares and floors, kernel floors, collective figures) set by a bundled scenario overrides
    # a measurement: allowed only with a comment on the line saying why
    import tomllib

    from mcsim.perf.hardware import FITTED_KEYS

    root = Path(__file__).resolve().parents[1] / "scenarios"
    checked = 0
    for path in sorted(root.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        lines = path.read_text().splitlines()
        for key in FITTED_KEYS:
            section, name = key.split(".", 1)
            if name not in data.get(section, {}):
                continue
            start = lines.index(f"[{section}]")
            line = next(text for text in lines[start + 1:] if text.split("=")[0].strip() == name)
            assert "#" in line, f"{path.name}: {key} overrides the fitted default without saying why"
            checked += 1
    assert checked >= 2  # this-machine.toml's CPU figures, which have no fit


@pytest.mark.parametrize("text, message", [
    ("[performance]\nmixed_step_penalty = 0.1\n", "removed: a step that mixes"),
    ('[deployment]\nrouter = "random"\n', "renamed: set deployment.routing"),
])
def test_a_removed_key_says_what_became_of_it(text, message):
    err = error_of(text)
    assert message in str(err) and "unknown key" not in str(err)


@pytest.mark.parametrize("override, key, expected", [
    ('hardware.deepep_table="h100_sglang"', "hardware.deepep_table",
     "one of b200_sglang_0.5.12, h100_sglang_0.5.6.post2"),
    ('hardware.experts_fp8_surface="h100-experts-fp9"', "hardware.experts_fp8_surface",
     "did you mean 'h100-experts-fp8'"),
    ('hardware.gemm_surface="missing.toml"', "hardware.gemm_surface", "missing.toml: no such calibration file"),
])
def test_a_bundled_name_that_does_not_ship_is_refused_naming_its_key(override, key, expected):
    """A hardware key that names a bundled file (a surface's calibration, DeepEP's export) is checked when the
    scenario is made, by --set as by the file: a misspelt name is one line naming the key, not a missing file later."""
    deepseek = FACTORY.parent / "deepseek-disaggregated.toml"
    with pytest.raises(ScenarioError) as err:
        load_scenario(deepseek, overrides=[override])
    assert err.value.key == key and expected in str(err.value) and "\n" not in str(err.value)
    assert load_scenario(deepseek, overrides=['hardware.deepep_table=""'])["hardware.deepep_table"] == ""
