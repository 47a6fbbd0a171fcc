"""The replicas fed a part at a time (mcsim.perf.fleet_stream) against the whole run of the same requests: every
request's outputs, every instance's steps and the window's sums, bit for bit, whatever the parts and slots."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import DECODE_EDGES, TABLE, random_blocks, random_settings, random_workload

from mcsim.errors import RunLimitError
from mcsim.kernels import batching_helpers as codes
from mcsim.perf.batching import _per_request, _summary
from mcsim.perf.fleet_batching import REPLICA_SCHEDULERS, _fleet_log, simulate_fleet_batching
from mcsim.perf.fleet_stream import OUTPUTS, FleetStream

#: The routers a stream runs: none that reads the loop's prefix caches.
ROUTERS = ("round-robin", "random", "least-outstanding", "least-kv", "prefix-affinity")
POLICIES = REPLICA_SCHEDULERS


def slots_needed(arrival, finish) -> int:
    """About the fewest slots a stream of these requests runs in: while the loop waits for request ``g``, the
    requests before it that finish at or after request ``g - 1``'s arrival still hold theirs; two more for the
    request going in and the step boundaries."""
    in_flight = [int(np.count_nonzero(finish[:g] >= arrival[g - 1])) for g in range(1, len(arrival) + 1)]
    return max(in_flight) + 2


def parts(rng, n, at=None):
    """Cut ``0 .. n`` into parts of random sizes (single requests among them), and at ``at`` if given."""
    cuts = set(rng.choice(np.arange(1, n), size=min(n - 1, int(rng.integers(0, 8))), replace=False).tolist()) \
        if n > 1 else set()
    if at is not None and 0 < at < n:
        cuts.add(int(at))
    return np.split(np.arange(n), sorted(cuts))


@pytest.mark.parametrize("router", ROUTERS)
def test_stream_equals_the_whole_run_bit_for_bit(router):
    for seed in range(30):
        rng = np.random.default_rng([seed, ROUTERS.index(router), 21])
        n = int(rng.integers(1, 150))
        k = int(rng.integers(1, 5))
        arrival, _, _, output, passes = random_workload(rng, n, rng.uniform(5.0, 400.0), ties=True, think=False)[:5]
        block_tokens = int(rng.integers(1, 32))
        _, prompt, ptr, ids = random_blocks(rng, n, block_tokens)
        settings = random_settings(rng, output, prompt, block_tokens=block_tokens)
        largest = int(((prompt + output + block_tokens - 1) // block_tokens).max())
        settings["kv_blocks"] = largest + int(rng.integers(0, 2 * largest))  # tight pools preempt
        priority = rng.integers(0, 3, n)
        uniform = rng.uniform(size=n)
        options = {"policy": POLICIES[seed % len(POLICIES)], "preempt": seed % 3 == 1,
                   "max_new_per_step": int(rng.integers(0, 3)) if seed % 5 == 2 else 0,
                   "kv_slope": rng.uniform(0.0, 1e-5, DECODE_EDGES.size) if seed % 2 else None,
                   "kv_ref_context": 50.0, "warmup_s": float(rng.uniform(0, arrival[-1])),
                   "balance": float(rng.uniform(0, 1)), "balance_requests": int(rng.integers(0, 4)),
                   "max_steps": int(rng.integers(0, 30)), **TABLE, **settings}
        whole = simulate_fleet_batching(arrival, prompt, prompt, output, passes, n_instances=k, router=router,
                                        router_uniform=uniform, block_ptr=ptr, block_ids=ids, priority=priority,
                                        **options)
        wp = whole["per_request"]
        fewest = slots_needed(arrival, wp["finish_s"])
        # Half the time (not under static batching) the window's start is given only before the first request that
        # arrives at or after it.
        later = seed % 2 == 0 and options["policy"] != "static"
        first = int(np.searchsorted(arrival, options["warmup_s"], side="left"))
        stream = FleetStream(n, slots=fewest + int(rng.integers(0, 4)), n_instances=k, router=router,
                             **{**options, "warmup_s": None if later else options["warmup_s"]})
        got = []
        for part in parts(rng, n, first if later else None):
            lo, hi = part[0], part[-1] + 1
            if later and lo == first:
                stream.start_window(options["warmup_s"])
            got.append(stream.add(arrival[lo:hi], prompt[lo:hi], prompt[lo:hi], output[lo:hi], passes[lo:hi],
                                  router_uniform=uniform[lo:hi], block_ptr=ptr[lo:hi + 1] - ptr[lo],
                                  block_ids=ids[ptr[lo]:ptr[hi]], priority=priority[lo:hi]))
        if later and first == n:
            stream.start_window(options["warmup_s"])
        got.append(stream.finish())
        per = {name: np.concatenate([g[name] for g in got]) for name in (*OUTPUTS, "index")}
        order = np.argsort(per["index"])  # (handed back as slots were needed, in any order)
        per = {name: values[order] for name, values in per.items()}
        np.testing.assert_array_equal(per["index"], np.arange(n))
        for name in OUTPUTS:
            np.testing.assert_array_equal(per[name], wp[name], err_msg=f"{name}, seed {seed}")
        np.testing.assert_array_equal(stream.instance_steps, whole["summary"]["instance_steps"])
        # The window's figures from the stream's statistics and outputs: those of the whole run, exactly.
        summary = _summary(_per_request(per["arrival_s"], per["first_token_s"], per["finish_s"], per["queue_s"],
                                        output, options["warmup_s"]), output, options["warmup_s"], stream.stats)
        for name, value in summary.items():
            if name == "busy_fraction":  # a fleet's is over its instances (mean_step_s holds the same sum)
                continue
            np.testing.assert_array_equal(value, whole["summary"][name], err_msg=f"{name}, seed {seed}")
        log = _fleet_log(stream.log, stream.instance_steps, options["max_steps"])
        if log is None:
            assert whole["step_log"] is None
        else:
            for name, values in log.items():
                np.testing.assert_array_equal(values, whole["step_log"][name], err_msg=f"log {name}, seed {seed}")


def test_a_fleet_that_falls_behind_outgrows_its_slots_and_says_so():
    """Arrivals far faster than one instance serves: the requests in flight outgrow the slots, which the stream
    refuses in one line, naming the key that sets them; with enough slots the same run completes."""
    n = 400
    arrival = np.linspace(0.0, 1.0, n)
    tokens = np.full(n, 200, np.int64)
    output = np.full(n, 40, np.int64)
    settings = {"token_budget": 256, "max_seqs": 4, "kv_blocks": 1000, "block_tokens": 16, **TABLE}
    stream = FleetStream(n, slots=64, n_instances=1, router="round-robin", key="mc.chunk_requests", **settings)
    with pytest.raises(RunLimitError, match=r"^mc\.chunk_requests: more than 6\d requests in flight"):
        for lo in range(0, n, 50):
            stream.add(arrival[lo:lo + 50], tokens[lo:lo + 50], tokens[lo:lo + 50], output[lo:lo + 50])
    stream = FleetStream(n, slots=n, n_instances=1, router="round-robin", **settings)
    done = [stream.add(arrival, tokens, tokens, output), stream.finish()]
    index = np.concatenate([d["index"] for d in done])
    np.testing.assert_array_equal(np.sort(index), np.arange(n))
    assert np.all(np.diff(np.concatenate([d["finish_s"] for d in done])[np.argsort(index)]) >= 0)  # FCFS, one instance


def test_a_stream_touches_the_slots_its_requests_in_flight_need_not_those_it_holds():
    """A light load through a stream with a slot for every request: the slots it ever uses stay within what its
    requests in flight need (:func:`slots_needed`, from the whole run's finish times) and one part, not the slots it
    holds; and its requests are the whole run's."""
    n, part = 600, 20
    rng = np.random.default_rng(7)
    arrival = np.cumsum(rng.exponential(0.5, n))
    tokens = rng.integers(16, 200, n)
    output = rng.integers(1, 30, n)
    settings = {"token_budget": 256, "max_seqs": 8, "kv_blocks": 1000, "block_tokens": 16, **TABLE}
    whole = simulate_fleet_batching(arrival, tokens, tokens, output, n_instances=2, router="round-robin",
                                    **settings)["per_request"]
    stream = FleetStream(n, slots=n, n_instances=2, router="round-robin", **settings)
    done = [stream.add(arrival[lo:lo + part], tokens[lo:lo + part], tokens[lo:lo + part], output[lo:lo + part])
            for lo in range(0, n, part)]
    done.append(stream.finish())
    assert stream.touched <= slots_needed(arrival, whole["finish_s"]) + part < n // 4
    index = np.concatenate([d["index"] for d in done])
    finish = np.concatenate([d["finish_s"] for d in done])
    np.testing.assert_array_equal(finish[np.argsort(index)], whole["finish_s"])


def test_the_stream_refuses_what_it_cannot_run():
    settings = {"kv_blocks": 100, **TABLE}
    with pytest.raises(ValueError, match="cache-aware router reads the loop's prefix caches"):
        FleetStream(10, slots=8, n_instances=2, router="cache-aware", **settings)
    stream = FleetStream(3, slots=8, n_instances=2, router="round-robin", **settings)
    stream.add([1.0], [10], [10], [3])
    with pytest.raises(ValueError, match="sorted, part after part"):
        stream.add([0.5], [10], [10], [3])
    with pytest.raises(ValueError, match="1 to 2 requests"):
        stream.add([2.0, 3.0, 4.0], [10] * 3, [10] * 3, [3] * 3)
    with pytest.raises(ValueError, match="2 of the 3 requests were not put in"):
        stream.finish()


def test_a_pool_window_from_finished_requests_is_the_whole_run_summary():
    """replicas_stream.PoolWindow, fed a whole run's requests in pieces and out of finishing order, against
    batching._summary and queue_steady_state on the same arrays: counts and output tokens in the window exactly,
    means to the nanosecond, and the histogram-read figures (second-half completion ratio, queue-wait drift) within
    what one bin of 65,536 can move."""
    from mcsim.perf.batching import queue_steady_state
    from mcsim.perf.replicas_stream import PoolWindow

    rng = np.random.default_rng(7)
    arrival, prompt, _, output, passes = random_workload(rng, 3000, 40.0, think=False)[:5]
    settings = {"token_budget": 512, "max_seqs": 4, "kv_blocks": 400, "block_tokens": 16, **TABLE}
    warmup = float(arrival[300])
    whole = simulate_fleet_batching(arrival, prompt, prompt, output, passes, n_instances=3, router="round-robin",
                                    warmup_s=warmup, **settings)
    per, summary = whole["per_request"], whole["summary"]
    stats = np.zeros(codes.N_STATS)  # the window's statistics the summary read
    stats[codes.STAT_WINDOW_END_S] = summary["window_s"][1]
    stats[codes.STAT_IN_SYSTEM_INTEGRAL] = summary["mean_in_system"] * (summary["window_s"][1] - warmup)
    stats[codes.STAT_WAITING_AT_WINDOW_END] = summary["waiting_at_window_end"]
    window = PoolWindow(3, float(arrival[-1]) * 1.02 + 600.0, None, not_before_s=float(arrival[0]))
    cut = 1000
    measured = per["measured"]
    window.add(per["arrival_s"][:cut], per["finish_s"][:cut], per["queue_s"][:cut], output[:cut], measured[:cut],
               per["instance"][:cut])
    window.start(warmup)  # the window's start, given after some requests had finished
    for part in np.array_split(np.arange(cut, len(arrival)), 5):
        window.add(per["arrival_s"][part], per["finish_s"][part], per["queue_s"][part], output[part],
                   measured[part], per["instance"][part], window_end=summary["window_s"][1])
    got = window.summary(stats, 0.1)
    assert got["measured_requests"] == summary["measured_requests"] > 2000
    assert got["throughput_tok_s"] == summary["throughput_tok_s"]  # output tokens finishing in the window
    assert got["mean_time_in_system_s"] == pytest.approx(summary["mean_time_in_system_s"], abs=1e-9)
    assert got["little_law_ratio"] == pytest.approx(summary["little_law_ratio"], rel=1e-9)
    served = np.bincount(per["instance"][measured], minlength=3)
    assert got["instance_load_imbalance"] == pytest.approx(served.max() / served.mean())
    # The second half's arrivals and completions, as _summary counts them; a boundary bin moves each by at most the
    # requests one bin holds (here about one: 3,000 requests over 65,536 bins).
    end = summary["window_s"][1]
    middle = warmup + 0.5 * (end - warmup)
    arrivals = np.count_nonzero((per["arrival_s"] >= middle) & (per["arrival_s"] <= end))
    completions = np.count_nonzero((per["finish_s"] >= middle) & (per["finish_s"] <= end))
    one_bin = 3
    assert abs(got["completion_ratio"] - summary["completion_ratio"]) <= \
        summary["completion_ratio"] * one_bin * (1 / arrivals + 1 / completions)
    drift = queue_steady_state(per, summary, 0.1)
    assert got["queue_steady_state"].drift == pytest.approx(drift.drift, abs=0.02)
    assert got["queue_steady_state"].steady == drift.steady


def test_a_slot_of_the_stream_is_the_129_bytes_its_docstring_counts():
    """Inputs, outputs and bookkeeping per slot (mcsim.perf.fleet_stream's docstring, sample.SLOT_BYTES): the arrays
    the stream allocates, plus the loop's one-column cached-tokens output it passes at its first run."""
    stream = FleetStream(1000, slots=1000, n_instances=2, router="round-robin", kv_blocks=100, **TABLE)
    arrays = [*stream.inputs.values(), *stream.outputs.values(), stream.slot_of, stream.free, stream.occupied,
              stream.index]
    assert sum(a.nbytes for a in arrays) + 8 * 1000 == 129 * 1000
