"""Serving stacks: what the engine that runs the steps does by default (``performance.stack``).

The roofline prices a step's kernels; the serving engine around them decides two things that move whole-step
times, and each of the stacks below documents its choice:

* ``vllm``: its custom one-shot / two-shot all-reduce kernels inside a node where they are the faster, never at
  8 MiB or more (``allreduce_impl = auto``), NCCL beyond; the host's work per step on the step's critical path
  (``performance.step_overhead_s``: asynchronous scheduling is opt-in). Sources: vLLM ``csrc/custom_all_reduce.cuh``
  and ``vllm/distributed/device_communicators/custom_all_reduce.py`` (``max_size`` 8 MiB), the
  ``--async-scheduling`` engine argument.
* ``sglang``: the same kernels (adapted from vLLM's and TensorRT-LLM's), NCCL beyond; the host's work overlapped
  with the GPU, the zero-overhead batch scheduler preparing step n + 1 while step n runs. Source: SGLang v0.4
  release notes, "zero-overhead batch scheduler" (lmsys.org/blog/2024-12-04-sglang-v0-4).
* ``trtllm``: its custom all-reduce inside a node, NCCL beyond; the host's work overlapped (the overlap scheduler,
  on by default). Sources: TensorRT-LLM docs, features/overlap-scheduler; ``kernels/customAllReduceKernels.cu``.
* ``generic``: NCCL for every all-reduce, the host's work on the critical path: a plain framework
  (torch.distributed).

How each launches a step's kernels (``performance.cudagraph_mode = "stack"``): vLLM V1 captures full CUDA graphs
for decode-only batches and piecewise graphs (attention launched eagerly between them) for batches with prefill
tokens, ``FULL_AND_PIECEWISE`` (``vllm/config/compilation.py``, docs/design/cuda_graphs.md); SGLang and TensorRT-LLM
replay graphs for decode batches only and run prefill (extend, context) steps eagerly (SGLang's
``--cuda-graph-max-bs``; TensorRT-LLM's ``cuda_graph_config``, generation-only batches); a generic framework
launches every kernel. Which element-wise ops a stack fuses is the ``efficiency.fused_kernels`` lever, not the
stack. A scenario's own ``performance.allreduce_impl`` (anything but
"stack") wins over the stack's. The stack that priced a result is in its attributes (``serving_stack``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mcsim.scenario.choices import STACKS

__all__ = ["STACKS", "Stack", "STACK_TABLE", "stack_entry"]


@dataclass(frozen=True)
class Stack:
    """One serving stack's defaults (module docstring).

    Attributes
    ----------
    name : str
    allreduce_impl : str
        The TP all-reduce's implementation (:data:`mcsim.scenario.choices.ALLREDUCE_IMPLS`).
    overlaps_host : bool
        The host's per-step work (scheduling, sampling, input preparation) runs while the GPU runs the previous step,
        so none of ``performance.step_overhead_s`` is exposed.
    source : str
    cudagraph_mode : str
        How it launches a step's kernels (:data:`mcsim.scenario.choices.CUDAGRAPH_MODES`).
    """

    name: str
    allreduce_impl: str
    overlaps_host: bool
    source: str
    cudagraph_mode: str = "full_and_piecewise"


STACK_TABLE = {entry.name: entry for entry in (
    Stack("vllm", "auto", False, "vLLM csrc/custom_all_reduce.cuh, custom_all_reduce.py (max_size 8 MiB); "
                                 "asynchronous scheduling opt-in (--async-scheduling); CUDAGraphMode "
                                 "FULL_AND_PIECEWISE (vllm/config/compilation.py)", "full_and_piecewise"),
    Stack("sglang", "auto", True, "lmsys.org/blog/2024-12-04-sglang-v0-4 (zero-overhead batch scheduler); SGLang's "
                                  "custom all-reduce (sgl-project/sglang PR 2904); CUDA graphs for decode batches "
                                  "(--cuda-graph-max-bs)", "full_decode_only"),
    Stack("trtllm", "auto", True, "TensorRT-LLM docs, overlap scheduler (on by default); "
                                  "cpp/tensorrt_llm/kernels/customAllReduceKernels.cu; cuda_graph_config: "
                                  "generation-only batches", "full_decode_only"),
    Stack("generic", "nccl", False, "a plain framework: NCCL through torch.distributed, synchronous scheduling, "
                                    "eager launches", "none"),
)}
assert tuple(STACK_TABLE) == STACKS


def stack_entry(name: str) -> Stack:
    """The table entry of ``performance.stack``."""
    if name not in STACK_TABLE:
        raise ValueError(f"performance.stack must be one of {', '.join(STACKS)}; got {name!r}")
    return STACK_TABLE[name]
