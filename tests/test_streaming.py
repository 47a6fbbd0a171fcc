"""Streamed samples against whole ones: the same requests, hits and totals whatever the chunks, and latency
quantiles within the sketch's stated error of the exact ones."""

from pathlib import Path

import numpy as np
import pytest

from mcsim.execution.sample import run_sample, streamed
from mcsim.perf.fleet import Latencies
from mcsim.scenario import draw_uncertain, load_scenario, resolve
from mcsim.stages import kvcache, workload

FACTORY = Path(__file__).resolve().parents[1] / "scenarios" / "factory.toml"
#: The factory's deployment with caches small enough to evict within a few thousand requests.
SMALL_CACHES = ("cache.hbm_gb_per_instance=30", "cache.dram_gb_per_node=20", "cache.nvme_gb_per_node=60",
                "mc.warmup_fraction=0.3")


def _params(overrides=()):
    scn = load_scenario(FACTORY, overrides=[*SMALL_CACHES, *overrides])
    return scn, resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 4).items()})


@pytest.mark.parametrize("policy, caches, capacity", [("pooled", 4, (300, 500, 0)),
                                                      ("round-robin", 3, (200, 300, 900)),
                                                      ("random", 5, (100, 0, 200)),
                                                      ("prefix-affinity", 3, (200, 100, 0)),
                                                      ("cache-aware", 4, (150, 200, 600))])
def test_the_cache_stage_chunk_by_chunk_is_the_whole_replay(policy, caches, capacity):
    """The carried caches (segments of runs), routing stream, round-robin position and cache-aware loads
    reuse exactly what one replay of every request reuses, tier by tier and request by request."""
    scn, p = _params()
    n = 8000
    whole = workload.generate(p, scn.classes, n, np.random.default_rng(5), 20000)
    reference = kvcache.cache_hits(whole, policy, caches, np.array(capacity), np.random.default_rng(3)).cached_tokens
    assert reference[:, -1].sum() > 0 or capacity[-1] == 0  # the last tier is reached: blocks are evicted
    cache = kvcache.CacheStream.of(kvcache.Inputs(capacity, policy, caches, 0.25, -1), np.random.default_rng(3),
                                   20000 // whole.block_tokens, whole.block_tokens)
    stream = workload.RequestStream(p, scn.classes, n, np.random.default_rng(5), 20000)
    sizes = np.random.default_rng(1)
    parts = []
    while stream.remaining:
        parts.append(cache.cached_tokens(stream.next_chunk(int(sizes.integers(100, 2500)))))
    np.testing.assert_array_equal(np.concatenate(parts), reference)


def test_the_sketched_latencies_are_within_their_error_of_the_exact_ones():
    rng = np.random.default_rng(0)
    n, classes = 30_000, ("chat", "code")
    ttft, tpot = rng.lognormal(-2.0, 1.0, n), rng.lognormal(-4.0, 0.3, n)
    tpot[rng.random(n) < 0.05] = np.nan  # one-token outputs
    e2e, queue = ttft + 50 * np.nan_to_num(tpot), np.zeros(n)
    class_id = (rng.random(n) < 0.3).astype(np.int64)
    within = (ttft <= 0.3) & ~(tpot > 0.03)
    exact, sketched = Latencies(classes, 0.95, sketch=False), Latencies(classes, 0.95, sketch=True)
    exact.add(ttft, tpot, e2e, queue, within, class_id)
    for part in np.array_split(np.arange(n), 7):
        sketched.add(ttft[part], tpot[part], e2e[part], queue[part], within[part], class_id[part])
    a, b = exact.figures(), sketched.figures()
    for key in ("slo_attainment", "slo_attainment_by_class"):
        np.testing.assert_array_equal(a[key], b[key])
    assert a["slo_attainment"] == float(within.mean())
    q = [0.5, 0.9, 0.99]

    def inverted(values, prob):
        values = values[np.isfinite(values)]
        return np.quantile(values, prob, method="inverted_cdf")

    for key, values in (("ttft_s", ttft), ("tpot_s", tpot), ("e2e_s", e2e)):
        np.testing.assert_allclose(b[key], inverted(values, q), rtol=0.005)
    np.testing.assert_allclose(b["ttft_at_slo_quantile_s"], inverted(ttft, 0.95), rtol=0.005)
    for c in range(2):
        np.testing.assert_allclose(b["tpot_s_by_class"][c], inverted(tpot[class_id == c], q), rtol=0.005)
    np.testing.assert_array_equal(b["queue_wait_s"], 0.0)


#: Figures of a sample that are counts, sums or ratios of sums (exact whatever the chunks).
EXACT = ("cache_hit_rate", "cache_hit_rate_by_tier", "restore_gb_per_request_by_tier", "mean_input_tokens",
         "mean_output_tokens", "requests", "trace_duration_s", "gpus", "decode_tok_s_per_gpu", "prefill_tok_s_per_gpu",
         "operating_batch_per_gpu", "spec_tokens_per_pass", "busy_fraction", "slo_attainment",
         "slo_attainment_by_class", "cost_usd_per_day", "gross_margin", "energy_j_per_token", "cache_hit_rate_drift",
         "steady_state", "expert_efficiency", "mean_concurrency_per_gpu")
QUANTILES = ("ttft_s", "tpot_s", "e2e_s", "ttft_s_by_class", "tpot_s_by_class")


def _sample(overrides, n):
    scn, p = _params(overrides)
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 4).items()}
    return streamed(scn, p, n), run_sample(scn, ("factory",), 0, 4, n, draws)["factory"]


@pytest.mark.parametrize("routing", [(), ('deployment.routing="cache-aware"', "deployment.prefill_instances=3")])
def test_a_streamed_sample_is_the_whole_one(routing):
    """Without the simulator: counts, sums, hit rates and means equal at any chunk size; quantiles within 1 % (the
    sketch's 0.5 % of the rank-rule quantile, checked above, and the whole sample's interpolation between
    neighbouring requests). The factory's one pooled cache, and cache-aware routing over three."""
    n = 6000
    whole_streams, whole = _sample(["mc.chunk_requests=0", *routing], n)
    assert not whole_streams
    parts = []
    for chunk in (1000, 2600):
        streams, part = _sample([f"mc.chunk_requests={chunk}", *routing], n)
        assert streams
        parts.append(part)
        for key in EXACT:
            np.testing.assert_array_equal(part[key], whole[key], err_msg=f"{key} at chunks of {chunk}")
        for key in QUANTILES:  # a class's p99 of ~1400 requests: neighbours too far apart to compare
            np.testing.assert_allclose(part[key][..., :2] if "class" in key else part[key],
                                       whole[key][..., :2] if "class" in key else whole[key], rtol=0.01, err_msg=key)
    assert 0 < whole["cache_hit_rate_by_tier"][-1] < whole["cache_hit_rate"]  # every tier in play
    assert parts[0].keys() == parts[1].keys()
    for key in parts[0]:  # streamed at any chunk size: every figure the same, bit for bit
        np.testing.assert_array_equal(parts[0][key], parts[1][key], err_msg=key)


def test_a_streamed_samples_simulator_replays_the_whole_samples_requests_whatever_the_chunks():
    """With the representative simulator, a streamed sample replays the first measured requests
    (performance.batching_requests of them, or all when 0 and fewer than its window), gathered over as many chunks
    as they span: exactly what the whole sample replays, every figure equal."""
    n = 6000
    fixed = ["deployment.fleet=fixed", "deployment.instances=2", "deployment.prefill_instances=1"]
    for limit, chunk in ((0, 1000), (3000, 2600)):  # all 4,200 measured over five chunks; 3,000 over two
        _, whole = _sample([*fixed, f"performance.batching_requests={limit}"], n)
        streams, part = _sample([*fixed, f"performance.batching_requests={limit}", f"mc.chunk_requests={chunk}"], n)
        assert streams
        for key in (*EXACT, *QUANTILES, "queue_wait_s", "ttft_at_slo_quantile_s", "little_law_ratio"):
            np.testing.assert_array_equal(part[key], whole[key], err_msg=f"{key}, {limit} requests, chunks of {chunk}")


def test_segments_of_runs_reuse_what_a_row_per_block_reuses(monkeypatch):
    """The caches held as segments of runs (a run's record leaving the hash table when its last block is dropped,
    the table doubling as runs come) reuse what the dense key space of a row per block reuses, request by request,
    with every tier in play, in chunks; their most memory is their arrays' with the table at its largest."""
    from mcsim.kernels import kv_tiers

    monkeypatch.setattr(kv_tiers.RunCaches, "FIRST_SLOTS", 16)
    scn, p = _params()
    req = workload.generate(p, scn.classes, 6000, np.random.default_rng(2), 20000)
    capacity = np.array([3000, 2000, 4000])
    span = kv_tiers.run_id_range(req.block_ptr, req.block_runs)[1]
    instance = (np.arange(req.n) % 2).astype(np.int32)
    dense = np.zeros((req.n, 3), np.int64)
    kv_tiers.lookup_tiers_runs(req.block_ptr, req.block_runs, instance, 2, span, capacity, dense, bounded=False)
    caches = kv_tiers.RunCaches(capacity, 2, span, 20000 // req.block_tokens)
    runs = np.zeros((req.n, 3), np.int64)
    for part in np.array_split(np.arange(req.n), 3):
        caches.replay(req.block_ptr[part[0]:part[-1] + 2] - req.block_ptr[part[0]], req.block_runs[part],
                      instance[part], runs[part[0]:part[-1] + 1])
    live_runs, live_segments = caches.live()
    assert caches.top[2] > 0 and caches.table.shape[0] >= 2 * live_runs > 16  # runs given back; the table grew
    assert live_runs <= live_segments < 2 * live_runs  # a run's cached blocks are one segment, or a few
    arrays = (caches.seg, caches.run_key, caches.run_first, caches.seg_free, caches.run_free, caches.head,
              caches.tail, caches.count, caches.load, caches.lengths)
    table_at_most = 4 * kv_tiers._slots(caches.seg.shape[0])
    assert kv_tiers.RunCaches.most_bytes(capacity, 2, caches.longest) == sum(a.nbytes for a in arrays) + table_at_most
    assert dense[:, 1].sum() > 0 and dense[:, 2].sum() > 0
    np.testing.assert_array_equal(runs, dense)


def test_the_frontier_day_is_the_published_daily_volume():
    """scenarios/frontier-day.toml: 10^8 requests over 24 hours whose tokens are DeepSeek's published day (608 B
    input, 168 B output; Open Infra Index, day 6) within 3 % over samples (a single sample's input may be 20 % off: its
    400 system prompts' lengths are drawn once), streamed in memory that does not grow with them."""
    from mcsim.execution.executor import BYTES_PER_REQUEST
    from mcsim.execution.sample import streamed_bytes

    scn = load_scenario(FACTORY.parent / "frontier-day.toml")
    n = int(scn["mc.requests"])
    inputs, outputs = [], []
    for s in range(4):
        p = resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [s], 1, n_samples=4).items()})
        req = workload.generate(p, scn.classes, 100_000, np.random.default_rng(s), int(p["model.max_context"]))
        inputs.append(n * req.prompt_tokens.mean())
        outputs.append(n * req.output_tokens.mean())
    assert n == 10**8 and abs(n / p["workload.rate_rps"] - 86400) < 10
    assert abs(np.mean(inputs) / 608e9 - 1) < 0.03 and abs(np.mean(outputs) / 168e9 - 1) < 0.03
    assert streamed(scn, p, n)
    assert streamed_bytes(scn, p, n, BYTES_PER_REQUEST) < 4 * 2**30  # a chunk and the caches' state, whatever n


def test_the_second_pass_reads_back_what_the_stages_give_again():
    """The first pass's file holds, request by request, what running the generator, the cache replay and the
    speculative draws again gives (the passes without the file)."""
    from mcsim.execution.sample import StreamedSample

    scn, p = _params(["mc.chunk_requests=1500"])
    stages = StreamedSample(scn, p, 0, 4, 5000, 1500)
    assert stages._spill is not None
    kept = list(stages.passes())
    stages.close()
    again = list(stages.passes())
    assert [c[0].n for c in kept] == [c[0].n for c in again] and sum(c[0].n for c in kept) == stages.sums.n
    for (a, cached_a, passes_a), (b, cached_b, passes_b) in zip(kept, again):
        for field in ("prompt_tokens", "output_tokens", "class_id"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        np.testing.assert_array_equal(cached_a, cached_b)
        np.testing.assert_array_equal(passes_a, passes_b)
    assert cached_b[:, 1:].sum() > 0 and passes_b is not None  # lower tiers and speculative draws in play


def test_caches_reuse_the_arrays_of_earlier_ones_and_reuse_what_fresh_ones_reuse():
    """A RunCaches of the same shapes takes the arrays an earlier one gave back (their pages touched, their
    contents stale) and replays exactly what dense rows replay."""
    from mcsim.kernels import kv_tiers

    scn, p = _params()
    capacity = np.array([3000, 2000, 4000])
    first = kv_tiers.RunCaches(capacity, 2, 1 << 40, 20000 // 64)
    earlier = workload.generate(p, scn.classes, 3000, np.random.default_rng(8), 20000)
    first.replay(earlier.block_ptr, earlier.block_runs, (np.arange(earlier.n) % 2).astype(np.int32),
                 np.zeros((earlier.n, 3), np.int64))
    seg = first.seg
    del first
    req = workload.generate(p, scn.classes, 4000, np.random.default_rng(9), 20000)
    instance = (np.arange(req.n) % 2).astype(np.int32)
    again = kv_tiers.RunCaches(capacity, 2, 1 << 40, 20000 // 64)
    assert again.seg is seg  # the earlier arrays, as they were left
    hits = np.zeros((req.n, 3), np.int64)
    again.replay(req.block_ptr, req.block_runs, instance, hits)
    span = kv_tiers.run_id_range(req.block_ptr, req.block_runs)[1]
    dense = np.zeros((req.n, 3), np.int64)
    kv_tiers.lookup_tiers_runs(req.block_ptr, req.block_runs, instance, 2, span, capacity, dense, bounded=False)
    assert dense[:, 1:].sum() > 0
    np.testing.assert_array_equal(hits, dense)


@pytest.mark.parametrize("pools", [("deployment.disaggregated=false",),
                                   ("deployment.disaggregated=true", "deployment.prefill_instances=2")])
def test_streamed_replicas_do_not_depend_on_the_chunks(pools):
    """The replicas of a streamed sample (one pooled cache; colocated, or a prefill pool handing off to a decode
    pool): every figure equal at chunks of 1,000 and 2,600 requests. Beside the whole sample's replicas, whose own
    pooled cache fills as instances admit requests and holds the run's instances' tiers (the cache stage's, which a
    stream reads, holds the configured instances': 2 prefill instances here against the run's 12), and whose
    quantiles are exact: the decode pool's figures within 1-2 %, the cache's and TTFT's too when colocated (TTFT's p99
    within 10 %: the same hits fall on other requests)."""
    n = 6000
    replicas = ['deployment.fleet_simulation="replicas"', 'deployment.routing="pooled"', *pools]
    runs = []
    for chunk in (1000, 2600):
        streams, part = _sample([*replicas, f"mc.chunk_requests={chunk}"], n)
        assert streams
        runs.append(part)
    for key, value in runs[0].items():
        np.testing.assert_array_equal(value, runs[1][key], err_msg=key)
    whole_streams, whole = _sample([*replicas, "mc.chunk_requests=0"], n)
    assert not whole_streams
    part = runs[0]
    assert part["queue_wait_s"][-1] > 0 and part["decode_instances"] > 1  # queues, and a fleet behind the router
    for key in ("gpus", "instances", "requests", "mean_input_tokens", "saturated"):
        np.testing.assert_array_equal(part[key], whole[key], err_msg=key)
    for key in ("operating_batch_per_gpu", "little_law_ratio", "tpot_s"):
        np.testing.assert_allclose(part[key], whole[key], rtol=0.01, err_msg=key)
    np.testing.assert_allclose(part["e2e_s"], whole["e2e_s"], rtol=0.02)
    if "deployment.disaggregated=true" in pools:  # what ran is in the result's attributes
        import mcsim

        ds = mcsim.run(FACTORY, samples=1, requests=n, workers=1,
                       overrides=[*SMALL_CACHES, *replicas, "mc.chunk_requests=2600"])
        assert ds.attrs["fleet_simulation"] == "replicas"
        assert ds.attrs["streamed_samples"].startswith("yes: chunks of 2,600 requests")
        assert "the cache stage's prefix-cache hits" in ds.attrs["streamed_samples"]
        assert mcsim.run(FACTORY, samples=1, requests=500, workers=1).attrs["streamed_samples"].startswith("no:")
    if "deployment.disaggregated=false" in pools:
        for key in ("busy_fraction", "cache_hit_rate", "instance_load_imbalance"):
            np.testing.assert_allclose(part[key], whole[key], rtol=0.02, err_msg=key)
        np.testing.assert_allclose(part["ttft_s"], whole["ttft_s"], rtol=0.1)


def test_progress_counts_every_pass_of_a_streamed_sample():
    """The progress shown grows through both passes of a sample whose latencies read every request again (it once
    froze for the second pass, 37 % of a frontier day) and ends at the sample's requests, whatever the passes."""
    from helpers import DENSE_NODE

    from mcsim.execution import executor, progress
    from mcsim.scenario import load_scenario

    cases = {"replicas": (['deployment.fleet_simulation="replicas"', 'deployment.fleet="fixed"',
                           "deployment.instances=2"], 2),
             "service times": (["performance.simulate_batching=false", 'deployment.fleet="utilization"'], 2),
             "simulator window": (["performance.simulate_batching=true", 'deployment.fleet="utilization"'], 1)}
    for name, (overrides, passes) in cases.items():
        scn = load_scenario(DENSE_NODE, overrides=["mc.chunk_requests=500", *overrides])
        counts = []
        with progress.listening(counts.append):
            executor.run_task(executor.make_plan(scn, ("factory",), samples=1, requests=3000), 0, 0)
        assert counts[-1] == 3000 and counts == sorted(counts), name
        assert len(counts) == passes * 6, name  # 6 chunks of 500 requests, reported in each pass
