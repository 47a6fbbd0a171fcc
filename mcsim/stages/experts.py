"""Experts per rank: how evenly MoE token traffic spreads over expert-parallel GPUs.

Stage 4 of the model. Each token of a step picks ``top_k`` distinct experts from a popularity law that
depends on its request class (Zipf over a per-class permutation of the experts, so different classes heat
different experts). Experts live on EP ranks, either statically (expert ``e`` on rank
``e // (E / ranks)``) or placed by DeepSeek's EPLB from the loads of a *past* window, with redundant slots
replicating the hottest experts. The slowest rank sets the step, so the figure of merit is
``expert_efficiency`` = mean rank load / max rank load.

The loops live in :mod:`mcsim.kernels.experts`; this module validates inputs, builds the popularity laws,
calls the kernels in bounded chunks and interprets the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcsim.kernels.experts import build_alias, eplb_placement, rank_loads, route_steps
from mcsim.scenario.choices import instance_gpus
from mcsim.scenario.schema import ScenarioError

@dataclass(frozen=True)
class Inputs:
    """The parameters the expert stage reads (also its memo key within a sample)."""

    experts: int
    top_k: int
    class_shares: tuple
    class_skews: tuple
    tokens_per_step: int
    ep_ranks: int
    redundant_experts: int
    window_steps: int
    eval_steps: int
    groups: int
    nodes: int

    @classmethod
    def from_params(cls, p: dict, classes, batch_per_gpu: float) -> "Inputs":
        """``batch_per_gpu``: decode sequences per GPU that fit in memory (sets the step's tokens by default)."""
        ep = p["moe.ep_ranks"] or instance_gpus(p)
        tokens = p["moe.tokens_per_step"]
        if tokens <= 0:
            tokens = int(max(1, min(p["deployment.max_batch_per_gpu"], batch_per_gpu))) * ep
        shares = np.array([p[f"workload.classes.{c}.share"] for c in classes], dtype=float)
        steps = int(p["moe.window_steps"]) + int(p["moe.eval_steps"])
        work = steps * int(tokens) * int(p["model.active_experts"])
        if p["model.experts"] > 0 and work > MAX_ASSIGNMENTS:
            raise ScenarioError("", "moe.window_steps", f"({p['moe.window_steps']} + {p['moe.eval_steps']} "
                                f"eval steps) x {int(tokens):,} tokens x {p['model.active_experts']} experts = "
                                f"{work:.3g} token-expert assignments per sample; at most {MAX_ASSIGNMENTS:.0e} "
                                "(about 20 s of routing) are drawn: use fewer steps or moe.tokens_per_step")
        return cls(int(p["model.experts"]), int(p["model.active_experts"]), tuple(shares / shares.sum()),
                   tuple(float(p[f"workload.classes.{c}.expert_skew"]) for c in classes), int(tokens), int(ep),
                   int(p["moe.redundant_experts"]), int(p["moe.window_steps"]), int(p["moe.eval_steps"]),
                   int(p["moe.groups"]), int(p["moe.nodes"]))

__all__ = ["zipf_popularity", "class_popularity", "expert_efficiency"]

#: Token-expert assignments one sample may route (window + eval steps x tokens x top-k): ~20 s at the kernel's
#: ~100 M assignments/s/core.
MAX_ASSIGNMENTS = 2e9

#: Steps routed per kernel call; bounds the per-step count buffer to ``CHUNK_STEPS x E`` int64.
CHUNK_STEPS = 256


def zipf_popularity(n_experts, skew):
    """Zipf weights ``r ** -skew`` for popularity ranks ``r = 1..n_experts`` (0 = uniform), normalised.

    Parameters
    ----------
    n_experts : int
    skew : float
        Zipf exponent, >= 0.

    Returns
    -------
    numpy.ndarray
        float64[n_experts], summing to 1, non-increasing.

    Examples
    --------
    >>> zipf_popularity(4, 0.0).tolist()
    [0.25, 0.25, 0.25, 0.25]
    """
    ranks = np.arange(1, n_experts + 1, dtype=np.float64)
    weights = ranks ** (-float(skew))
    return weights / weights.sum()


def class_popularity(n_experts, class_skews, rng):
    """One popularity law per request class: Zipf over a random permutation of the experts.

    Parameters
    ----------
    n_experts : int
    class_skews : sequence of float
        Zipf exponent per class (0 = uniform).
    rng : numpy.random.Generator
        Draws one permutation per class (always, even for skew 0, so the stream consumed does not
        depend on the skews).

    Returns
    -------
    numpy.ndarray
        float64[C, n_experts]; row ``c`` sums to 1 and its ``r``-th most popular expert is
        ``perm_c[r]``.
    """
    laws = np.empty((len(class_skews), n_experts), np.float64)
    for c, skew in enumerate(class_skews):
        perm = rng.permutation(n_experts)
        laws[c, perm] = zipf_popularity(n_experts, skew)
    return laws


def _route_chunked(route_steps, n_steps, tokens_per_step, class_cdf, alias_prob, alias_idx, top_k, rng, n_experts):
    """Yield per-step count blocks of at most :data:`CHUNK_STEPS` steps (same draws as one big call)."""
    buffer = np.empty((min(CHUNK_STEPS, max(n_steps, 1)), n_experts), np.int64)
    done = 0
    while done < n_steps:
        size = min(CHUNK_STEPS, n_steps - done)
        block = buffer[:size]
        route_steps(tokens_per_step, class_cdf, alias_prob, alias_idx, top_k, rng, block)
        yield done, block
        done += size


def _validate(n_experts, top_k, class_shares, class_skews, tokens_per_step, ep_ranks, redundant_experts,
              window_steps, eval_steps, num_groups, num_nodes):
    def need(condition, message):
        if not condition:
            raise ValueError(f"expert_efficiency: {message}")

    need(int(n_experts) == n_experts and n_experts >= 1, f"n_experts must be a positive integer, got {n_experts}")
    need(int(top_k) == top_k and 1 <= top_k <= n_experts, f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
    shares = np.asarray(class_shares, np.float64)
    skews = np.asarray(class_skews, np.float64)
    need(shares.ndim == 1 and shares.size >= 1, "class_shares must be a non-empty 1-D sequence")
    need(skews.shape == shares.shape,
         f"class_skews has {skews.size} entries but class_shares has {shares.size}")
    need(np.all(np.isfinite(shares)) and np.all(shares >= 0) and shares.sum() > 0,
         f"class_shares must be finite, >= 0 and not all 0, got {shares.tolist()}")
    need(np.all(np.isfinite(skews)) and np.all(skews >= 0), f"class_skews must be finite and >= 0, got {skews.tolist()}")
    need(int(tokens_per_step) == tokens_per_step and tokens_per_step >= 1,
         f"tokens_per_step must be a positive integer, got {tokens_per_step}")
    need(int(ep_ranks) == ep_ranks and ep_ranks >= 1, f"ep_ranks must be a positive integer, got {ep_ranks}")
    need(int(redundant_experts) == redundant_experts and redundant_experts >= 0,
         f"redundant_experts must be an integer >= 0, got {redundant_experts}")
    num_replicas = n_experts + redundant_experts
    need(redundant_experts == 0 or num_replicas % ep_ranks == 0,
         f"n_experts + redundant_experts = {num_replicas} physical expert slots must be divisible by "
         f"ep_ranks = {ep_ranks} (every rank holds the same number of slots)")
    need(int(window_steps) == window_steps and window_steps >= 1,
         f"window_steps must be a positive integer, got {window_steps}")
    need(int(eval_steps) == eval_steps and eval_steps >= 1, f"eval_steps must be a positive integer, got {eval_steps}")
    need(int(num_groups) == num_groups and num_groups >= 1 and n_experts % num_groups == 0,
         f"num_groups must divide n_experts = {n_experts}, got {num_groups}")
    need(int(num_nodes) == num_nodes and num_nodes >= 1 and ep_ranks % num_nodes == 0,
         f"num_nodes must divide ep_ranks = {ep_ranks}, got {num_nodes}")
    return shares / shares.sum(), skews


def expert_efficiency(n_experts, top_k, class_shares, class_skews, tokens_per_step, ep_ranks, redundant_experts,
                      window_steps, eval_steps, rng, num_groups=1, num_nodes=1):
    """Expert efficiency of one MoE layer: route past steps, place experts, measure rank loads on new steps.

    Parameters
    ----------
    n_experts : int
        Routed (logical) experts ``E``.
    top_k : int
        Distinct experts per token.
    class_shares : sequence of float
        Share of tokens per request class (normalised here).
    class_skews : sequence of float
        Zipf exponent of each class's expert popularity (0 = uniform routing).
    tokens_per_step : int
        Tokens entering the layer per step (decode batch, or prefill chunk).
    ep_ranks : int
        Expert-parallel GPUs.
    redundant_experts : int
        Extra physical slots for replicas. 0 = no replication and the static contiguous placement
        ``e -> e * ep_ranks // E`` (no workload-aware placement: the baseline; ranks may hold unequal numbers of
        experts when ``ep_ranks`` does not divide ``E``). > 0 = EPLB placement
        of ``E + redundant_experts`` slots fitted to the window.
    window_steps : int
        Past steps whose total per-expert counts drive the placement.
    eval_steps : int
        New steps (fresh draws, placement not re-fitted) on which loads are measured.
    rng : numpy.random.Generator
        Consumed in this order: one permutation per class, the window, the eval steps. The window is
        routed whatever ``redundant_experts`` is, so two calls with equally seeded generators see the same
        laws and the same eval steps (common random numbers across variants).
    num_groups, num_nodes : int, optional
        EPLB expert groups and server nodes; hierarchical policy when ``num_groups % num_nodes == 0``
        (the default 1, 1 is the global policy). ``num_nodes`` must divide ``ep_ranks``.

    Returns
    -------
    dict
        ``expert_efficiency`` : float
            Mean over eval steps of (mean GPU load / max GPU load) of the step, in (0, 1].
        ``expert_efficiency_per_step`` : float64[eval_steps]
            That ratio per step.
        ``expert_efficiency_ratio_of_sums`` : float
            Sum of mean loads / sum of max loads: the time-weighted variant (if step time is
            proportional to the max load, it is useful work / time). With a constant ``tokens_per_step``
            it never exceeds ``expert_efficiency`` (Jensen); the two differ by the step-to-step spread of
            the max load.
        ``max_rank_load_mean`` : float
            Mean over eval steps of the busiest GPU's load (token-expert assignments).
        ``mean_rank_load`` : float
            ``tokens_per_step * top_k / ep_ranks`` (every step).
        ``distinct_experts_per_step`` : float
            Mean over eval steps of the logical experts with at least one token (weights touched; for the
            roofline).
        ``distinct_experts_by_step`` : int64[eval_steps]
        ``phy2log`` : int64[E + redundant_experts]
            Logical expert held by each slot (slot ``p`` on GPU ``p // slots_per_gpu``).
        ``logcnt`` : int64[E]
            Replicas per logical expert.
        ``placement`` : str
            ``"static"`` or ``"eplb"``.

    Notes
    -----
    The per-step mean of ratios answers "how balanced is a typical step"; the ratio of sums answers "what
    fraction of expert-GPU time is useful". The headline is the former, both are returned. Tokens of a
    replicated expert are split evenly over its replicas (fractional loads). EPLB works in float32, so
    window counts above 2**24 per expert would lose integer precision there (far beyond typical windows).

    Examples
    --------
    >>> import numpy as np
    >>> out = expert_efficiency(64, 4, [1.0], [1.0], 256, 8, 8, 50, 50, np.random.default_rng(0))
    >>> 0 < out["expert_efficiency"] <= 1
    True
    """
    shares, skews = _validate(n_experts, top_k, class_shares, class_skews, tokens_per_step, ep_ranks,
                              redundant_experts, window_steps, eval_steps, num_groups, num_nodes)
    n_experts, top_k, tokens_per_step = int(n_experts), int(top_k), int(tokens_per_step)
    ep_ranks, redundant_experts = int(ep_ranks), int(redundant_experts)
    window_steps, eval_steps = int(window_steps), int(eval_steps)

    laws = class_popularity(n_experts, skews, rng)
    alias_prob = np.empty((laws.shape[0], n_experts), np.float64)
    alias_idx = np.empty((laws.shape[0], n_experts), np.int64)
    for c in range(laws.shape[0]):
        build_alias(laws[c], alias_prob[c], alias_idx[c])
    class_cdf = np.cumsum(shares)
    class_cdf[-1] = 1.0

    window_load = np.zeros(n_experts, np.int64)
    for _, block in _route_chunked(route_steps, window_steps, tokens_per_step, class_cdf, alias_prob, alias_idx,
                                   top_k, rng, n_experts):
        window_load += block.sum(axis=0)

    static_rank = None
    if redundant_experts == 0:
        placement = "static"
        phy2log = np.arange(n_experts, dtype=np.int64)
        logcnt = np.ones(n_experts, np.int64)
        if n_experts % ep_ranks:
            # Uneven contiguous placement (e.g. 256 experts on EP144): some ranks hold one expert more.
            static_rank = np.zeros((n_experts, ep_ranks))
            static_rank[np.arange(n_experts), np.arange(n_experts) * ep_ranks // n_experts] = 1.0
    else:
        placement = "eplb"
        phy2log, logcnt = eplb_placement(window_load.astype(np.float64), n_experts + redundant_experts,
                                         int(num_groups), int(num_nodes), ep_ranks)

    max_load = np.empty(eval_steps, np.float64)
    mean_load = np.empty(eval_steps, np.float64)
    distinct = np.empty(eval_steps, np.int64)
    for start, block in _route_chunked(route_steps, eval_steps, tokens_per_step, class_cdf, alias_prob, alias_idx,
                                       top_k, rng, n_experts):
        stop = start + block.shape[0]
        if static_rank is None:
            rank_loads(block, phy2log, logcnt, ep_ranks, max_load[start:stop], mean_load[start:stop])
        else:
            loads = block @ static_rank
            max_load[start:stop] = loads.max(axis=1)
            mean_load[start:stop] = loads.mean(axis=1)
        distinct[start:stop] = np.count_nonzero(block, axis=1)

    per_step = mean_load / max_load
    return {
        "expert_efficiency": float(per_step.mean()),
        "expert_efficiency_per_step": per_step,
        "expert_efficiency_ratio_of_sums": float(mean_load.sum() / max_load.sum()),
        "max_rank_load_mean": float(max_load.mean()),
        "mean_rank_load": tokens_per_step * top_k / ep_ranks,
        "distinct_experts_per_step": float(distinct.mean()),
        "distinct_experts_by_step": distinct,
        "phy2log": phy2log,
        "logcnt": logcnt,
        "placement": placement,
    }
