"""Slow, obviously-correct references for the experts-per-rank stage (:mod:`mcsim.kernels.experts`).

Plain Python loops and ``random.Random``; no Numba, no alias tables. Tests compare the kernels with these
functions and with the exact laws computed here.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def alias_table_probabilities(prob, alias):
    """Probability of each outcome of an alias table, read back from the table.

    Column ``i`` is picked with probability ``1/E``; it yields ``i`` with probability ``prob[i]`` and
    ``alias[i]`` otherwise.

    Parameters
    ----------
    prob : sequence of float, length E
    alias : sequence of int, length E

    Returns
    -------
    list of float
        ``P(outcome == j)`` for ``j`` in ``range(E)``.
    """
    n = len(prob)
    out = [0.0] * n
    for i in range(n):
        out[i] += prob[i] / n
        out[int(alias[i])] += (1.0 - prob[i]) / n
    return out


def plackett_luce_set_probabilities(weights, top_k):
    """Exact law of the set of ``top_k`` distinct items drawn one by one proportionally to ``weights``.

    Enumerates every ordered sequence of distinct items: the sequence ``(i1, ..., ik)`` has probability
    ``prod_j w_ij / (W - w_i1 - ... - w_i(j-1))``. Exponential in ``top_k``; for small cases only.

    Returns
    -------
    dict
        ``frozenset`` of item indices -> probability.
    """
    n = len(weights)
    total = float(sum(weights))
    law = {}
    for sequence in itertools.permutations(range(n), top_k):
        p = 1.0
        remaining = total
        for item in sequence:
            if remaining <= 0.0:
                p = 0.0
                break
            p *= weights[item] / remaining
            remaining -= weights[item]
        if p > 0.0:
            key = frozenset(sequence)
            law[key] = law.get(key, 0.0) + p
    return law


def plackett_luce_inclusion(weights, top_k):
    """Exact probability that each item is among the ``top_k`` distinct proportional draws.

    Returns
    -------
    list of float
        One probability per item; they sum to ``top_k``.
    """
    inclusion = [0.0] * len(weights)
    for chosen, p in plackett_luce_set_probabilities(weights, top_k).items():
        for item in chosen:
            inclusion[item] += p
    return inclusion


def route_steps_reference(tokens_per_step, class_shares, class_weights, top_k, n_steps, rng):
    """Route tokens to ``top_k`` distinct experts with ``random.choices``, one draw at a time.

    Each token draws its class from ``class_shares``, then ``top_k`` experts one after the other,
    each proportionally to the class weights of the experts not chosen yet.

    Parameters
    ----------
    tokens_per_step : int
    class_shares : sequence of float, length C
    class_weights : sequence of sequences of float, C x E
    top_k : int
    n_steps : int
    rng : random.Random

    Returns
    -------
    list of list of int
        ``counts[s][e]``: tokens of step ``s`` routed to expert ``e``.
    """
    n_experts = len(class_weights[0])
    experts = list(range(n_experts))
    classes = list(range(len(class_shares)))
    counts = []
    for _ in range(n_steps):
        row = [0] * n_experts
        for _ in range(tokens_per_step):
            c = rng.choices(classes, weights=class_shares)[0]
            remaining = list(class_weights[c])
            for _ in range(top_k):
                e = rng.choices(experts, weights=remaining)[0]
                row[e] += 1
                remaining[e] = 0.0
        counts.append(row)
    return counts


# ---------------------------------------------------------------------------------------------------------
# EPLB, written as close to deepseek-ai/EPLB's eplb.py as plain Python allows (one layer). float32 as there.
# ---------------------------------------------------------------------------------------------------------


def _balanced_packing(weight, num_packs):
    """eplb.py ``balanced_packing`` for one row: returns (pack_index, rank_in_pack) lists."""
    n = len(weight)
    groups_per_pack = n // num_packs
    if groups_per_pack == 1:
        return list(range(n)), [0] * n
    # Stable descending sort: equal weights keep index order.
    indices = sorted(range(n), key=lambda i: -weight[i])
    pack_index = [-1] * n
    rank_in_pack = [-1] * n
    pack_weights = [np.float32(0.0)] * num_packs
    pack_items = [0] * num_packs
    for group in indices:
        pack = min((i for i in range(num_packs) if pack_items[i] < groups_per_pack), key=pack_weights.__getitem__)
        pack_index[group] = pack
        rank_in_pack[group] = pack_items[pack]
        pack_weights[pack] = np.float32(pack_weights[pack] + weight[group])
        pack_items[pack] += 1
    return pack_index, rank_in_pack


def _replicate_experts(weight, num_phy):
    """eplb.py ``replicate_experts`` for one row: returns (phy2log, rank, logcnt) lists."""
    num_log = len(weight)
    phy2log = list(range(num_phy))
    rank = [0] * num_phy
    logcnt = [1] * num_log
    for i in range(num_log, num_phy):
        loads = [np.float32(weight[e] / np.float32(logcnt[e])) for e in range(num_log)]
        best = loads.index(max(loads))  # first maximum, as torch.max(dim).indices
        phy2log[i] = best
        rank[i] = logcnt[best]
        logcnt[best] += 1
    return phy2log, rank, logcnt


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def eplb_placement_reference(weight, num_replicas, num_groups, num_nodes, num_gpus):
    """EPLB ``rebalance_experts`` for one layer, in plain Python.

    Parameters and returns as :func:`mcsim.kernels.experts.eplb_placement`, as lists.
    """
    if num_groups % num_nodes != 0:
        num_groups, num_nodes = 1, 1  # global load-balance policy
    weight = [np.float32(w) for w in weight]
    num_log = len(weight)
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    phy_experts_per_gpu = num_replicas // num_gpus
    log_per_node = num_log // num_nodes
    phy_per_node = num_replicas // num_nodes

    # Step 1: pack groups to nodes.
    tokens_per_group = []
    for g in range(num_groups):
        total = np.float32(0.0)
        for j in range(group_size):
            total = np.float32(total + weight[g * group_size + j])
        tokens_per_group.append(total)
    group_pack_index, group_rank_in_pack = _balanced_packing(tokens_per_group, num_nodes)
    log2mlog = []
    for g in range(num_groups):
        for j in range(group_size):
            log2mlog.append((group_pack_index[g] * groups_per_node + group_rank_in_pack[g]) * group_size + j)
    mlog2log = _inverse(log2mlog)

    # Step 2: construct redundant experts within nodes. Step 3: pack physical experts to GPUs.
    pphy2log = []
    mlogcnt = []
    for node in range(num_nodes):
        tokens_per_mlog = [weight[mlog2log[node * log_per_node + j]] for j in range(log_per_node)]
        phy2mlog, _, node_cnt = _replicate_experts(tokens_per_mlog, phy_per_node)
        mlogcnt.extend(node_cnt)
        tokens_per_phy = [np.float32(tokens_per_mlog[m] / np.float32(node_cnt[m])) for m in phy2mlog]
        pack_index, rank_in_pack = _balanced_packing(tokens_per_phy, num_gpus // num_nodes)
        phy2pphy = [pack_index[q] * phy_experts_per_gpu + rank_in_pack[q] for q in range(phy_per_node)]
        pphy2phy = _inverse(phy2pphy)
        for slot in range(phy_per_node):
            pphy2mlog = phy2mlog[pphy2phy[slot]] + node * log_per_node
            pphy2log.append(mlog2log[pphy2mlog])
    logcnt = [mlogcnt[log2mlog[e]] for e in range(num_log)]
    return pphy2log, logcnt


def rank_loads_reference(counts, phy2log, logcnt, num_gpus):
    """Max and mean GPU load per step: each expert's tokens split evenly over its replicas.

    Returns
    -------
    (list of float, list of float)
        Per step, the largest and the mean GPU load (token-expert assignments).
    """
    slots_per_gpu = len(phy2log) // num_gpus
    maxima, means = [], []
    for row in counts:
        loads = []
        for g in range(num_gpus):
            load = 0.0
            for p in range(g * slots_per_gpu, (g + 1) * slots_per_gpu):
                e = int(phy2log[p])
                load += int(row[e]) / int(logcnt[e])
            loads.append(load)
        total = 0.0
        for load in loads:
            total += load
        maxima.append(max(loads))
        means.append(total / num_gpus)
    return maxima, means


def expected_max_rank_load_uniform(n_experts, top_k, tokens, n_ranks):
    """Exact expected max rank load for uniform routing and the static contiguous placement.

    Each token picks ``top_k`` distinct experts uniformly among ``n_experts``; rank ``r`` holds experts
    ``r*m .. r*m + m - 1`` (``m = n_experts / n_ranks``). A token puts ``h_r`` assignments on rank ``r``
    with the multivariate hypergeometric probability ``prod_r C(m, h_r) / C(E, k)``; tokens are
    independent. The loads are propagated token by token as a distribution over *sorted* load vectors,
    which is exact because the per-token law is exchangeable across ranks. No simulation.

    Returns
    -------
    float
        ``E[max_r load_r]`` for one step of ``tokens`` tokens.
    """
    m = n_experts // n_ranks
    norm = math.comb(n_experts, top_k)
    patterns = []
    for hits in itertools.product(range(min(m, top_k) + 1), repeat=n_ranks):
        if sum(hits) == top_k:
            p = 1.0
            for h in hits:
                p *= math.comb(m, h)
            patterns.append((hits, p / norm))
    law = {tuple([0] * n_ranks): 1.0}
    for _ in range(tokens):
        nxt = {}
        for loads, p in law.items():
            for hits, q in patterns:
                key = tuple(sorted(a + b for a, b in zip(loads, hits)))
                nxt[key] = nxt.get(key, 0.0) + p * q
        law = nxt
    return sum(p * max(loads) for loads, p in law.items())

