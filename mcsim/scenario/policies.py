"""Scheduler policies of the batching simulator: one table, read by the kernel, the reference and the fleet.

A policy is a :class:`Policy` entry of :data:`POLICIES`: its queue order, when it admits requests, whether
prefill and decode share a step, its per-step cap on new sequences and the analytic (no-simulator) model of its
decode slots. The step loop (:mod:`mcsim.kernels.step_loop`) gets each field as an integer code
(:meth:`Policy.codes`); the event-loop reference (:mod:`mcsim.reference.batching`) reads the same fields by
name. Adding a policy is an entry here, the kernel's hook for any new field value, and the reference's.

A scenario selects one with ``deployment.batching`` (``"static"`` is its own policy) and, for continuous
batching, ``deployment.scheduler``; ``deployment.max_new_per_step`` caps the sequences admitted per step under
any continuous policy.

Examples
--------
>>> policy_for("continuous", "priority").order
'priority'
>>> policy_for("static", "priority").name  # static batching has a policy of its own
'static'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcsim.scenario.choices import SCHEDULERS

#: Field values, by name, and the kernel's code for each (see :mod:`mcsim.kernels.batching_helpers`).
ADMISSION = {"continuous": 0, "static": 1}
ORDER = {"fcfs": 0, "priority": 1, "shortest-prompt": 1}  # the two keyed orders differ only in their key
MIXING = {"mixed": 0, "exclusive": 1}
#: Analytic decode-slot models used when the simulator does not run (mcsim.perf.fleet).
ANALYTIC = ("full-slots", "static-slots")


@dataclass(frozen=True)
class Policy:
    """One scheduler policy.

    Attributes
    ----------
    name : str
        Its name in ``deployment.scheduler`` (or ``"static"``).
    admission : {"continuous", "static"}
        ``continuous``: requests are admitted at every step; ``static``: a batch is formed when none runs and
        runs until its longest member ends.
    order : {"fcfs", "priority", "shortest-prompt"}
        Order of the waiting queue (``fcfs`` under static batching): first come first served; by workload class priority (higher first, FCFS
        within a class); by uncached prompt tokens (fewer first, FCFS among equals). Admission never skips the
        head: a head that does not fit in the KV pool blocks the queue.
    mixing : {"mixed", "exclusive"}
        ``mixed``: decodes and prefill chunks share a step (decodes first, chunks fill the token budget, each
        at most ``chunk_tokens``: Sarathi-style chunked prefill); ``exclusive``: a step is prefill only when
        there is prefill to do, else decode only (prefill first, as vLLM's scheduler before chunked prefill).
    max_new_per_step : int
        Sequences admitted per step at most (0 = no cap); ``deployment.max_new_per_step`` overrides it.
    analytic : {"full-slots", "static-slots"}
        Decode-slot model without the simulator: every slot busy, or a static batch's slots idle after their
        member ends (:func:`mcsim.perf.capacity.static_slot_utilization`).
    doc : str
        One line for the README and ``mcsim list``.
    """

    name: str
    admission: str
    order: str
    mixing: str
    max_new_per_step: int
    analytic: str
    doc: str

    def codes(self, max_new_per_step: int = 0) -> dict:
        """The kernel's integer code per field; ``max_new_per_step > 0`` overrides the entry's own cap."""
        return {"admission": ADMISSION[self.admission], "order": ORDER[self.order], "mixing": MIXING[self.mixing],
                "max_new_per_step": int(max_new_per_step or self.max_new_per_step)}

    def queue_key(self, prefill_tokens: np.ndarray, priority: np.ndarray | None) -> np.ndarray:
        """Per request, the key of a keyed waiting queue (lower first; zeros for FCFS)."""
        n = len(prefill_tokens)
        if self.order == "priority":
            return -np.asarray(priority if priority is not None else np.zeros(n), dtype=np.int64)
        if self.order == "shortest-prompt":
            return np.asarray(prefill_tokens, dtype=np.int64)
        return np.zeros(n, np.int64)


_ENTRIES = (
    Policy("fcfs", "continuous", "fcfs", "mixed", 0, "full-slots",
           "Continuous batching, first come first served; decodes and chunked prefill share each step."),
    Policy("priority", "continuous", "priority", "mixed", 0, "full-slots",
           "Continuous batching; the waiting queue by workload class priority (higher first), FCFS within a class."),
    Policy("shortest-prompt-first", "continuous", "shortest-prompt", "mixed", 0, "full-slots",
           "Continuous batching; the waiting queue by uncached prompt tokens, fewest first."),
    Policy("exclusive-prefill", "continuous", "fcfs", "exclusive", 0, "full-slots",
           "Continuous batching, FCFS; a step is prefill only or decode only, prefill first (no mixing)."),
    Policy("chunked-prefill", "continuous", "fcfs", "mixed", 0, "full-slots",
           "Sarathi-style chunked prefill (vLLM V1's default): decodes first, prefill chunks of at most "
           "performance.chunk_tokens fill performance.token_budget; the same rules as fcfs, by its usual name."),
    Policy("static", "static", "fcfs", "mixed", 0, "static-slots",
           "Static batching: a batch forms when none runs and runs until its longest member ends."),
)
#: Every policy, by name.
POLICIES: dict[str, Policy] = {p.name: p for p in _ENTRIES}
# The kernel forms static batches first come, first served and mixes nothing into them.
assert all(p.order == "fcfs" and p.mixing == "mixed" for p in _ENTRIES if p.admission == "static")
# deployment.scheduler offers the continuous policies (mcsim.scenario.choices.SCHEDULERS), in the table's order.
assert SCHEDULERS == tuple(name for name, p in POLICIES.items() if p.admission == "continuous")
#: Older names of policies.
ALIASES = {"continuous": "fcfs"}


def get(name: str) -> Policy:
    """The policy called ``name`` (or an alias such as ``"continuous"``)."""
    name = ALIASES.get(name, name)
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown scheduler policy {name!r}; expected one of {', '.join(POLICIES)}") from None


def policy_for(batching: str, scheduler: str) -> Policy:
    """The policy a scenario selects: ``deployment.batching`` and, for continuous batching, ``deployment.scheduler``."""
    return POLICIES["static"] if batching == "static" else get(scheduler)
