"""Time of the collectives that tensor-, expert- and pipeline-parallel serving runs every step.

Bandwidth-and-latency (alpha-beta) formulas, the same ones NCCL's and the TensorRT-LLM custom all-reduce's
documentation use to reason about algorithm choice: a collective of ``steps`` sequential hops that moves
``bytes_sent`` bytes out of the busiest GPU takes ``bytes_sent / bandwidth + steps * latency_s``.

Bandwidths come from the hardware dict, per GPU and one direction: ``scale_up_gb_s`` (NVLink / Infinity
Fabric) when the whole group fits in one node (``group <= gpus_per_node``), ``scale_out_gb_s`` (the NIC) for
traffic that crosses nodes; both times ``network_fraction``, the achievable share of the link. A group of
``p`` GPUs spans ``ceil(p / gpus_per_node)`` nodes of ``min(p, gpus_per_node)`` GPUs each; groups are laid
out on consecutive GPUs.

All-reduce of ``S`` bytes (the full message each GPU holds) over ``p`` GPUs:

=============  =========================================  =============================
algorithm      bytes sent per GPU                         latency steps
=============  =========================================  =============================
ring           2 (p-1)/p S                                2 (p-1)
one-shot       (p-1) S (every GPU reads every peer's S)   1
two-shot       2 (p-1)/p S (reduce-scatter + all-gather)  2
hierarchical   intra-node reduce-scatter (g-1)/g S, inter-node ring all-reduce of the S/g shard
               2 (n-1)/n S/g, intra-node all-gather (g-1)/g S;  2 (g-1) + 2 (n-1) steps
=============  =========================================  =============================

tree           2 S (reduce up and broadcast down the tree)  2 ceil(log2 p)
auto           the fastest of the above for this message and group (what NCCL's tuner and custom all-reduces do)

A flat algorithm whose group spans nodes runs at the scale-out bandwidth (its slowest link sets every step).

Inside a node, hardware with measured NCCL figures (``collective_base_us``, ``collective_hop_us``,
``allreduce_bus_gb_s`` in the catalog) prices an all-reduce as ``base + steps x hop + bytes_sent / bus``: the
fixed cost of launching and synchronising the collective, the latency of each hop and the achieved bandwidth.
The defaults for H100 and A100 are fitted to measured NCCL all-reduce times on DGX nodes (Vidur's profiling data,
``mcsim/data/measurements/vidur/``: 2, 4 and 8 GPUs, 2 KiB-64 MiB messages, least mean absolute percentage
error of ``auto``): H100 23.0 us + 2.5 us per hop at 349.7 GB/s, A100 33.2 us + 8.4 us per hop at 169.5 GB/s,
which ``mcsim validate`` checks against the measurements. Where a figure is 0 (not measured) the generic model
applies: no fixed cost, ``latency_s`` per hop, ``scale_up_gb_s x network_fraction``. An explicit ``latency_s``
replaces the hop latency.

Across nodes, hardware with measured figures (``remote_allreduce_base_us``, ``remote_allreduce_bus_gb_s``; the A100
entry, fitted to the measured all-reduces of 16 GPUs on two DGX A100 nodes) prices ``auto`` as that fixed cost plus
the ring's ``2 (p-1)/p S`` at that bus bandwidth (NCCL's "busbw"); elsewhere the algorithms above run with the
scale-out bandwidth between nodes.

Who runs the TP all-reduce (``impl``, :func:`tp_allreduce`). Serving engines do not call NCCL for the small and
medium all-reduces of tensor parallelism inside one NVLink domain: vLLM (``csrc/custom_all_reduce.cuh``), SGLang and
TensorRT-LLM run their own kernels, in which every GPU reads its peers' buffers over NVLink:

* one-shot (one stage): each GPU reads all ``p - 1`` peers' ``S`` bytes and reduces them, ``(p-1) S`` read;
* two-shot (two stages): reduce-scatter then all-gather through the peers' buffers, ``2 (p-1)/p S`` read;
* vLLM's rule: one-shot for two GPUs, or below 512 KiB on up to four, or below 256 KiB on up to eight; two-shot
  otherwise; groups of 2, 4, 6 or 8 GPUs of one node with a fully connected NVLink only, and messages under
  ``CUSTOM_MAX_BYTES`` (8 MiB, vLLM's ``CustomAllreduce(max_size=8192 * 1024)``); NCCL for the rest.

A stage costs ``custom_allreduce_hop_us`` and the bytes move at ``custom_allreduce_gb_s`` (the catalog's; fitted on
H100 to vLLM 0.24.0's custom all-reduce timed under CUDA graphs, as a served decode step runs it, in AIConfigurator's
kernel database: 4.5 us a stage, 302 GB/s, against NCCL's 27 us fixed cost; SGLang's eager-mode unit test,
github.com/sgl-project/sglang/pull/2904, is 1.3-2.3x slower from 256 KiB up). ``impl = "nccl"``: NCCL always;
``"custom"``: the engine's kernels for any message inside a node; ``"auto"``: as the engines do, their kernels
where they are the faster (small and medium messages: the engines switch to NCCL at a tuned size; with these
figures the kernels win on eight H100s up to their 8 MiB limit), never at 8 MiB or more, NCCL across nodes.

All-to-all (MoE dispatch or combine) of ``S = tokens x copies x token_bytes`` per GPU over ``p`` GPUs:

* direct: every GPU sends ``(p-1)/p`` of its data straight to its destination, in one step. Within a node
  all of it goes over scale-up; across nodes the ``(g-1)/p`` share bound for the own node goes over scale-up
  and the ``(p-g)/p`` share for other nodes over scale-out, concurrently (the slower sets the time).
* hierarchical (DeepSeek-V3's node-limited dispatch, DeepEP): a token crosses the network once per
  *destination node*, not once per expert copy, then is forwarded inside the node over scale-up. Under
  uniform routing of ``copies`` distinct experts among ``experts`` spread evenly over ``n`` nodes a token
  reaches ``(n-1) (1 - C(E - E/n, k) / C(E, k))`` other nodes on average; the scale-out bytes are that many
  ``token_bytes`` per token, the scale-up bytes ``(g-1)/g`` of ``S``; the two overlap (DeepSeek-V3 report,
  section 3.2.2), 2 steps. Inside one node it equals direct.
"""

from __future__ import annotations

import math

import numpy as np

from mcsim.perf.hardware import as_hardware
from mcsim.scenario.choices import ALLREDUCE_ALGORITHMS, ALLREDUCE_IMPLS, ALLTOALL_ALGORITHMS

__all__ = [
    "ALLREDUCE_ALGORITHMS",
    "ALLREDUCE_IMPLS",
    "custom_allreduce",
    "tp_allreduce",
    "ALLTOALL_ALGORITHMS",
    "allreduce_time",
    "alltoall_time",
    "expected_other_nodes",
    "group_layout",
    "hop_latency",
    "send_time",
]

#: Latency per hop where neither the hardware nor the caller gives one, s.
DEFAULT_HOP_S = 5e-6
#: Largest message the engines' own all-reduce takes (vLLM's ``CustomAllreduce`` default ``max_size``), bytes.
CUSTOM_MAX_BYTES = 8192 * 1024
#: Group sizes the engines' own all-reduce runs on (vLLM's ``_SUPPORTED_WORLD_SIZES``).
CUSTOM_GROUPS = (2, 4, 6, 8)


def group_layout(group: int, hw) -> tuple[int, int]:
    """(nodes, GPUs per node) of a group of ``group`` consecutive GPUs."""
    per_node = as_hardware(hw).gpus_per_node
    return math.ceil(group / per_node), min(group, per_node)


def _bandwidths(hw, network_fraction: float) -> tuple[float, float]:
    """Achievable (scale-up, scale-out) bandwidth per GPU, bytes/s."""
    hw = as_hardware(hw)
    return hw.scale_up_gb_s * 1e9 * network_fraction, hw.scale_out_gb_s * 1e9 * network_fraction


def allreduce_time(nbytes: float, group: int, hw, *, algorithm: str = "auto", latency_s: float | None = None,
                   network_fraction: float = 1.0) -> tuple[float, float]:
    """Time and bytes sent per GPU of one all-reduce.

    Parameters
    ----------
    nbytes : float
        Message each GPU contributes (and receives reduced), bytes.
    group : int
        GPUs in the all-reduce.
    hw : mcsim.perf.hardware.Hardware or dict
        Hardware entry (``scale_up_gb_s``, ``scale_out_gb_s``, ``gpus_per_node``).
    algorithm : {"auto", "ring", "one-shot", "two-shot", "tree", "hierarchical"}
        ``auto``: the fastest for this message and group.
    latency_s : float, optional
        Latency of one step (hop), s; default the hardware's fitted ``collective_hop_us`` inside a node, else
        :data:`DEFAULT_HOP_S`.
    network_fraction : float
        Achievable fraction of the link bandwidth.

    Returns
    -------
    (float, float)
        (time in s, bytes sent by one GPU). ``(0, 0)`` for a group of one or an empty message.

    Examples
    --------
    >>> hw = {"scale_up_gb_s": 100.0, "scale_out_gb_s": 10.0, "gpus_per_node": 8}
    >>> allreduce_time(4e6, 4, hw, algorithm="ring", latency_s=0.0)  # 2*3/4 * 4 MB at 100 GB/s = 60 us
    (6e-05, 6000000.0)
    >>> from mcsim.scenario import catalog
    >>> t, _ = allreduce_time(4096, 8, catalog.hardware_preset("h100"))  # a decode step's message: latency-bound
    >>> round(t * 1e6, 1)  # 27.2 us fixed + one hop of 1.48 + 7 x 4 KiB at 352.5 GB/s (one-shot)
    28.8
    """
    t, sent, _ = allreduce_choice(nbytes, group, hw, algorithm=algorithm, latency_s=latency_s,
                                  network_fraction=network_fraction)
    return t, sent


def allreduce_choice(nbytes: float, group: int, hw, *, algorithm: str = "auto", latency_s: float | None = None,
                     network_fraction: float = 1.0) -> tuple[float, float, str]:
    """:func:`allreduce_time` and the algorithm that ran (``auto`` resolved; "" for a group of one)."""
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"all-reduce algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}")
    p = int(group)
    if p <= 1 or nbytes <= 0:
        return 0.0, 0.0, ""
    hw = as_hardware(hw)
    nodes, per_node = group_layout(p, hw)
    up, out = _bandwidths(hw, network_fraction)
    base = 0.0
    hop = DEFAULT_HOP_S if latency_s is None else latency_s
    if nodes == 1 and hw.allreduce_bus_gb_s > 0:  # measured NCCL figures inside a node
        up = hw.allreduce_bus_gb_s * 1e9
        base = hw.collective_base_us * 1e-6
        hop = hw.collective_hop_us * 1e-6 if latency_s is None else latency_s
    if nodes > 1 and hw.remote_allreduce_bus_gb_s > 0 and algorithm == "auto" and latency_s is None:
        ring = 2.0 * (p - 1) / p * nbytes  # measured NCCL figures across whole nodes: its own algorithm choice
        return hw.remote_allreduce_base_us * 1e-6 + ring / (hw.remote_allreduce_bus_gb_s * 1e9), ring, "measured"
    candidates = allreduce_candidates(nbytes, p, nodes, per_node, up, out, base, hop)
    if algorithm == "auto":
        algorithm = min(candidates, key=lambda name: candidates[name])
    return (*candidates[algorithm], algorithm)


def custom_allreduce_shape(nbytes, group):
    """vLLM's rule for its own all-reduce (module docstring): ``(one-shot?, stages, bytes each GPU reads)`` of a
    message of ``nbytes`` over ``group`` GPUs; floats, or NumPy arrays of one shape (``mcsim calibrate`` fits the
    stage cost and bandwidth with it, vectorized over measured messages).

    Examples
    --------
    >>> one, stages, sent = custom_allreduce_shape(64 * 1024, 8)  # one stage, reading 7 peers' buffers
    >>> bool(one), float(stages), float(sent)
    (True, 1.0, 458752.0)
    """
    one = (group == 2) | ((group <= 4) & (nbytes < 512 * 1024)) | (nbytes < 256 * 1024)
    return one, np.where(one, 1.0, 2.0), np.where(one, (group - 1) * nbytes, 2.0 * (group - 1) / group * nbytes)


def custom_allreduce(nbytes: float, group: int, hw, *, max_bytes: float = CUSTOM_MAX_BYTES):
    """The serving engine's own all-reduce (module docstring): ``(time s, bytes read per GPU, "one-shot" |
    "two-shot")``, or None where it does not run (another group size, a group across nodes, a message of
    ``max_bytes`` or more, hardware without figures).

    Examples
    --------
    >>> from mcsim.scenario import catalog
    >>> t, sent, kind = custom_allreduce(64 * 1024, 8, catalog.hardware_preset("h100"))  # a decode message
    >>> kind, round(t * 1e6, 1)  # one stage of 4.535 us + 7 x 64 KiB at 302.1 GB/s
    ('one-shot', 6.1)
    """
    hw = as_hardware(hw)
    p = int(group)
    if hw.custom_allreduce_gb_s <= 0 or p not in CUSTOM_GROUPS or p > hw.gpus_per_node or nbytes >= max_bytes:
        return None
    one, stages, sent = custom_allreduce_shape(float(nbytes), p)
    stages, sent = float(stages), float(sent)
    return stages * hw.custom_allreduce_hop_us * 1e-6 + sent / (hw.custom_allreduce_gb_s * 1e9), sent, \
        "one-shot" if one else "two-shot"


def tp_allreduce(nbytes: float, group: int, hw, *, impl: str = "auto", algorithm: str = "auto",
                 latency_s: float | None = None, network_fraction: float = 1.0) -> tuple[float, float, str]:
    """One TP all-reduce as a serving engine runs it: ``(time s, bytes sent per GPU, what ran)``, what ran being
    e.g. ``"custom one-shot"`` or ``"nccl ring"`` (module docstring; ``impl`` one of :data:`ALLREDUCE_IMPLS`,
    ``algorithm`` NCCL's)."""
    if impl not in ALLREDUCE_IMPLS:
        raise ValueError(f"all-reduce implementation must be one of {ALLREDUCE_IMPLS}, got {impl!r}")
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"all-reduce algorithm must be one of {ALLREDUCE_ALGORITHMS}, got {algorithm!r}")
    if int(group) <= 1 or nbytes <= 0:
        return 0.0, 0.0, ""
    t, sent, name = allreduce_choice(nbytes, group, hw, algorithm=algorithm, latency_s=latency_s,
                                     network_fraction=network_fraction)
    if impl != "nccl":
        custom = custom_allreduce(nbytes, group, hw, max_bytes=CUSTOM_MAX_BYTES if impl == "auto" else math.inf)
        # auto: the engines' size thresholds pick the faster of the two (a few MiB up, NCCL's bandwidth wins)
        if custom is not None and (impl == "custom" or custom[0] <= t):
            return custom[0], custom[1], f"custom {custom[2]}"
    return t, sent, f"nccl {name}"


def allreduce_candidates(nbytes, p, nodes, per_node, up, out, base, hop) -> dict:
    """Algorithm -> (time s, bytes sent per GPU) of one all-reduce (the table in the module docstring).

    Floats or NumPy arrays of one shape (``nbytes`` and ``p`` per message; ``nodes``, ``per_node`` the group's
    layout): ``mcsim calibrate`` fits the fixed cost ``base``, the hop latency ``hop`` and the bandwidth ``up``
    (bytes/s) with these same formulas, vectorized over the measured messages.
    """
    flat_bw = np.where(nodes == 1, up, out) if isinstance(nodes, np.ndarray) else (up if nodes == 1 else out)
    ring = 2.0 * (p - 1) / p * nbytes
    g, n = per_node, nodes
    intra = 2.0 * (g - 1) / g * nbytes  # reduce-scatter then all-gather inside the node
    inter = 2.0 * (n - 1) / n * nbytes / g  # ring all-reduce of this GPU's shard across nodes
    return {
        "ring": (base + ring / flat_bw + 2 * (p - 1) * hop, ring),
        "one-shot": (base + (p - 1) * nbytes / flat_bw + hop, (p - 1) * nbytes),
        "two-shot": (base + ring / flat_bw + 2 * hop, ring),
        "tree": (base + 2.0 * nbytes / flat_bw + 2 * np.ceil(np.log2(p)) * hop, 2.0 * nbytes),
        "hierarchical": (base + intra / up + inter / out + (2 * (g - 1) + 2 * (n - 1)) * hop, intra + inter),
    }


def allreduce_auto_seconds(nbytes, p, base, hop, bandwidth):
    """Time of the fastest all-reduce inside one node, vectorized: the ``auto`` choice of :func:`allreduce_time`
    for messages ``nbytes`` over ``p`` GPUs with fixed cost ``base`` s, hop latency ``hop`` s and achieved
    bandwidth ``bandwidth`` bytes/s."""
    nbytes, p = np.asarray(nbytes, float), np.asarray(p, float)
    ones = np.ones_like(p)
    candidates = allreduce_candidates(nbytes, p, ones, p, bandwidth, bandwidth, base, hop)
    return np.min([t for t, _ in candidates.values()], axis=0)


def expected_other_nodes(experts: int, copies: int, nodes: int) -> float:
    """Mean number of nodes other than its own that a token's ``copies`` distinct experts land on.

    Experts are spread evenly, ``experts / nodes`` per node, and chosen uniformly without replacement, so a
    given node is missed with probability ``C(E - E/n, k) / C(E, k)``.
    """
    if nodes <= 1:
        return 0.0
    per_node = experts / nodes
    miss = 1.0
    for i in range(int(copies)):
        miss *= max(experts - per_node - i, 0.0) / (experts - i)
    return (nodes - 1) * (1.0 - miss)


def alltoall_time(tokens: float, copies: float, token_bytes: float, group: int, hw, *,
                  algorithm: str = "direct", latency_s: float | None = None, network_fraction: float = 1.0,
                  experts: int | None = None) -> tuple[float, float]:
    """Time and bytes sent per GPU of one all-to-all (a MoE dispatch or a combine).

    Parameters
    ----------
    tokens : float
        Tokens this GPU sends.
    copies : float
        Destinations per token (top-k experts).
    token_bytes : float
        Bytes of one token copy (hidden size x activation bytes).
    group : int
        GPUs in the all-to-all (the EP ranks).
    hw : mcsim.perf.hardware.Hardware or dict
        Hardware entry.
    algorithm : {"direct", "hierarchical"}
    latency_s : float, optional
        Latency of one step, s (default: :func:`hop_latency`).
    network_fraction : float
        Achievable fraction of the link bandwidth.
    experts : int, optional
        Routed experts per layer; needed by "hierarchical" when the group spans nodes.

    Returns
    -------
    (float, float)
        (time in s, bytes sent by one GPU).

    Examples
    --------
    >>> hw = {"scale_up_gb_s": 100.0, "scale_out_gb_s": 10.0, "gpus_per_node": 8}
    >>> t, sent = alltoall_time(1000, 8, 1000.0, 8, hw, latency_s=0.0)  # 7/8 of 8 MB at 100 GB/s
    >>> round(t * 1e6, 6), sent
    (70.0, 7000000.0)
    """
    if algorithm not in ALLTOALL_ALGORITHMS:
        raise ValueError(f"all-to-all algorithm must be one of {ALLTOALL_ALGORITHMS}, got {algorithm!r}")
    p = int(group)
    data = tokens * copies * token_bytes
    if p <= 1 or data <= 0:
        return 0.0, 0.0
    up, out = _bandwidths(hw, network_fraction)
    n, g = group_layout(p, hw)
    latency_s = hop_latency(hw, latency_s)
    if n == 1:
        sent = (p - 1) / p * data
        return sent / up + latency_s, sent
    if algorithm == "direct":
        same_node, other_nodes = (g - 1) / p * data, (p - g) / p * data
        return max(same_node / up, other_nodes / out) + latency_s, same_node + other_nodes
    if experts is None:
        raise ValueError("hierarchical all-to-all across nodes needs the number of experts")
    inter = tokens * token_bytes * expected_other_nodes(experts, int(copies), n)
    intra = (g - 1) / g * data
    return max(inter / out, intra / up) + 2 * latency_s, inter + intra


def send_time(nbytes: float, hw, *, across_nodes: bool, latency_s: float | None = None,
              network_fraction: float = 1.0) -> float:
    """Time of one point-to-point send of ``nbytes`` (a pipeline stage boundary), s.

    Where the hardware has measured NCCL send/recv figures (``send_base_us`` and ``send_gb_s`` inside a node,
    ``remote_send_*`` between nodes; fitted for H100 and A100 to Vidur's measurements, 2 KiB-64 MiB) the send costs
    that fixed time plus the bytes at that bandwidth; elsewhere ``latency_s`` (default :func:`hop_latency`) plus the
    bytes at the link's bandwidth x ``network_fraction``.

    Examples
    --------
    >>> from mcsim.scenario import catalog
    >>> # 7.67 us + 8 MiB at 357.5 GB/s
    >>> round(send_time(8 << 20, catalog.hardware_preset("h100"), across_nodes=False) * 1e6, 1)
    31.1
    """
    if nbytes <= 0:
        return 0.0
    hw = as_hardware(hw)
    base, bandwidth = ((hw.remote_send_base_us, hw.remote_send_gb_s) if across_nodes
                       else (hw.send_base_us, hw.send_gb_s))
    if bandwidth > 0 and latency_s is None:
        return base * 1e-6 + nbytes / (bandwidth * 1e9)
    up, out = _bandwidths(hw, network_fraction)
    return nbytes / (out if across_nodes else up) + hop_latency(hw, latency_s)


def hop_latency(hw, latency_s: float | None = None) -> float:
    """Latency of one hop of an all-to-all or a send: ``latency_s`` when given, else the hardware's fitted
    all-reduce hop latency (``collective_hop_us``), else :data:`DEFAULT_HOP_S`. Only the all-reduce is fitted to
    measurements; the others reuse its hop latency."""
    if latency_s is not None:
        return latency_s
    hop = as_hardware(hw).collective_hop_us
    return hop * 1e-6 if hop > 0 else DEFAULT_HOP_S
