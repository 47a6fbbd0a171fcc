"""``--requests auto``: grow the requests per sample until every sample run is at steady state, within a cap.

A run's figures depend on ``mc.requests`` until its caches have filled and its simulated queue has settled: each
sample checks that (``steady_state``, with ``requests_for_steady_state`` an extrapolation of what it would need,
:mod:`mcsim.stages.steady_state`). With ``requests="auto"`` the run starts at the scenario's ``mc.requests`` and,
while some sample run is not steady, runs again with the larger of twice as many and the largest extrapolation,
never more than the cap (``"auto:N"``; by default :data:`GROWTH` times the start). It stops early where more requests
cannot help: every unsteady run saturates its simulated queue, or a replayed trace has no more requests to give. Every run
uses the same seed, so the last one is exactly what ``--requests N`` gives for its N; the result records the
requests tried in ``requests_auto``.
"""

from __future__ import annotations

from mcsim.errors import McsimError
from mcsim.results.summary import _trace_supply, steady_state_facts
from mcsim.scenario.schema import SECTIONS

#: The default cap of ``auto``: this many times the starting requests (four doublings).
GROWTH = 16


class RequestsError(McsimError, ValueError):
    """A ``--requests`` value that is neither a count nor ``auto`` / ``auto:N``."""


def max_requests() -> int:
    """The most requests a sample may simulate: ``mc.requests``' upper bound, which a grown run keeps to too."""
    return int(SECTIONS["mc"]["requests"].hi)


def parse(value, start: int) -> tuple[int, int] | None:
    """``(start, cap)`` for ``"auto"`` or ``"auto:N"``; None for a count (an int, or a string of digits)."""
    digits = isinstance(value, str) and value.strip().isascii() and value.strip().isdigit()
    if value is None or isinstance(value, int) or digits:
        return None
    text = str(value).strip().lower()
    most = max_requests()
    if text == "auto":
        return min(start, most), min(GROWTH * start, most)
    if text.startswith("auto:") and text[5:].isascii() and text[5:].replace("_", "").isdigit():
        cap = int(text[5:].replace("_", ""))
        if not 1 <= cap <= most:
            raise RequestsError(f"--requests {value}: the cap must be between 1 and {most:,} requests per sample "
                                "(mc.requests' range)")
        return min(start, cap), cap
    raise RequestsError(f"--requests {value}: expected a count of requests per sample, 'auto' (grow until steady, "
                        f"at most {GROWTH} x mc.requests) or 'auto:N' (at most N)")


def next_requests(ds, requests: int, cap: int) -> int | None:
    """The requests of the next run, or None when this one is final: steady, at the cap, or not helped by more."""
    facts = steady_state_facts(ds)
    if facts is None or requests >= cap:
        return None
    if facts["saturated"] >= facts["count"]:  # every unsteady run saturates its queue: no count settles it
        return None
    supply = _trace_supply(ds)
    if supply is not None:  # a replayed trace gives at most its own records
        if requests >= supply:
            return None
        cap = min(cap, supply)
    return min(cap, max(2 * requests, int(facts["requests"] or 0)))


def describe(tried: list[int], cap: int, ds) -> str:
    """The ``requests_auto`` attribute: the requests tried, the cap, and how it ended."""
    facts = steady_state_facts(ds)
    runs = " -> ".join(f"{n:,}" for n in tried)
    if facts is None:
        end = "every sample run at steady state"
    elif tried[-1] >= cap:
        end = f"cap reached with {facts['count']} of {facts['runs']} sample runs not at steady state"
    elif facts["saturated"] >= facts["count"]:
        end = f"stopped: the {facts['count']} unsteady sample runs saturate their simulated queue"
    else:
        end = f"stopped: the replayed trace holds no more requests ({_trace_supply(ds):,})"
    return f"requests per sample {runs} (cap {cap:,}): {end}"
