"""Experts per rank: kernels against exact laws, closed forms and the pure-Python references."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcsim.kernels.experts import build_alias, eplb_placement, rank_loads, route_steps
from mcsim.reference import experts as ref
from mcsim.stages import experts as orchestration
from mcsim.stages.experts import expert_efficiency, zipf_popularity

# Statistical checks allow Z standard errors; with fixed seeds they are deterministic, and a correct
# sampler would fail one of them with probability ~1e-6 per comparison.
Z = 5.0

README_LOADS = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
README_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]


def alias_tables(laws):
    prob = np.empty(laws.shape, np.float64)
    alias = np.empty(laws.shape, np.int64)
    for c in range(laws.shape[0]):
        build_alias(laws[c], prob[c], alias[c])
    return prob, alias


# --- alias tables -----------------------------------------------------------------------------------------


@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e6)), min_size=1, max_size=64).filter(lambda w: sum(w) > 0))
def test_alias_table_reconstructs_normalised_weights(weights):
    w = np.array(weights)
    prob = np.empty(w.size)
    alias = np.empty(w.size, np.int64)  # the engine's index type: the kernel compiles for one signature
    build_alias(w, prob, alias)
    assert np.all((prob >= 0) & (prob <= 1))
    assert np.all((alias >= 0) & (alias < w.size))
    np.testing.assert_allclose(ref.alias_table_probabilities(prob, alias), w / w.sum(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("weights", [[0.0, 0.0], [1.0, -1.0], [1.0, np.nan]])
def test_alias_table_rejects_bad_weights(weights):
    with pytest.raises(ValueError):
        build_alias(np.array(weights), np.empty(2), np.empty(2, np.int64))


# --- routing law ------------------------------------------------------------------------------------------


def test_each_token_gets_top_k_distinct_experts():
    laws = zipf_popularity(10, 1.5)[None, :]
    prob, alias = alias_tables(laws)
    counts = np.empty((5000, 10), np.int64)
    route_steps(1, np.array([1.0]), prob, alias, 4, np.random.default_rng(1), counts)
    # One token per step: a row is the token's expert set, so any duplicate would show as a 2.
    assert counts.max() == 1
    assert np.all(counts.sum(axis=1) == 4)
    route_steps(37, np.array([1.0]), prob, alias, 4, np.random.default_rng(2), counts[:100])
    assert np.all(counts[:100].sum(axis=1) == 37 * 4)


@pytest.mark.parametrize("top_k", [2, 3])
def test_routed_sets_follow_the_plackett_luce_law(top_k):
    weights = [8.0, 4.0, 2.0, 1.0, 1.0, 0.5]
    exact = ref.plackett_luce_set_probabilities(weights, top_k)
    prob, alias = alias_tables(np.array([weights]))
    n = 200_000
    counts = np.empty((n, len(weights)), np.int64)
    route_steps(1, np.array([1.0]), prob, alias, top_k, np.random.default_rng(3), counts)
    codes = counts @ (1 << np.arange(len(weights)))
    observed = np.bincount(codes, minlength=1 << len(weights))
    assert observed.sum() == n
    seen = 0
    for chosen in itertools.combinations(range(len(weights)), top_k):
        p = exact[frozenset(chosen)]
        k = observed[sum(1 << e for e in chosen)]
        seen += k
        assert abs(k - n * p) <= Z * math.sqrt(n * p * (1 - p)), (chosen, k, n * p)
    assert seen == n


def test_class_mixture_inclusion_frequencies_match_exact_law():
    rng = np.random.default_rng(4)
    n_experts, top_k, shares = 8, 3, np.array([0.7, 0.3])
    laws = np.stack([zipf_popularity(n_experts, 1.2)[rng.permutation(n_experts)],
                     zipf_popularity(n_experts, 0.5)[rng.permutation(n_experts)]])
    inclusion = shares @ np.array([ref.plackett_luce_inclusion(list(w), top_k) for w in laws])
    prob, alias = alias_tables(laws)
    tokens, steps = 50, 4000
    counts = np.empty((steps, n_experts), np.int64)
    route_steps(tokens, np.cumsum(shares), prob, alias, top_k, rng, counts)
    n = tokens * steps
    # Each token includes expert e independently with probability inclusion[e].
    se = np.sqrt(n * inclusion * (1 - inclusion))
    assert np.all(np.abs(counts.sum(axis=0) - n * inclusion) <= Z * se)


def test_reference_sampler_follows_the_plackett_luce_law():
    weights = [5.0, 3.0, 1.0, 1.0]
    inclusion = np.array(ref.plackett_luce_inclusion(weights, 2))
    np.testing.assert_allclose(inclusion.sum(), 2.0)
    n = 20_000
    counts = np.array(ref.route_steps_reference(1, [1.0], [weights], 2, n, random.Random(5)))
    assert np.all(counts.sum(axis=1) == 2) and counts.max() == 1
    se = np.sqrt(n * inclusion * (1 - inclusion))
    assert np.all(np.abs(counts.sum(axis=0) - n * inclusion) <= Z * se)


def test_uniform_routing_per_expert_count_is_binomial():
    n_experts, top_k, tokens, steps = 16, 4, 64, 20_000
    prob, alias = alias_tables(np.ones((1, n_experts)))
    counts = np.empty((steps, n_experts), np.int64)
    route_steps(tokens, np.array([1.0]), prob, alias, top_k, np.random.default_rng(6), counts)
    p = top_k / n_experts  # distinct top-k: each token includes a given expert with probability k/E
    mean, var = tokens * p, tokens * p * (1 - p)
    assert np.all(np.abs(counts.mean(axis=0) - mean) <= Z * math.sqrt(var / steps))
    # SE of a sample variance ~ var * sqrt(2 / steps) (binomial kurtosis is close to normal here).
    assert np.all(np.abs(counts.var(axis=0, ddof=1) - var) <= Z * var * math.sqrt(2.0 / steps))


def test_uniform_max_rank_load_matches_exact_expectation():
    n_experts, top_k, tokens, ranks, steps = 8, 2, 16, 4, 40_000
    exact = ref.expected_max_rank_load_uniform(n_experts, top_k, tokens, ranks)
    prob, alias = alias_tables(np.ones((1, n_experts)))
    counts = np.empty((steps, n_experts), np.int64)
    route_steps(tokens, np.array([1.0]), prob, alias, top_k, np.random.default_rng(7), counts)
    out_max, out_mean = np.empty(steps), np.empty(steps)
    rank_loads(counts, np.arange(n_experts), np.ones(n_experts, np.int64), ranks, out_max, out_mean)
    assert np.all(out_mean == tokens * top_k / ranks)
    assert abs(out_max.mean() - exact) <= Z * out_max.std(ddof=1) / math.sqrt(steps)


def test_expected_max_rank_load_reference_on_a_hand_case():
    # E=2, k=1, 2 ranks, 2 tokens: max is 2 with probability 1/2, else 1 -> 1.5.
    assert ref.expected_max_rank_load_uniform(2, 1, 2, 2) == pytest.approx(1.5)


# --- EPLB -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", [0, 1])
def test_eplb_reproduces_the_readme_example(layer):
    phy2log, logcnt = eplb_placement(np.array(README_LOADS[layer], np.float64), 16, 4, 2, 8)
    assert phy2log.tolist() == README_PHY2LOG[layer]
    assert logcnt.tolist() == np.bincount(README_PHY2LOG[layer], minlength=12).tolist()
    ref_phy2log, ref_logcnt = ref.eplb_placement_reference(README_LOADS[layer], 16, 4, 2, 8)
    assert ref_phy2log == README_PHY2LOG[layer]
    assert ref_logcnt == logcnt.tolist()


@st.composite
def eplb_cases(draw):
    num_nodes = draw(st.sampled_from([1, 2, 4]))
    num_gpus = num_nodes * draw(st.integers(1, 3))
    groups_per_node = draw(st.integers(1, 3))
    num_groups = draw(st.sampled_from([num_nodes * groups_per_node, 3]))  # 3: often the global policy
    group_size = draw(st.integers(1, 4))
    n_experts = num_groups * group_size
    slots_per_gpu = draw(st.integers(1, 4))
    num_replicas = num_gpus * slots_per_gpu
    if num_replicas < n_experts:
        num_replicas = num_gpus * math.ceil(n_experts / num_gpus) * draw(st.integers(1, 2))
    hierarchical = num_groups % num_nodes == 0
    if hierarchical and num_replicas // num_nodes < n_experts // num_nodes:
        num_replicas = n_experts
    ties = draw(st.booleans())
    values = st.integers(0, 5) if ties else st.floats(0.0, 1e5)
    weight = draw(st.lists(values, min_size=n_experts, max_size=n_experts))
    return np.array(weight, np.float64), num_replicas, num_groups, num_nodes, num_gpus


@given(eplb_cases())
def test_eplb_matches_reference_and_keeps_its_invariants(case):
    weight, num_replicas, num_groups, num_nodes, num_gpus = case
    if num_replicas % num_gpus or num_replicas < weight.size:
        return
    phy2log, logcnt = eplb_placement(weight, num_replicas, num_groups, num_nodes, num_gpus)
    ref_phy2log, ref_logcnt = ref.eplb_placement_reference(weight.tolist(), num_replicas, num_groups, num_nodes, num_gpus)
    assert phy2log.tolist() == ref_phy2log
    assert logcnt.tolist() == ref_logcnt
    # Every expert has a replica, every slot holds one, and logcnt counts them.
    assert np.all(logcnt >= 1) and logcnt.sum() == num_replicas
    assert np.bincount(phy2log, minlength=weight.size).tolist() == logcnt.tolist()
    if num_groups % num_nodes == 0:
        # Hierarchical: all replicas of a group live on one node, and each node holds the same number of groups.
        group_size = weight.size // num_groups
        slots_per_node = num_replicas // num_nodes
        node_of_group = {}
        for slot, expert in enumerate(phy2log):
            node = slot // slots_per_node
            assert node_of_group.setdefault(expert // group_size, node) == node
        assert np.all(np.bincount(list(node_of_group.values()), minlength=num_nodes) == num_groups // num_nodes)


@given(st.lists(st.integers(1, 50), min_size=1, max_size=5), st.integers(0, 4))
def test_eplb_replication_minimises_the_largest_replica_load(weights, extra):
    # Global policy, one GPU: logcnt is the greedy replication, which must reach the brute-force optimum
    # of max_e w_e / c_e over all c >= 1 with sum c = E + extra.
    n = len(weights)
    _, logcnt = eplb_placement(np.array(weights, np.float64), n + extra, 1, 1, 1)
    best = min(max(w / c for w, c in zip(weights, counts))
               for counts in itertools.product(range(1, extra + 2), repeat=n) if sum(counts) == n + extra)
    assert max(w / c for w, c in zip(weights, logcnt)) == pytest.approx(best, rel=1e-6)


def test_eplb_rejects_impossible_layouts():
    with pytest.raises(ValueError):
        eplb_placement(np.ones(12), 15, 4, 2, 8)  # 15 slots on 8 GPUs
    with pytest.raises(ValueError):
        eplb_placement(np.ones(12), 8, 1, 1, 8)  # fewer slots than experts


# --- rank loads -------------------------------------------------------------------------------------------


@given(st.integers(0, 2**32 - 1), st.sampled_from([(12, 16, 4, 2, 8), (12, 16, 1, 1, 4), (8, 8, 1, 1, 2)]))
def test_rank_loads_match_reference_exactly(seed, layout):
    n_experts, num_replicas, num_groups, num_nodes, num_gpus = layout
    rng = np.random.default_rng(seed)
    phy2log, logcnt = eplb_placement(rng.integers(0, 100, n_experts).astype(np.float64), num_replicas,
                                     num_groups, num_nodes, num_gpus)
    counts = rng.integers(0, 50, (7, n_experts))
    out_max, out_mean = np.empty(7), np.empty(7)
    rank_loads(counts, phy2log, logcnt, num_gpus, out_max, out_mean)
    ref_max, ref_mean = ref.rank_loads_reference(counts.tolist(), phy2log.tolist(), logcnt.tolist(), num_gpus)
    assert out_max.tolist() == ref_max
    assert out_mean.tolist() == ref_mean
    np.testing.assert_allclose(out_mean, counts.sum(axis=1) / num_gpus, rtol=1e-12)


# --- orchestration ----------------------------------------------------------------------------------------

COMMON = dict(n_experts=64, top_k=4, class_shares=[0.6, 0.4], tokens_per_step=256, ep_ranks=8,
              window_steps=200, eval_steps=400)


def paired_difference(a, b):
    diff = a["expert_efficiency_per_step"] - b["expert_efficiency_per_step"]
    return diff.mean(), diff.std(ddof=1) / math.sqrt(diff.size)


def test_replication_improves_efficiency_under_skew():
    skewed = dict(COMMON, class_skews=[1.2, 1.0])
    static = expert_efficiency(**skewed, redundant_experts=0, rng=np.random.default_rng(8))
    placed = expert_efficiency(**skewed, redundant_experts=16, rng=np.random.default_rng(8))
    assert static["placement"] == "static" and placed["placement"] == "eplb"
    gain, se = paired_difference(placed, static)
    assert gain > Z * se and placed["expert_efficiency"] > static["expert_efficiency"] + 0.1
    assert placed["max_rank_load_mean"] < static["max_rank_load_mean"]
    # Same laws and same eval draws (common random numbers): the touched experts are identical.
    assert np.array_equal(placed["distinct_experts_by_step"], static["distinct_experts_by_step"])


def test_replication_is_harmless_under_uniform_routing():
    uniform = dict(COMMON, class_skews=[0.0, 0.0])
    static = expert_efficiency(**uniform, redundant_experts=0, rng=np.random.default_rng(9))
    placed = expert_efficiency(**uniform, redundant_experts=8, rng=np.random.default_rng(9))
    gain, se = paired_difference(placed, static)
    assert gain >= -Z * se


def test_efficiency_outputs_are_consistent():
    out = expert_efficiency(**COMMON, class_skews=[0.8, 0.3], redundant_experts=8, rng=np.random.default_rng(10),
                            num_groups=8, num_nodes=2)
    per_step = out["expert_efficiency_per_step"]
    assert per_step.shape == (COMMON["eval_steps"],) and np.all((per_step > 0) & (per_step <= 1))
    assert out["expert_efficiency"] == pytest.approx(per_step.mean())
    assert out["mean_rank_load"] == 256 * 4 / 8
    assert out["expert_efficiency_ratio_of_sums"] == pytest.approx(out["mean_rank_load"] / out["max_rank_load_mean"])
    assert out["expert_efficiency_ratio_of_sums"] <= out["expert_efficiency"] + 1e-12  # Jensen
    assert 4 <= out["distinct_experts_per_step"] <= 64
    assert out["phy2log"].shape == (72,) and out["logcnt"].sum() == 72


def test_same_seed_same_bits_whatever_the_chunking(monkeypatch):
    args = dict(COMMON, class_skews=[1.0, 0.5], redundant_experts=8)
    first = expert_efficiency(**args, rng=np.random.default_rng(11))
    monkeypatch.setattr(orchestration, "CHUNK_STEPS", 7)
    second = expert_efficiency(**args, rng=np.random.default_rng(11))
    assert np.array_equal(first["expert_efficiency_per_step"], second["expert_efficiency_per_step"])
    assert np.array_equal(first["phy2log"], second["phy2log"])


@pytest.mark.parametrize("change, message", [
    (dict(redundant_experts=3), "divisible by ep_ranks"),
    (dict(top_k=65), "top_k"),
    (dict(class_skews=[1.0]), "class_skews"),
    (dict(num_nodes=3), "num_nodes"),
    (dict(num_groups=5), "num_groups"),
    (dict(tokens_per_step=0), "tokens_per_step"),
])
def test_invalid_inputs_raise_clear_errors(change, message):
    args = dict(COMMON, class_skews=[1.0, 0.5], redundant_experts=8, rng=np.random.default_rng(0))
    args.update(change)
    with pytest.raises(ValueError, match=message):
        expert_efficiency(**args)
