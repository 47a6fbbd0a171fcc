"""Memory projection and operating point on top of the roofline's step cost.

Split from :mod:`mcsim.perf.roofline`: the roofline prices one step; this module answers how many sequences fit
in HBM and the largest batch that meets a TPOT target. The batching simulator's step-time table is built from the
sample's step model (:func:`mcsim.perf.latency.step_table`), so it prices exactly the steps the throughput and
cost path prices.
"""

from __future__ import annotations

import math

from mcsim.perf.hardware import as_hardware
from mcsim.perf.roofline import (
    ROUTER_WEIGHT_BYTES,
    Memory,
    OperatingPoint,
    Parallelism,
    Precision,
    _attention_shard,
    _check_parallel,
    _layer_counts,
    step_cost,
)
from mcsim.perf.search import integer_boundary
from mcsim.scenario import catalog

# -- memory --------------------------------------------------------------------------------------------------

def memory_projection(model: dict, hw, *, precision: Precision = Precision(),
                      parallel: Parallelism = Parallelism(), block_tokens: int = 16, context: float = 4096,
                      memory_fraction: float = 0.9, activation_gb: float = 4.0, reserved_gb: float = 0.0,
                      include_mtp: bool = False) -> Memory:
    """HBM budget per GPU and the sequences an instance can hold.

    Weights: routed experts spread over all ``tp x attention_dp`` GPUs of a stage (``ep`` ranks of ``etp``
    GPUs); everything else split over ``tp`` and replicated over ``attention_dp``; layers over ``pp``; the
    fullest stage holds the embedding or the output head (both when ``pp == 1``). The router counts at
    BF16. KV: GQA heads over ``tp`` (``ceil(kv_heads / tp)`` per GPU, replicated when ``kv_heads < tp``);
    the MLA latent is replicated over ``tp``; sequences split over ``attention_dp``.

    Parameters
    ----------
    model : dict
        Catalog entry.
    hw : mcsim.perf.hardware.Hardware or dict
        The accelerator (a catalog entry is converted).
    precision, parallel
        Option groups.
    block_tokens : int
        Tokens per KV block; a sequence's context is rounded up to whole blocks.
    context : float
        Context per sequence, tokens (prompt plus the output generated so far; the mean is a fair choice).
    memory_fraction : float
        Usable share of HBM.
    activation_gb, reserved_gb : float
        HBM per GPU set aside for activations and workspace, and for anything else (a prefix cache), GB.
    include_mtp : bool
        Hold the multi-token-prediction modules too (MTP speculative decoding), on the last stage.

    Returns
    -------
    Memory

    Examples
    --------
    >>> from mcsim import catalog
    >>> mem = memory_projection(catalog.model_preset("llama-3-70b"), catalog.hardware_preset("h100"))
    >>> mem.kv_bytes_per_token_per_gpu, mem.reason
    (327680.0, 'weights do not fit in HBM')
    """
    _check_parallel(parallel)
    if block_tokens < 1 or context < 0:
        raise ValueError("block_tokens must be >= 1 and context >= 0")
    tp, pp, adp = parallel.tp, parallel.pp, parallel.attention_dp
    h, wb = model["hidden_size"], precision.weight_bytes
    layers, dense_layers, moe_layers = _layer_counts(model, pp)
    shard = _attention_shard(model, tp)
    per_layer = (shard["matmul"] + shard["norm"]) * wb
    weights = layers * per_layer + dense_layers * 3 * h * model["dense_ffn"] / tp * wb
    if moe_layers > 0:
        expert = 3 * h * model["expert_ffn"]
        weights += moe_layers * (model["experts"] * expert / (tp * adp) * precision.expert_weights
                                 + model["shared_experts"] * expert / tp * wb
                                 + model["experts"] * h * ROUTER_WEIGHT_BYTES)
    heads_of_vocab = 2 if pp == 1 else 1
    weights += heads_of_vocab * model["vocab"] * h / tp * wb + h * wb  # embedding / output head, final norm
    if include_mtp and model.get("mtp_layers", 0):
        mtp_total, _ = catalog._mtp_params(model)
        mtp_experts = model["mtp_layers"] * model["experts"] * 3 * h * model["expert_ffn"]
        weights += (mtp_total - mtp_experts) / tp * wb + mtp_experts / (tp * adp) * precision.expert_weights

    kv_token = layers * shard["kv_per_token"] * precision.kv_bytes
    blocks = math.ceil(context / block_tokens)
    kv_sequence = blocks * block_tokens * kv_token
    activation = activation_gb * 1e9
    free = as_hardware(hw).hbm_bytes * memory_fraction - weights - activation - reserved_gb * 1e9
    if free <= 0:
        max_sequences, reason = 0, "weights do not fit in HBM"
    else:
        per_group = math.floor(free / kv_sequence) if kv_sequence > 0 else 0
        max_sequences = adp * per_group
        reason = "ok" if per_group >= 1 else "KV for one sequence does not fit"
    return Memory(weights_per_gpu=float(weights), kv_bytes_per_token_per_gpu=float(kv_token),
                  kv_bytes_per_sequence=float(kv_sequence), activation_bytes=float(activation),
                  free_kv_bytes=float(free), max_sequences=int(max_sequences), fits=reason == "ok", reason=reason)


def tp_degrees(model: dict, gpus: int = 0, pp: int = 1) -> list[int]:
    """Tensor-parallel degrees an instance of ``model`` can take, ascending: divisors of its attention heads (whole
    heads per GPU) that, when the instance has a set number of ``gpus``, also divide its GPUs per pipeline stage
    (the rest is attention data parallelism); with ``gpus`` 0 the instance is ``tp x pp`` GPUs, whatever ``tp``.

    Examples
    --------
    >>> tp_degrees({"attention_heads": 64}, gpus=8)
    [1, 2, 4, 8]
    >>> tp_degrees({"attention_heads": 12})
    [1, 2, 3, 4, 6, 12]
    """
    heads = int(model["attention_heads"])
    if gpus and gpus % pp:
        return []
    per_stage = gpus // pp if gpus else 0
    return [tp for tp in range(1, heads + 1) if heads % tp == 0 and (not per_stage or per_stage % tp == 0)]


# -- operating point -------------------------------------------------------------------------------------------

def _instance_step_time(model: dict, hw: dict, decode_seqs: float, prefill_tokens: float, step_kwargs: dict) -> float:
    """Time in which all ``decode_seqs`` sequences (and the prefill tokens) advance one step, s.

    With ``pp`` stages the work is split into ``pp`` micro-batches kept in flight together: each sequence
    passes through all stages, one stage-time each.
    """
    if decode_seqs + prefill_tokens <= 0:
        return 0.0
    pp = step_kwargs.get("parallel", Parallelism()).pp
    cost = step_cost(model, hw, decode_seqs=decode_seqs / pp, prefill_tokens=prefill_tokens / pp, **step_kwargs)
    return pp * cost.t_step


def operating_point(model: dict, hw: dict, *, context: float, tpot_target_s: float, verify_tokens: int = 1,
                    tokens_per_pass: float = 1.0, max_batch: int | None = None, memory: Memory,
                    **step_kwargs) -> OperatingPoint:
    """Largest decode batch per instance that fits in memory and meets the TPOT target.

    Step time grows monotonically with the batch, so the batch is found by bisection over integers in
    ``[1, min(memory.max_sequences, max_batch)]``.

    Parameters
    ----------
    model : dict
        Catalog entry.
    hw : mcsim.perf.hardware.Hardware or dict
        The accelerator (a catalog entry is converted).
    context : float
        Mean decode context, tokens (use the same context as ``memory``).
    tpot_target_s : float
        Time-per-output-token target, s.
    verify_tokens : int
        Tokens each sequence runs per pass (k + 1 with k drafts).
    tokens_per_pass : float
        Output tokens a sequence gains per pass on average (1 without speculation).
    max_batch : int, optional
        Cap on sequences per instance.
    memory : Memory
        From :func:`memory_projection` for the same model, hardware, precision and parallelism.
    **step_kwargs
        Passed to :func:`step_cost` (precision, parallel, collectives, achievable, hot_rank_factor, ...).

    Returns
    -------
    OperatingPoint
    """
    gpus = step_kwargs.get("parallel", Parallelism()).gpus
    prefill_tokens = step_kwargs.pop("prefill_tokens", 0)
    if not memory.fits:
        return OperatingPoint(0, math.nan, math.nan, 0.0, False, memory.reason)

    def step_time(batch):
        return _instance_step_time(model, hw, batch, prefill_tokens,
                                   dict(step_kwargs, decode_context=context, verify_tokens=verify_tokens))

    def point(batch, feasible, reason, limited_by):
        t = step_time(batch)
        return OperatingPoint(batch, t, t / tokens_per_pass, batch * tokens_per_pass / t / gpus, feasible, reason,
                              limited_by)

    limit, limited_by = memory.max_sequences, "memory"
    if max_batch is not None and max_batch < limit:
        limit, limited_by = int(max_batch), "max_batch"
    if limit < 1:
        return OperatingPoint(0, math.nan, math.nan, 0.0, False, "max_batch below 1")

    def meets(batch):
        return step_time(batch) / tokens_per_pass <= tpot_target_s

    if not meets(1):
        return point(1, False, "TPOT target not met at batch 1", "")
    if meets(limit):
        return point(limit, True, "ok", limited_by)
    good, _ = integer_boundary(meets, 1, limit, at_lo=True)
    return point(good, True, "ok", "tpot")
