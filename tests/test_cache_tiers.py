"""Cache tiers as data: [[cache.tiers]] in a scenario, its errors, and runs whose hit rate per tier equals the
N-tier OrderedDict reference on the same requests."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import mcsim
from mcsim.cli import main
from mcsim.execution.sample import sample_requests
from mcsim.perf.factor import kv_bytes
from mcsim.reference.kv_tiers import lookup_tiers_reference
from mcsim.scenario import STREAM_ROUTING, ScenarioError, load_scenario, resolve, rng_for
from mcsim.stages import kvcache

BASE = """
[meta]
name = "tiers"

[mc]
samples = 1
requests = 2500
seed = 5

[model]
preset = "llama-3.1-8b"

[hardware]
preset = "h100"

[deployment]
gpus_per_instance = 8
instances = 2
disaggregated = false
routing = "round-robin"

[workload]
rate_rps = 20
system_prompts = 30

[workload.classes.chat]
turns = 3.0

[cache]
block_tokens = 16
"""

# 1 MB of KV per 16-token block (Llama-3.1-8B, FP8 KV): a few hundred to a few thousand blocks per tier, which
# the run's ~100 blocks per request overflow, so every tier demotes.
FOUR_TIERS = """
[[cache.tiers]]
name = "hbm"
gb = 0.4
scope = "instance"

[[cache.tiers]]
name = "dram"
gb = 0.6
scope = "node"

[[cache.tiers]]
name = "cxl"
gb = 0.8
scope = "node"

[[cache.tiers]]
name = "nvme"
gb = 1.5
scope = "node"
"""

POOLED = """
[[cache.tiers]]
name = "hbm"
gb = 0.3
scope = "instance"

[[cache.tiers]]
name = "dram"
gb = 0.5
scope = "node"

[[cache.tiers]]
name = "remote"
gb = 2.0
scope = "pooled"
"""


def scenario(tmp_path, tiers=FOUR_TIERS, extra="", name="tiers.toml", overrides=()):
    path = tmp_path / name
    path.write_text(BASE + extra + tiers)
    return load_scenario(path, overrides=list(overrides))


def reference_hit_rates(scn, n_requests: int, sample: int = 0) -> np.ndarray:
    """The measured requests' token hit rate per tier as the OrderedDict reference gives it on the sample's
    requests: routed, replayed, a fully cached prompt still computing its last token, warm-up left out."""
    p = resolve(scn, {})
    seed = int(scn["mc.seed"])
    requests = sample_requests(scn, p, sample, seed, n_requests)
    inputs = kvcache.Inputs.from_params(p, requests.block_tokens, kv_bytes(p))
    instance = kvcache.route(inputs.routing, requests.block_ptr, requests.block_ids, inputs.caches,
                             rng_for(seed, sample, STREAM_ROUTING))
    ptr, ids = requests.block_ptr, requests.block_ids.tolist()
    blocks = [ids[ptr[r]:ptr[r + 1]] for r in range(requests.n)]
    private = len(inputs.capacity_blocks) if inputs.private_tiers < 0 else inputs.private_tiers
    hits = np.array(lookup_tiers_reference(blocks, instance.tolist(), inputs.capacity_blocks, inputs.caches,
                                           n_private=private), np.int64)
    cached = hits * requests.block_tokens
    for r in range(requests.n):  # at least one prompt token is computed, taken from the first tier's share first
        excess = cached[r].sum() - (requests.prompt_tokens[r] - 1)
        for t in range(cached.shape[1]):
            take = min(max(excess, 0), cached[r, t])
            cached[r, t] -= take
            excess -= take
    warm = kvcache.warmup_requests(requests.n, p["mc.warmup_fraction"])
    return cached[warm:].sum(axis=0) / requests.prompt_tokens[warm:].sum(), hits


# -- reading [[cache.tiers]] -------------------------------------------------------------------------------------

def test_tiers_are_read_in_order_with_their_kinds_defaults(tmp_path):
    scn = scenario(tmp_path)
    assert scn["cache.tiers"] == ("hbm", "dram", "cxl", "nvme")
    assert scn["cache.tiers.dram.scope"] == "node" and scn["cache.tiers.dram.gb"] == 0.6
    assert scn["cache.tiers.dram.gb_s"] == 0.0  # the kind's, from the hardware, per sample
    assert scn["cache.tiers.nvme.latency_us"] == 80.0 and scn["cache.tiers.hbm.latency_us"] == 0.0
    assert kvcache.tier_names(resolve(scn, {})) == ("hbm", "dram", "cxl", "nvme")


def test_short_form_makes_hbm_dram_nvme(tmp_path):
    scn = scenario(tmp_path, tiers="hbm_gb_per_instance = 10\n")
    p = resolve(scn, {})
    assert scn["cache.tiers"] == ()
    assert kvcache.tiers_of(p) == (kvcache.Tier("hbm", 10.0, "instance"), kvcache.Tier("dram", 1024.0, "node"),
                                   kvcache.Tier("nvme", 8000.0, "node"))
    assert kvcache.tier_prices(p).tolist() == [0.0, 0.10, 0.0025]  # the kinds' estimates; HBM paid with the GPUs


def test_a_tier_of_unknown_kind_gives_its_rates(tmp_path):
    tiers = FOUR_TIERS + '\n[[cache.tiers]]\nname = "tape"\ngb = 5\nscope = "node"\ngb_s = 2\nlatency_us = 1e4\n'
    scn = scenario(tmp_path, tiers=tiers)
    rates = kvcache.restore_rates(kvcache.tiers_of(resolve(scn, {})), gpus=8, gpus_per_node=8, host_link_gb_s=64,
                                  nvme_gb_s_per_node=25, hbm_tb_s=3.35, scale_out_gb_s=50)
    assert rates[0].instance_bytes_s == np.inf
    assert rates[1].instance_bytes_s == 64e9 * 8 and rates[2].instance_bytes_s == 64e9  # host links; one CXL device
    assert rates[3].instance_bytes_s == 25e9 and rates[3].latency_s == pytest.approx(80e-6)
    assert rates[4].instance_bytes_s == 2e9 and rates[4].latency_s == pytest.approx(0.01)
    # The first tier restores nothing, so it needs no rates whatever its name.
    scenario(tmp_path, tiers='[[cache.tiers]]\nname = "gpu"\ngb = 1\nscope = "instance"\n')


def test_set_and_grid_reach_one_tier(tmp_path):
    scn = scenario(tmp_path, overrides=["cache.tiers.cxl.gb=3", "cache.tiers.nvme.latency_us=10"])
    assert scn["cache.tiers.cxl.gb"] == 3.0 and scn["cache.tiers.nvme.latency_us"] == 10.0
    assert scenario(tmp_path).with_values({"cache.tiers.dram.gb": 2})["cache.tiers.dram.gb"] == 2.0
    uncertain = scenario(tmp_path, overrides=['cache.tiers.dram.gb={dist="uniform", low=0.5, high=1}'])
    assert list(uncertain.uncertain()) == ["cache.tiers.dram.gb"]


BAD = {
    "an unknown key": ('[[cache.tiers]]\nname = "hbm"\ngb = 1\nscope = "instance"\nspeed = 3\n',
                       "cache.tiers.hbm.speed", "unknown key"),
    "a wrong type": ('[[cache.tiers]]\nname = "hbm"\ngb = "lots"\nscope = "instance"\n', "cache.tiers.hbm.gb",
                     "expected a number"),
    "no tiers": ("tiers = []\n", "cache.tiers", "1 to 8"),
    "nine tiers": ("".join(f'[[cache.tiers]]\nname = "t{i}"\ngb = 1\nscope = "node"\ngb_s = 1\nlatency_us = 1\n'
                           for i in range(9)), "cache.tiers", "1 to 8"),
    "a duplicate name": ('[[cache.tiers]]\nname = "hbm"\ngb = 1\nscope = "instance"\n'
                         '[[cache.tiers]]\nname = "hbm"\ngb = 1\nscope = "node"\n', "cache.tiers.hbm", "duplicate"),
    "a negative capacity": ('[[cache.tiers]]\nname = "hbm"\ngb = -1\nscope = "instance"\n', "cache.tiers.hbm.gb",
                            "[0, 1e+09]"),
    "a bad scope": ('[[cache.tiers]]\nname = "hbm"\ngb = 1\nscope = "rack"\n', "cache.tiers.hbm.scope",
                    "one of 'instance', 'node', 'pooled'"),
    "a missing scope": ('[[cache.tiers]]\nname = "hbm"\ngb = 1\n', "cache.tiers.hbm.scope", "missing"),
    "a missing name": ('[[cache.tiers]]\ngb = 1\nscope = "instance"\n', "cache.tiers[1].name", "no name"),
    "a name that is no identifier": ('[[cache.tiers]]\nname = "h.b"\ngb = 1\nscope = "instance"\n',
                                     "cache.tiers[1].name", "letters"),
    "an unknown kind without its bandwidth": (FOUR_TIERS + '[[cache.tiers]]\nname = "tape"\ngb = 1\nscope = "node"\n',
                                              "cache.tiers.tape.gb_s", "not a kind"),
    "a zero bandwidth": (FOUR_TIERS.replace('name = "cxl"', 'name = "cxl"\ngb_s = 0'), "cache.tiers.cxl.gb_s",
                         "(0, 1e+07]"),
    "a table, not an array of tables": ("[cache.tiers]\nhbm = 1\n", "cache.tiers", "[[cache.tiers]]"),
    "both forms": ("dram_gb_per_node = 10\n" + FOUR_TIERS, "cache.dram_gb_per_node", "short form"),
    "a private tier after a pooled one": (POOLED + '[[cache.tiers]]\nname = "nvme"\ngb = 1\nscope = "node"\n',
                                          "cache.tiers.nvme.scope", "cannot follow the pooled tier remote"),
}


@pytest.mark.parametrize("tiers, key, message", BAD.values(), ids=BAD.keys())
def test_bad_tiers_are_one_line_errors_naming_file_and_key(tmp_path, tiers, key, message):
    with pytest.raises(ScenarioError) as err:
        scenario(tmp_path, tiers=tiers)
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'tiers.toml'}: {key}: ") and message in text and "\n" not in text


BAD_OVERRIDES = {
    "an unknown tier": (["cache.tiers.ssd.gb=1"], "cache.tiers.ssd.gb", "unknown cache tier 'ssd'"),
    "a negative capacity": (["cache.tiers.dram.gb=-2"], "cache.tiers.dram.gb", "[0, 1e+09]"),
    "a bad scope": (["cache.tiers.dram.scope=rack"], "cache.tiers.dram.scope", "one of"),
    "an unknown key": (["cache.tiers.dram.size=1"], "cache.tiers.dram.size", "unknown key"),
    "a renamed tier": (["cache.tiers.dram.name=x"], "cache.tiers.dram.name", "cannot be overridden"),
    "the short form": (["cache.hbm_gb_per_instance=5"], "cache.hbm_gb_per_instance", "short form"),
    "a pooled tier before a private one": (["cache.tiers.dram.scope=pooled"], "cache.tiers.cxl.scope",
                                           "cannot follow"),
}


@pytest.mark.parametrize("overrides, key, message", BAD_OVERRIDES.values(), ids=BAD_OVERRIDES.keys())
def test_bad_overrides_of_tiers_exit_2_naming_file_and_key(tmp_path, overrides, key, message):
    path = tmp_path / "tiers.toml"
    path.write_text(BASE + FOUR_TIERS)
    result = CliRunner().invoke(main, ["run", str(path), "--samples", "1", "--requests", "50", "--no-progress",
                                       "-o", str(tmp_path / "out.nc"), *[a for o in overrides for a in ("--set", o)]])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}: {key}: " in lines[0] and message in lines[0], result.stderr
    assert not (tmp_path / "out.nc").exists()


def test_a_grid_over_the_short_form_of_a_scenario_with_tiers_is_refused(tmp_path):
    scn = scenario(tmp_path)
    with pytest.raises(ScenarioError, match="cache.dram_gb_per_node: --grid cannot set the short form"):
        scn.with_values({"cache.dram_gb_per_node": 5}, origin="--grid")
    with pytest.raises(ScenarioError, match="unknown cache tier 'dram' in --grid"):
        scenario(tmp_path, tiers="").with_values({"cache.tiers.dram.gb": 5}, origin="--grid")
    with pytest.raises(ScenarioError, match="one tier's key"):
        scn.with_values({"cache.tiers": 5}, origin="--grid")


def test_a_pooled_tier_runs_as_replicas(tmp_path):
    """Behind round-robin each replica admits its own requests in arrival order, so its own tiers reuse what the
    cache stage's replay reuses; the pool, shared, sees the fleet's admissions in the order the steps run them
    (the kernel against the reference: tests/test_fleet_batching.py), close to the replay's arrival order."""
    overrides = ["deployment.fleet=fixed", "baseline.deployment.fleet_simulation=representative"]
    replicas = mcsim.run(scenario(tmp_path, tiers=POOLED, overrides=[*overrides,
                                                                      "deployment.fleet_simulation=replicas"]),
                         samples=1, requests=1500)
    representative = mcsim.run(scenario(tmp_path, tiers=POOLED, overrides=overrides), samples=1, requests=1500)
    assert replicas.attrs["fleet_simulation"] == "replicas" and list(replicas.tier.values) == ["hbm", "dram", "remote"]
    by_tier, replay = replicas.cache_hit_rate_by_tier.values[0], representative.cache_hit_rate_by_tier.values[0]
    np.testing.assert_array_equal(by_tier[:2], replay[:2])
    assert by_tier[2] > 0.05  # the instances reuse what the other one wrote to the pool
    assert by_tier[2] == pytest.approx(replay[2], rel=0.02)


# -- runs ----------------------------------------------------------------------------------------------------------

def test_four_tiers_run_and_match_the_reference_per_tier(tmp_path):
    scn = scenario(tmp_path)
    ds = mcsim.run(scn, samples=1, requests=2500)
    assert list(ds.tier.values) == ["hbm", "dram", "cxl", "nvme"]
    expected, hits = reference_hit_rates(scn, 2500)
    assert (hits > 0).sum(axis=0).all()  # every tier serves hits: the upper ones overflowed into it
    np.testing.assert_allclose(ds.cache_hit_rate_by_tier.values[0], expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(float(ds.cache_hit_rate[0]), expected.sum(), rtol=1e-12)
    restored = ds.restore_gb_per_request_by_tier.values[0]
    assert restored[0] == 0 and (restored[1:] > 0).all()


def test_pooled_tier_runs_and_matches_the_reference(tmp_path):
    scn = scenario(tmp_path, tiers=POOLED)
    ds = mcsim.run(scn, samples=1, requests=2500)
    assert list(ds.tier.values) == ["hbm", "dram", "remote"]
    expected, hits = reference_hit_rates(scn, 2500)
    assert hits[:, 2].sum() > 0  # instances reuse what the other one wrote to the pool
    np.testing.assert_allclose(ds.cache_hit_rate_by_tier.values[0], expected, rtol=1e-12, atol=0)


def test_the_short_form_written_out_gives_the_same_figures(tmp_path):
    """hbm, dram and nvme written as [[cache.tiers]] (their kinds' bandwidths; no latency, as the short form)."""
    short = scenario(tmp_path, tiers="hbm_gb_per_instance = 0.4\ndram_gb_per_node = 0.6\nnvme_gb_per_node = 1.5\n",
                     name="short.toml")
    written = "".join(f'[[cache.tiers]]\nname = "{name}"\ngb = {gb}\nscope = "{scope}"\nlatency_us = 0\n'
                      for name, gb, scope in (("hbm", 0.4, "instance"), ("dram", 0.6, "node"), ("nvme", 1.5, "node")))
    long = scenario(tmp_path, tiers=written, name="long.toml")
    a = mcsim.run(short, samples=1, requests=1500)
    b = mcsim.run(long, samples=1, requests=1500)
    assert list(a.tier.values) == list(b.tier.values) == ["hbm", "dram", "nvme"]
    for name in ("cache_hit_rate_by_tier", "restore_gb_per_request_by_tier", "ttft_s", "cost_usd_per_mtok",
                 "prefill_tok_s_per_gpu", "gpus", "max_batch_by_memory"):
        np.testing.assert_array_equal(a[name].values, b[name].values)


def test_a_tier_latency_adds_to_each_restoring_request(tmp_path):
    fast = mcsim.run(scenario(tmp_path, overrides=["cache.tiers.nvme.latency_us=0"]), samples=1, requests=1500)
    slow = mcsim.run(scenario(tmp_path, overrides=["cache.tiers.nvme.latency_us=2e5"]), samples=1, requests=1500)
    # 0.2 s more for every request that restores from NVMe, nothing for the others: TTFT quantiles never fall, and
    # those that restoring requests reach rise by most of it.
    shift = slow.ttft_s.values[0] - fast.ttft_s.values[0]
    assert shift.min() >= 0 and shift.max() > 0.1
    np.testing.assert_array_equal(slow.cache_hit_rate_by_tier.values, fast.cache_hit_rate_by_tier.values)


def test_a_sweep_over_a_tier_key(tmp_path):
    ds = mcsim.sweep(scenario(tmp_path), ["cache.tiers.cxl.gb=0,0.8"], samples=1, requests=1200)
    assert ds.cache_hit_rate_by_tier.dims == ("cache_tiers_cxl_gb", "sample", "tier")
    assert list(ds.tier.values) == ["hbm", "dram", "cxl", "nvme"]
    by_tier = ds.cache_hit_rate_by_tier.sel(tier="cxl").values[:, 0]
    assert by_tier[0] == 0 and by_tier[1] > 0
    assert ds.cache_tiers_cxl_gb.attrs["path"] == "cache.tiers.cxl.gb"


def test_four_tiers_run_as_replicas(tmp_path):
    """Replicas keep four tiers each; behind round-robin, admitting in arrival order, they reuse what the cache
    stage's replay (checked against the reference above) reuses, tier by tier."""
    overrides = ["deployment.fleet=fixed", "baseline.deployment.fleet_simulation=representative",
                 "cache.tiers.dram.gb=0.3", "cache.tiers.cxl.gb=0.3"]
    replicas = mcsim.run(scenario(tmp_path, overrides=[*overrides, "deployment.fleet_simulation=replicas"]),
                         samples=1, requests=1500)
    representative = mcsim.run(scenario(tmp_path, overrides=overrides), samples=1, requests=1500)
    assert list(replicas.tier.values) == ["hbm", "dram", "cxl", "nvme"]
    assert replicas.attrs["fleet_simulation"] == "replicas"
    by_tier = replicas.cache_hit_rate_by_tier.values[0]
    assert (by_tier > 0).all()
    np.testing.assert_array_equal(by_tier, representative.cache_hit_rate_by_tier.values[0])


def test_the_cli_runs_and_sweeps_four_tiers(tmp_path):
    path = tmp_path / "tiers.toml"
    path.write_text(BASE + FOUR_TIERS)
    run = CliRunner().invoke(main, ["run", str(path), "--samples", "1", "--requests", "800", "--no-progress",
                                    "-o", str(tmp_path / "run.nc")])
    assert run.exit_code == 0, run.output
    sweep = CliRunner().invoke(main, ["sweep", str(path), "--samples", "1", "--requests", "800", "--no-progress",
                                      "--grid", "cache.tiers.nvme.gb=0,1.5", "-o", str(tmp_path / "sweep.nc")])
    assert sweep.exit_code == 0, sweep.output


# -- the JSON Schema -----------------------------------------------------------------------------------------------

def test_the_json_schema_takes_cache_tiers_and_refuses_what_it_can_express(tmp_path):
    import tomllib

    import jsonschema

    from mcsim.scenario.json_schema import scenario_schema

    validator = jsonschema.Draft202012Validator(scenario_schema())
    good = BASE + FOUR_TIERS + '\n[sweep]\n"cache.tiers.dram.gb" = [0.5, 1]\n[sweep.cache.tiers.nvme]\ngb = [1, 2]\n' \
        '[baseline]\n"cache.tiers.cxl.gb" = 0\n[baseline.cache.tiers.nvme]\nlatency_us = 5\n'
    load_scenario(tmp_path / "good.toml", text=good)
    assert [e.message for e in validator.iter_errors(tomllib.loads(good))] == []
    not_expressible = {"a duplicate name", "an unknown kind without its bandwidth", "a private tier after a pooled one"}
    for case, (tiers, _, _) in BAD.items():
        if case not in not_expressible:
            assert not validator.is_valid(tomllib.loads(BASE + tiers)), case


def test_replicas_restore_time_charges_each_tier_rate_and_its_latency_once():
    """Per request: reused tokens per tier at each tier's seconds per token, plus a tier's latency once when the
    request restored anything from it (worked by hand)."""
    from mcsim.perf.latency import Workload, _restore_s

    one = np.zeros(3)
    w = Workload(one, one, one, one, one, one, one, None, 0, 16, one, one, one,
                 restore_s_per_token=(0.0, 1e-6, 4e-6, 1e-5), restore_latency_s=(0.0, 5e-6, 80e-6, 1e-3))
    cached = np.array([[32, 0, 0, 0], [0, 100, 0, 0], [16, 10, 20, 1]])
    expected = [0.0, 100 * 1e-6 + 5e-6, 10 * 1e-6 + 20 * 4e-6 + 1e-5 + 5e-6 + 80e-6 + 1e-3]
    np.testing.assert_allclose(_restore_s(w, cached), expected, rtol=1e-12)


# -- what a tier costs and saves ---------------------------------------------------------------------------------

PRICED = POOLED.replace('name = "dram"\ngb = 0.5\nscope = "node"', 'name = "dram"\ngb = 0.5\nscope = "node"\n'
                        'usd_per_gb_month = 3.0')


def test_a_tiers_cost_is_its_fleet_capacity_at_its_price_and_nothing_else_moves(tmp_path):
    """kv_tier_gb and kv_tier_cost_usd_per_day against their closed forms (per instance x instances, per node x
    nodes x instances, a pool once; at the price per GB-month over 365.25/12 days), and a price sweep moves the
    tier's cost and nothing else: the money of a tier stands beside cost_usd_per_day, not in it."""
    scn = scenario(tmp_path, tiers=PRICED)
    ds = mcsim.sweep(scn, ["cache.tiers.dram.usd_per_gb_month=3,6"], samples=2, requests=1500, workers=1)
    names = list(ds.tier.values)
    instances = ds.decode_instances.values[0]  # colocated: every instance holds its caches
    # PRICED: hbm 0.3 GB per instance, dram 0.5 GB per node (an 8-GPU instance spans one 8-GPU H100 node), a pool
    # of 2 GB
    expected = {"hbm": 0.3 * instances, "dram": 0.5 * instances, "remote": 2.0}
    for i, name in enumerate(names):
        np.testing.assert_allclose(ds.kv_tier_gb.values[0, :, i], expected[name], rtol=1e-12)
    dram = names.index("dram")
    for j, price in enumerate((3.0, 6.0)):
        np.testing.assert_allclose(ds.kv_tier_cost_usd_per_day.values[j, :, dram],
                                   ds.kv_tier_gb.values[j, :, dram] * price * 12 / 365.25, rtol=1e-12)
    assert (ds.kv_tier_cost_usd_per_day.values[:, :, names.index("hbm")] == 0).all()  # paid with the GPUs
    for name in ("cost_usd_per_day", "gross_margin", "decode_tok_s_per_gpu", "kv_tier_recompute_saved_usd_per_day"):
        np.testing.assert_array_equal(ds[name].values[0], ds[name].values[1])
    # what the hits saved is proportional to each tier's hit rate (one price per token of prefill)
    saved, rate = ds.kv_tier_recompute_saved_usd_per_day.values[0], ds.cache_hit_rate_by_tier.values[0]
    assert (rate > 0).sum() >= 2
    for s in range(saved.shape[0]):
        hit = rate[s] > 0
        np.testing.assert_allclose(saved[s, hit] / rate[s, hit], (saved[s, hit] / rate[s, hit])[0], rtol=1e-9)
