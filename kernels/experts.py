"""Experts per rank: token -> top-k expert draws, EPLB placement, per-GPU load per step.

The math of stage 4 in one place:

* :func:`build_alias` turns an expert-popularity vector into a Vose alias table, so that one expert draw
  costs one uniform and no search.
* :func:`route_steps` routes every token of every step to ``top_k`` *distinct* experts of its request
  class and counts token-expert assignments per (step, expert).
* :func:`eplb_placement` is a port of DeepSeek's expert-parallelism load balancer (deepseek-ai/EPLB,
  ``rebalance_experts``) for one MoE layer: it decides how many replicas each logical expert gets and which
  physical slot (hence which GPU) holds each replica.
* :func:`rank_loads` turns per-step expert counts and a placement into the max and mean GPU load per step,
  the two numbers behind ``expert_efficiency``.

Loads are in token-expert assignments (one token routed to one expert is one unit of expert FFN work).
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel


@kernel
def build_alias(weights, out_prob, out_alias):
    """Fill a Vose alias table for sampling index ``i`` with probability ``weights[i] / sum(weights)``.

    Parameters
    ----------
    weights : float64[E]
        Non-negative popularity weights (any scale; normalised here). At least one must be positive.
    out_prob : float64[E]
        Written: acceptance threshold of each column, in [0, 1].
    out_alias : int32[E] or int64[E]
        Written: the index returned when column ``i`` rejects (``out_alias[i] == i`` where
        ``out_prob[i] == 1``).

    Notes
    -----
    A draw picks column ``i`` uniformly and returns ``i`` with probability ``out_prob[i]``, else
    ``out_alias[i]``. Hence ``P(j) = (out_prob[j] + sum_{i: alias[i]=j, i != j} (1 - out_prob[i])) / E``,
    which equals the normalised weight up to rounding. Vose (1991): the "small" and "large" work lists keep
    the construction O(E) and numerically stable; columns left over at the end are exactly full (their
    residual differs from 1 only by rounding), so they get ``prob = 1``.

    Examples
    --------
    >>> import numpy as np
    >>> prob = np.empty(3); alias = np.empty(3, np.int64)
    >>> build_alias(np.array([1.0, 1.0, 2.0]), prob, alias)
    >>> prob.round(3).tolist(), alias.tolist()
    ([0.75, 0.75, 1.0], [2, 2, 2])
    """
    n = weights.shape[0]
    total = 0.0
    for i in range(n):
        if weights[i] < 0.0 or not np.isfinite(weights[i]):
            raise ValueError("build_alias: weights must be finite and non-negative")
        total += weights[i]
    if not total > 0.0:
        raise ValueError("build_alias: at least one weight must be positive")
    scaled = np.empty(n, np.float64)
    small = np.empty(n, np.int64)
    large = np.empty(n, np.int64)
    n_small = 0
    n_large = 0
    for i in range(n):
        scaled[i] = weights[i] * n / total
        if scaled[i] < 1.0:
            small[n_small] = i
            n_small += 1
        else:
            large[n_large] = i
            n_large += 1
    while n_small > 0 and n_large > 0:
        n_small -= 1
        lo = small[n_small]
        n_large -= 1
        hi = large[n_large]
        out_prob[lo] = scaled[lo]
        out_alias[lo] = hi
        # The large column gives away what fills the small one; it may become small itself.
        scaled[hi] = (scaled[hi] + scaled[lo]) - 1.0
        if scaled[hi] < 1.0:
            small[n_small] = hi
            n_small += 1
        else:
            large[n_large] = hi
            n_large += 1
    for j in range(n_large):
        out_prob[large[j]] = 1.0
        out_alias[large[j]] = large[j]
    for j in range(n_small):
        # Only rounding leaves a column here: its residual is 1 - O(eps).
        out_prob[small[j]] = 1.0
        out_alias[small[j]] = small[j]


@kernel
def route_steps(tokens_per_step, class_cdf, alias_prob, alias_idx, top_k, rng, out_counts):
    """Route every token of every step to ``top_k`` distinct experts and count assignments.

    Parameters
    ----------
    tokens_per_step : int
        Tokens entering the MoE layer per step (decode: the batch; prefill: the chunk).
    class_cdf : float64[C]
        Cumulative class mix (``class_cdf[-1] == 1``); a token belongs to class ``c`` with probability
        ``class_cdf[c] - class_cdf[c - 1]``.
    alias_prob, alias_idx : float64[C, E], int32/int64[C, E]
        One alias table per class (:func:`build_alias`); each class's popularity law must have at least
        ``top_k`` experts with positive weight.
    top_k : int
        Experts per token (``1 <= top_k <= E``).
    rng : numpy.random.Generator
        Advanced in place.
    out_counts : int64[n_steps, E]
        Overwritten: ``out_counts[s, e]`` = tokens of step ``s`` routed to expert ``e``. ``n_steps`` is
        ``out_counts.shape[0]``; each row sums to ``tokens_per_step * top_k``.

    Notes
    -----
    *Law.* The ``top_k`` experts of a token are drawn one after the other from the class's popularity law;
    a draw that repeats an expert already chosen for this token is rejected and redrawn. Conditional on
    the experts chosen so far (set ``S``), the accepted draw is ``j`` with probability
    ``w_j / sum_{i not in S} w_i``: rejecting duplicates is exactly conditioning on "not in S". This is
    sequential proportional sampling without replacement, i.e. the Plackett-Luce law, with no bias
    from the rejection. It is also the law of the top-k of ``log w_i + Gumbel`` noise, the usual model of a
    noisy router's top-k. Note that inclusion probabilities are *not* ``k * w_i`` (hot experts saturate
    at 1); the reference module computes them exactly.

    *Cost.* One uniform per draw: ``x = u * E`` gives the column ``floor(x)`` and the fraction
    ``x - floor(x)`` (about 53 - log2(E) bits) compared with the column's threshold; ``u < 1`` keeps
    ``floor(x) <= E - 1`` under round-to-nearest. The class costs one more uniform per token (none with a
    single class). The loop is written without data-dependent branches: the accept/alias choice indexes
    a two-entry table instead of branching (a branch on a coin flip mispredicts about half the time under
    skew), and duplicates are detected with a per-token stamp per expert. The expected number of draws
    per token exceeds ``top_k`` only by the rejected duplicates, which matter only under extreme skew
    (they cost time, never accuracy).
    """
    n_steps = out_counts.shape[0]
    n_experts = out_counts.shape[1]
    n_classes = class_cdf.shape[0]
    if top_k < 1 or top_k > n_experts:
        raise ValueError("route_steps: top_k must be in [1, n_experts]")
    if alias_prob.shape[0] != n_classes or alias_prob.shape[1] != n_experts:
        raise ValueError("route_steps: alias_prob must be [n_classes, n_experts]")
    if alias_idx.shape[0] != n_classes or alias_idx.shape[1] != n_experts:
        raise ValueError("route_steps: alias_idx must be [n_classes, n_experts]")
    # pick[c, 2*col + accepted]: the expert a draw of column col yields (alias if rejected, col if kept).
    pick = np.empty((n_classes, 2 * n_experts), np.int64)
    for c in range(n_classes):
        for col in range(n_experts):
            pick[c, 2 * col] = alias_idx[c, col]
            pick[c, 2 * col + 1] = col
    # stamp[e] == token  <=>  expert e is already among this token's choices.
    stamp = np.full(n_experts, -1, np.int64)
    scale = float(n_experts)
    out_counts[:, :] = 0
    token = 0
    for s in range(n_steps):
        row = out_counts[s]
        for _ in range(tokens_per_step):
            c = 0
            if n_classes > 1:
                u = rng.random()
                for j in range(n_classes - 1):
                    c += np.int64(u >= class_cdf[j])
            prob = alias_prob[c]
            pk = pick[c]
            n_chosen = 0
            while n_chosen < top_k:
                x = rng.random() * scale
                col = int(x)
                e = pk[2 * col + np.int64(x - col < prob[col])]
                fresh = np.int64(stamp[e] != token)
                stamp[e] = token
                row[e] += fresh
                n_chosen += fresh
            token += 1


@kernel
def rank_loads(counts, phy2log, logcnt, num_gpus, out_max, out_mean):
    """Max and mean GPU load per step for a placement.

    Parameters
    ----------
    counts : int64[n_steps, E]
        Token-expert assignments per step and logical expert (:func:`route_steps`).
    phy2log : int64[R]
        Logical expert held by each physical slot; slot ``p`` lives on GPU ``p // (R // num_gpus)``.
    logcnt : int64[E]
        Replicas per logical expert (how many slots hold it).
    num_gpus : int
        EP ranks; must divide ``R``.
    out_max, out_mean : float64[n_steps]
        Written: the largest and the mean GPU load of each step, in token-expert assignments.

    Notes
    -----
    A logical expert's tokens are split evenly among its replicas (fractional loads), as an inference
    engine spreading tokens over replicas round-robin or at random does on average. Per GPU the slot
    loads are summed in slot order.
    """
    n_steps = counts.shape[0]
    n_slots = phy2log.shape[0]
    if num_gpus < 1 or n_slots % num_gpus != 0:
        raise ValueError("rank_loads: num_gpus must divide the number of physical slots")
    slots_per_gpu = n_slots // num_gpus
    gpu_load = np.empty(num_gpus, np.float64)
    for s in range(n_steps):
        for g in range(num_gpus):
            load = 0.0
            for p in range(g * slots_per_gpu, (g + 1) * slots_per_gpu):
                e = phy2log[p]
                load += counts[s, e] / logcnt[e]
            gpu_load[g] = load
        top = gpu_load[0]
        total = 0.0
        for g in range(num_gpus):
            total += gpu_load[g]
            if gpu_load[g] > top:
                top = gpu_load[g]
        out_max[s] = top
        out_mean[s] = total / num_gpus


# --------------------------------------------------------------------------------------------------------
# EPLB (deepseek-ai/EPLB, eplb.py), one layer. Arithmetic is float32 like the original (it calls
# ``weight.float()``), so ties and near-ties resolve as there. Sorting is descending and stable (equal
# weights keep index order), which is what torch's CPU sort does on the short rows of the README example.
# --------------------------------------------------------------------------------------------------------


@kernel
def _balanced_packing(weight, num_packs, out_pack, out_rank):
    """Greedy balanced packing of ``n`` items into ``num_packs`` packs of exactly ``n / num_packs`` items.

    Items go heaviest first to the lightest pack that still has room (first such pack on ties).
    ``weight`` is float32[n]; ``out_pack`` and ``out_rank`` (int64[n]) get each item's pack and its
    position inside the pack.
    """
    n = weight.shape[0]
    per_pack = n // num_packs
    if per_pack == 1:
        for i in range(n):
            out_pack[i] = i
            out_rank[i] = 0
        return
    order = np.argsort(-weight, kind="mergesort")
    pack_weight = np.zeros(num_packs, np.float32)
    pack_items = np.zeros(num_packs, np.int64)
    for item in order:
        best = -1
        for p in range(num_packs):
            if pack_items[p] < per_pack and (best < 0 or pack_weight[p] < pack_weight[best]):
                best = p
        out_pack[item] = best
        out_rank[item] = pack_items[best]
        pack_weight[best] += weight[item]
        pack_items[best] += 1


@kernel
def _replicate_experts(weight, num_phy, out_phy2log, out_rank, out_logcnt):
    """Give ``num_phy - n`` extra replicas, one at a time, to the expert with the largest load per replica.

    ``weight`` is float32[n]; writes ``out_phy2log`` (int64[num_phy]: slots ``0..n-1`` hold experts
    ``0..n-1``, later slots the replicas), ``out_rank`` (replica number of each slot) and ``out_logcnt``.
    Ties go to the lowest expert index (first maximum).
    """
    n = weight.shape[0]
    for i in range(n):
        out_phy2log[i] = i
        out_rank[i] = 0
        out_logcnt[i] = 1
    for i in range(n, num_phy):
        best = 0
        best_load = weight[0] / np.float32(out_logcnt[0])
        for e in range(1, n):
            load = weight[e] / np.float32(out_logcnt[e])
            if load > best_load:
                best = e
                best_load = load
        out_phy2log[i] = best
        out_rank[i] = out_logcnt[best]
        out_logcnt[best] += 1


@kernel
def eplb_placement(weight, num_replicas, num_groups, num_nodes, num_gpus):
    """Replicate and place the experts of one MoE layer as DeepSeek's EPLB does.

    Parameters
    ----------
    weight : float64[E] or int64[E]
        Load of each logical expert over a past window (token-expert assignments).
    num_replicas : int
        Physical expert slots in total (``E`` + redundant), a multiple of ``num_gpus``.
    num_groups : int
        Expert groups (device-limited routing groups); must divide ``E``.
    num_nodes : int
        Server nodes (fast intra-node links); must divide ``num_gpus``.
    num_gpus : int
        EP ranks.

    Returns
    -------
    phy2log : int64[num_replicas]
        Logical expert held by each physical slot; slot ``p`` is on GPU ``p // (num_replicas // num_gpus)``.
    logcnt : int64[E]
        Replicas per logical expert (each >= 1, summing to ``num_replicas``).

    Notes
    -----
    Hierarchical policy when ``num_groups % num_nodes == 0``: (1) pack expert groups onto nodes with
    balanced total load, the same number of groups per node; (2) inside each node, replicate experts
    greedily by load per replica until the node's slots are used; (3) pack the node's physical experts
    onto its GPUs, balanced, the same number per GPU. Otherwise the global policy: the same with one group
    and one node. Faithful to ``rebalance_experts`` in deepseek-ai/EPLB, including float32 arithmetic and
    first-index tie-breaking; sorts are stable (torch's CPU sort agrees on rows of up to 16 items; on
    longer rows torch leaves the order of exactly equal weights unspecified).

    Examples
    --------
    >>> import numpy as np
    >>> w = np.array([90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86], np.float64)
    >>> eplb_placement(w, 16, 4, 2, 8)[0].tolist()
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1]
    """
    num_log = weight.shape[0]
    if num_groups % num_nodes != 0:
        num_groups = 1
        num_nodes = 1
    if num_groups < 1 or num_log % num_groups != 0:
        raise ValueError("eplb_placement: num_groups must divide the number of experts")
    if num_nodes < 1 or num_gpus % num_nodes != 0:
        raise ValueError("eplb_placement: num_nodes must divide num_gpus")
    if num_replicas % num_gpus != 0 or num_replicas < num_log:
        raise ValueError("eplb_placement: num_replicas must be a multiple of num_gpus and >= experts")
    w32 = weight.astype(np.float32)
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    phy_per_gpu = num_replicas // num_gpus
    log_per_node = num_log // num_nodes
    phy_per_node = num_replicas // num_nodes
    gpus_per_node = num_gpus // num_nodes

    # Step 1: groups to nodes. mlog ("meta-logical") numbers experts node by node.
    group_load = np.zeros(num_groups, np.float32)
    for g in range(num_groups):
        for j in range(group_size):
            group_load[g] += w32[g * group_size + j]
    group_pack = np.empty(num_groups, np.int64)
    group_rank = np.empty(num_groups, np.int64)
    _balanced_packing(group_load, num_nodes, group_pack, group_rank)
    log2mlog = np.empty(num_log, np.int64)
    mlog2log = np.empty(num_log, np.int64)
    for e in range(num_log):
        g = e // group_size
        m = (group_pack[g] * groups_per_node + group_rank[g]) * group_size + e % group_size
        log2mlog[e] = m
        mlog2log[m] = e

    # Step 2: replicas inside each node; step 3: the node's physical experts onto its GPUs.
    mlogcnt = np.empty(num_log, np.int64)
    phy2log = np.empty(num_replicas, np.int64)
    node_weight = np.empty(log_per_node, np.float32)
    phy2mlog = np.empty(phy_per_node, np.int64)
    phyrank = np.empty(phy_per_node, np.int64)
    node_cnt = np.empty(log_per_node, np.int64)
    phy_load = np.empty(phy_per_node, np.float32)
    pack = np.empty(phy_per_node, np.int64)
    rank_in_pack = np.empty(phy_per_node, np.int64)
    for node in range(num_nodes):
        for j in range(log_per_node):
            node_weight[j] = w32[mlog2log[node * log_per_node + j]]
        _replicate_experts(node_weight, phy_per_node, phy2mlog, phyrank, node_cnt)
        for j in range(log_per_node):
            mlogcnt[node * log_per_node + j] = node_cnt[j]
        for q in range(phy_per_node):
            m = phy2mlog[q]
            phy_load[q] = node_weight[m] / np.float32(node_cnt[m])
        _balanced_packing(phy_load, gpus_per_node, pack, rank_in_pack)
        for q in range(phy_per_node):
            slot = pack[q] * phy_per_gpu + rank_in_pack[q]
            phy2log[node * phy_per_node + slot] = mlog2log[node * log_per_node + phy2mlog[q]]
    logcnt = np.empty(num_log, np.int64)
    for e in range(num_log):
        logcnt[e] = mlogcnt[log2mlog[e]]
    return phy2log, logcnt
