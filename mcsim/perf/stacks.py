"""Serving stacks: what the engine that runs the steps does by default (``performance.stack``).

The roofline prices a step's kernels; the serving engine around them decides three things that move whole-step
times, and each of the stacks below documents its choice:

=========  ===================================  ===================================  ====================================
stack      TP all-reduce                        host work per step                   source
=========  ===================================  ===================================  ====================================
vllm       its custom one-shot / two-shot       on the step's critical path          vLLM csrc/custom_all_reduce.cuh and
           kernels in a node where faster, not  (``performance.step_overhead_s``;    vllm/distributed/device_communicators/
           at 8 MiB+ (``allreduce_impl=auto``)  asynchronous scheduling is opt-in)   custom_all_reduce.py (max_size 8 MiB);
                                                                                     the --async-scheduling engine argument
sglang     the same kernels (adapted from       overlapped with the GPU: the         SGLang v0.4 release notes, "zero-
           vLLM's and TensorRT-LLM's), NCCL     zero-overhead batch scheduler        overhead batch scheduler" (lmsys.org/
           beyond                               prepares step n + 1 while n runs     blog/2024-12-04-sglang-v0-4)
trtllm     its custom all-reduce in a node,     overlapped: the overlap scheduler,   TensorRT-LLM docs, features/overlap-
           NCCL beyond                          on by default                        scheduler; kernels/
                                                                                     customAllReduceKernels.cu
generic    NCCL for every all-reduce            on the critical path                 a plain framework: torch.distributed
=========  ===================================  ===================================  ====================================

All four replay decode steps as CUDA graphs (``performance.cuda_graphs``); which element-wise ops a stack fuses is the
``efficiency.fused_kernels`` lever, not the stack. A scenario's own ``performance.allreduce_impl`` (anything but
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
    """

    name: str
    allreduce_impl: str
    overlaps_host: bool
    source: str


STACK_TABLE = {entry.name: entry for entry in (
    Stack("vllm", "auto", False, "vLLM csrc/custom_all_reduce.cuh, custom_all_reduce.py (max_size 8 MiB); "
                                 "asynchronous scheduling opt-in (--async-scheduling)"),
    Stack("sglang", "auto", True, "lmsys.org/blog/2024-12-04-sglang-v0-4 (zero-overhead batch scheduler); SGLang's "
                                  "custom all-reduce (sgl-project/sglang PR 2904)"),
    Stack("trtllm", "auto", True, "TensorRT-LLM docs, overlap scheduler (on by default); "
                                  "cpp/tensorrt_llm/kernels/customAllReduceKernels.cu"),
    Stack("generic", "nccl", False, "a plain framework: NCCL through torch.distributed, synchronous scheduling"),
)}
assert tuple(STACK_TABLE) == STACKS


def stack_entry(name: str) -> Stack:
    """The table entry of ``performance.stack``."""
    if name not in STACK_TABLE:
        raise ValueError(f"performance.stack must be one of {', '.join(STACKS)}; got {name!r}")
    return STACK_TABLE[name]
