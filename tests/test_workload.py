"""The workload generator against its definition: renewal arrivals, chain-hash prefix semantics, multi-turn reuse."""

import numpy as np
import pytest

from mcsim.scenario import draw_uncertain, load_scenario, resolve
from mcsim.stages import workload

TOML = """
[mc]
requests = 4000
[cache]
block_tokens = 16
[workload]
rate_rps = 10.0
system_prompts = 20
system_prompt_zipf = 1.2
system_prompt_tokens = { dist = "lognormal", median = 100, sigma = 0.5 }
think_time_s = 5.0
[workload.classes.chat]
share = 0.7
turns = 3.0
prompt_tokens = { dist = "lognormal", median = 50, sigma = 0.8 }
output_tokens = { dist = "lognormal", median = 40, sigma = 0.5 }
[workload.classes.code]
share = 0.3
turns = 1.0
system_prompt_share = 1.0
prompt_tokens = 30
output_tokens = 20
"""


def _requests(extra="", n=4000, seed=3):
    scn = load_scenario("t.toml", text=TOML + extra)
    p = resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [0], seed).items()})
    return workload.generate(p, scn.classes, n, np.random.default_rng(seed), 1_000_000), p


def test_block_ids_have_chain_hash_semantics():
    # Two requests share block k only if they share every block before it (a prefix tree), as chain hashes do.
    req, _ = _requests()
    parent = {}
    for r in range(req.n):
        blocks = req.block_ids[req.block_ptr[r]:req.block_ptr[r + 1]].tolist()
        for k, b in enumerate(blocks):
            prefix = tuple(blocks[:k])
            assert parent.setdefault(b, prefix) == prefix
    # and only whole blocks are listed
    assert np.array_equal(np.diff(req.block_ptr), req.prompt_tokens // req.block_tokens)


def test_later_turns_carry_the_earlier_conversation():
    req, _ = _requests()
    # Reference: within a session, every turn's whole blocks start with all whole blocks of the previous turn,
    # and its prompt is longer than the previous prompt plus the previous answer.
    last = {}
    later_turns = 0
    for r in range(req.n):
        blocks = req.block_ids[req.block_ptr[r]:req.block_ptr[r + 1]].tolist()
        s = int(req.session_id[r])
        if s in last:
            prev_blocks, prev_prompt, prev_out = last[s]
            assert blocks[:len(prev_blocks)] == prev_blocks
            assert req.prompt_tokens[r] > prev_prompt + prev_out
            later_turns += 1
        last[s] = (blocks, int(req.prompt_tokens[r]), int(req.output_tokens[r]))
    # Geometric turns with mean 3 (chat, 70 %) make 2/3 of chat requests later turns; the window's start and end
    # cut some sessions short.
    assert 0.7 * 2 / 3 * 0.8 < later_turns / req.n < 0.7 * 2 / 3 * 1.05


def test_class_shares_and_lengths():
    req, p = _requests()
    share_code = np.mean(req.class_id == 1)
    # Request shares follow the class shares (binomial standard error ~ 0.007).
    assert share_code == pytest.approx(0.3, abs=0.05)
    out_chat = req.output_tokens[req.class_id == 0]
    expected = 40 * np.exp(0.5**2 / 2)  # lognormal mean (rounding shifts it by < 0.5)
    assert out_chat.mean() == pytest.approx(expected, rel=0.05)
    assert np.all(req.output_tokens[req.class_id == 1] == 20)


def test_poisson_arrivals():
    req, _ = _requests()
    gaps = np.diff(req.arrival_s)
    assert req.arrival_s[0] == 0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(1 / 10.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.06)


def test_gamma_arrivals_have_requested_burstiness():
    t = workload.renewal_arrivals(200_000, 5.0, "gamma", 4.0, np.random.default_rng(1))
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.2, rel=0.02)
    assert (gaps.var() / gaps.mean() ** 2) == pytest.approx(4.0, rel=0.05)


def test_zipf_system_prompt_popularity():
    p = workload.zipf_probabilities(20, 1.2)
    ref = np.array([1 / r**1.2 for r in range(1, 21)])
    np.testing.assert_allclose(p, ref / ref.sum())


def test_context_limit_drops_later_turns():
    scn = load_scenario("t.toml", text=TOML)
    p = resolve(scn, {})
    req = workload.generate(p, scn.classes, 3000, np.random.default_rng(0), 400)
    assert np.all(req.prompt_tokens + req.output_tokens <= 400)


def test_mooncake_trace_keeps_whole_blocks_only():
    from mcsim.stages import requests_trace as traces

    trace = traces.read_trace(traces.bundled_trace_path("mooncake"))
    scn = load_scenario("t.toml", text=TOML)
    req = workload.from_trace(trace, resolve(scn, {}), scn.classes, 500, np.random.default_rng(0))
    assert req.block_tokens == 512
    assert np.array_equal(np.diff(req.block_ptr), req.prompt_tokens // 512)
    first = trace.block_hashes[trace.block_ptr[0]:trace.block_ptr[1]]
    assert np.array_equal(req.block_ids[: req.block_ptr[1]], first[: req.prompt_tokens[0] // 512])


# --- trace replay: time scaling and windows --------------------------------------------------------


def _replay(name, n, **keys):
    from mcsim.stages import requests_trace as traces

    trace = traces.read_trace(traces.bundled_trace_path(name))
    extra = "".join(f"{key} = {value!r}\n" for key, value in keys.items())
    scn = load_scenario("t.toml", text=TOML.replace("[workload]\n", "[workload]\n" + extra))
    return trace, workload.from_trace(trace, resolve(scn, {}), scn.classes, n, np.random.default_rng(0))


def test_time_scale_two_halves_the_replay():
    trace, plain = _replay("azure-code", 2000)
    _, fast = _replay("azure-code", 2000, trace_time_scale=2.0)
    np.testing.assert_array_equal(plain.arrival_s, trace.arrival_s[:2000])
    # Dividing by a power of two is exact, so the halving is exact too.
    np.testing.assert_array_equal(fast.arrival_s, plain.arrival_s / 2)
    assert fast.duration_s == plain.duration_s / 2
    np.testing.assert_array_equal(fast.prompt_tokens, plain.prompt_tokens)
    np.testing.assert_array_equal(fast.output_tokens, plain.output_tokens)
    assert "replayed at 2x the recorded rate" in fast.source and "recorded rate" not in plain.source


def test_window_start_skips_to_the_first_request_at_or_after_it():
    trace, window = _replay("azure-code", 300, trace_start_s=600.0, trace_time_scale=4.0)
    first = int(np.argmax(trace.arrival_s >= 600.0))
    assert trace.arrival_s[first - 1] < 600.0 <= trace.arrival_s[first]
    np.testing.assert_array_equal(window.prompt_tokens, trace.prompt_tokens[first:first + 300])
    np.testing.assert_array_equal(window.output_tokens, trace.output_tokens[first:first + 300])
    np.testing.assert_allclose(window.arrival_s, (trace.arrival_s[first:first + 300] - trace.arrival_s[first]) / 4,
                               rtol=0, atol=1e-12)
    assert window.arrival_s[0] == 0.0
    assert f"from {trace.arrival_s[first]:g} s of the trace" in window.source


def test_window_near_the_end_returns_what_is_left():
    trace, _ = _replay("azure-code", 1)
    start = float(trace.arrival_s[-3])
    _, window = _replay("azure-code", 10_000, trace_start_s=start)
    left = len(trace) - int(np.searchsorted(trace.arrival_s, start))
    assert window.n == left >= 3
    np.testing.assert_array_equal(window.prompt_tokens, trace.prompt_tokens[-left:])


def test_window_keeps_each_requests_blocks():
    trace, window = _replay("mooncake", 200, trace_start_s=300.0)
    first = int(np.searchsorted(trace.arrival_s, 300.0))
    for r in (0, 1, 57, 199):
        expected = trace.block_hashes[trace.block_ptr[first + r]:trace.block_ptr[first + r + 1]]
        got = window.block_ids[window.block_ptr[r]:window.block_ptr[r + 1]]
        assert np.array_equal(got, expected[: trace.prompt_tokens[first + r] // 512])
    assert workload.NO_PREFIX_NOTE not in window.source


def test_window_after_the_trace_is_an_error():
    from mcsim.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=r"workload.trace_start_s = 5000 s is after the trace's last request"):
        _replay("azure-code", 10, trace_start_s=5000.0)
    with pytest.raises(ScenarioError, match=r"trace_time_scale.*expected a number in \[1e-06, 1e\+06\]"):
        _replay("azure-code", 10, trace_time_scale=0.0)


def test_traces_without_prefixes_say_so():
    _, azure = _replay("azure-conv", 100)
    assert azure.source.endswith(workload.NO_PREFIX_NOTE)
    assert azure.block_ids.size == 0


def test_engine_replays_the_scenario_window():
    from mcsim.execution import sample as engine

    text = TOML.replace("[workload]\n", '[workload]\ntrace = "bundled:azure-code"\ntrace_time_scale = 2.0\n'
                                        "trace_start_s = 60.0\n")
    scn = load_scenario("t.toml", text=text)
    req = engine.sample_requests(scn, resolve(scn, {}), 0, 0, 50)
    assert req.n == 50 and req.arrival_s[0] == 0.0
    assert "replayed at 2x" in req.source and req.source.endswith(workload.NO_PREFIX_NOTE)


@pytest.mark.parametrize("n", [2000, 8000])
def test_the_window_opens_and_closes_on_the_steady_mix_of_turns(n):
    # Chat sessions (3 turns on average) bring 70 % of the requests, single-turn code ones 30 %: in a stationary
    # stream every stretch of requests has that mix. With think times far longer than the window (15 s x 650
    # requests/s against n requests), a window of sessions that all start inside it would open on first turns
    # (too few chat requests) and, once its sessions run out, close on later turns only (chat alone).
    text = TOML.replace("rate_rps = 10.0", "rate_rps = 650.0").replace("think_time_s = 5.0", "think_time_s = 15.0")
    scn = load_scenario("t.toml", text=text)
    p = resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 3).items()})
    req = workload.generate(p, scn.classes, n, np.random.default_rng(3), 1_000_000)
    chat = req.class_id == req.class_names.index("chat")
    for quarter in np.array_split(chat, 4):
        share = quarter.mean()
        assert abs(share - 0.7) < 4 * np.sqrt(0.7 * 0.3 / quarter.size), share


@pytest.mark.parametrize("extra", ["", "rate_profile = [1, 3, 0, 2]\nrate_profile_period_s = 600\n"])
def test_a_stream_of_chunks_is_the_sample_whatever_the_chunks(extra):
    """Chunks of any sizes, joined, are the one-piece sample: every field, block ids included (sessions in flight,
    block ids and every random stream carry over from chunk to chunk)."""
    text = TOML.replace("[workload]\n", "[workload]\n" + extra)
    scn = load_scenario("t.toml", text=text)
    p = resolve(scn, {})
    n = 5000
    whole = workload.generate(p, scn.classes, n, np.random.default_rng(11), 2000)
    stream = workload.RequestStream(p, scn.classes, n, np.random.default_rng(11), 2000)
    sizes = np.random.default_rng(0)
    parts = []
    while stream.remaining:
        parts.append(stream.next_chunk(int(sizes.integers(1, 1500))))
    assert len(parts) > 3 and stream.next_chunk(10).n == 0
    joined = workload.concat_requests(parts)
    for name in ("arrival_s", "class_id", "prompt_tokens", "output_tokens", "acceptance", "block_ptr", "session_id",
                 "block_ids"):
        np.testing.assert_array_equal(getattr(joined, name), getattr(whole, name), err_msg=name)
    # Each session's turns arrive in order and carry the conversation so far.
    for s in np.unique(whole.session_id)[:200]:
        prompts = whole.prompt_tokens[whole.session_id == s]
        assert np.all(np.diff(prompts) > 0)
    assert np.all(whole.prompt_tokens + whole.output_tokens <= 2000)


# ---------------------------------------------------------------------------------------------------------------
# The generator's kernels against their plain-Python reference (mcsim.reference.workload)
# ---------------------------------------------------------------------------------------------------------------

FIELDS = ("t", "acceptance", "class", "prompt", "output", "session", "nblocks", "sys_full", "sys_base", "own_base")


def _kernel_rows(t, acceptance, ints, kept):
    from mcsim.kernels import workload as kw
    columns = {"class": kw.COL_CLASS, "prompt": kw.COL_PROMPT, "output": kw.COL_OUTPUT, "session": kw.COL_SESSION,
               "nblocks": kw.COL_NBLOCKS, "sys_full": kw.COL_SYS_FULL, "sys_base": kw.COL_SYS_BASE,
               "own_base": kw.COL_OWN_BASE}
    return [{"t": float(t[r]), "acceptance": float(acceptance[r]),
             **{name: int(ints[r, col]) for name, col in columns.items()}} for r in range(kept)]


def _random_block(g):
    """A block of sessions whose draws reach every branch: rounding at halves and below 1, answers over half the
    context, first turns clipped, later turns dropped, acceptance outside [0, 1], turns before time 0."""
    m, classes = int(g.integers(1, 40)), int(g.integers(1, 4))
    session_class = g.integers(0, classes, m)
    turns = g.geometric(1 / g.uniform(1, 5), m).astype(np.int64)
    per_class = np.bincount(session_class, weights=turns, minlength=classes).astype(np.int64)
    rows = int(turns.sum())

    def draws(scale):
        x = g.lognormal(np.log(scale), 1.2, rows)
        halves = g.random(rows) < 0.15  # exact halves: rounded to the even neighbour
        x[halves] = g.integers(0, 200, int(halves.sum())) + 0.5
        return np.where(g.random(rows) < 0.1, g.uniform(0, 1.6, rows), x)

    max_context = int(g.choice([64, 300, 2000, 100_000]))
    block = int(g.choice([1, 16, 512]))
    return dict(
        session_class=session_class.astype(np.int64), turns=turns,
        sys_len=np.where(g.random(m) < 0.5, g.integers(1, 2 * max_context, m), 0).astype(np.int64),
        sys_base=g.integers(0, 1000, m).astype(np.int64),
        class_first=np.concatenate([[0], np.cumsum(per_class)[:-1]]).astype(np.int64),
        user_draws=draws(80), output_draws=draws(60), acceptance_draws=g.uniform(-0.3, 1.3, rows),
        start=np.sort(g.uniform(-50, 50, m)), think_s=g.exponential(5, rows), max_context=max_context,
        block_tokens=block, drop_before_zero=bool(g.random() < 0.5), first_session=int(g.integers(0, 100)),
        next_base=int(g.integers(0, 10_000)))


@pytest.mark.parametrize("seed", range(6))
def test_session_rows_kernel_matches_the_reference(seed):
    from mcsim.kernels.workload import N_INT_COLUMNS, session_rows
    from mcsim.reference import workload as ref

    g = np.random.default_rng(seed)
    for _ in range(40):
        block = _random_block(g)
        rows = int(block["turns"].sum())
        t, acceptance = np.empty(rows), np.empty(rows)
        ints = np.empty((rows, N_INT_COLUMNS), dtype=np.int64)
        kept, base = session_rows(*block.values(), t, acceptance, ints)
        expected, expected_base = ref.session_rows(*block.values())
        assert base == expected_base
        assert _kernel_rows(t, acceptance, ints, kept) == expected


def test_session_rows_reach_each_rule():
    """The random blocks above do reach the rules they are meant to check (so a rule left out would be caught)."""
    from mcsim.reference import workload as ref

    g = np.random.default_rng(0)
    seen = {"dropped later turn": 0, "clipped first turn": 0, "before zero": 0, "one-token floor": 0}
    for _ in range(200):
        block = _random_block(g)
        rows, _ = ref.session_rows(*block.values())
        kept = sum(1 for r in rows)
        seen["dropped later turn"] += kept < int(block["turns"].sum()) and not block["drop_before_zero"]
        seen["clipped first turn"] += any(r["prompt"] + r["output"] > block["max_context"] for r in rows)
        seen["before zero"] += block["drop_before_zero"] and any(block["start"] < 0)
        seen["one-token floor"] += any(r["output"] == 1 for r in rows)
    assert all(count > 5 for count in seen.values()), seen


@pytest.mark.parametrize("seed", range(4))
def test_merge_rows_kernel_matches_the_reference(seed):
    from mcsim.kernels.workload import N_INT_COLUMNS, merge_rows
    from mcsim.reference import workload as ref

    g = np.random.default_rng(seed)
    for _ in range(30):
        a, b = int(g.integers(0, 60)), int(g.integers(0, 60))
        old_t = np.sort(g.integers(0, 20, a).astype(float))  # whole numbers: ties between and within old and new
        old_acc, old_int = g.random(a), g.integers(0, 10**6, (a, N_INT_COLUMNS))
        new_t = g.integers(0, 20, b).astype(float)
        new_acc, new_int = g.random(b), g.integers(0, 10**6, (b, N_INT_COLUMNS))
        order = np.argsort(new_t, kind="stable")
        old_from = int(g.integers(0, a + 1))
        total = a - old_from + b
        out_t, out_acc, out_int = np.empty(total), np.empty(total), np.empty((total, N_INT_COLUMNS), np.int64)
        merge_rows(old_t, old_acc, old_int, old_from, new_t, new_acc, new_int, order, out_t, out_acc, out_int)

        def rows(t, acc, ints, index):
            return [{"t": float(t[r]), "acceptance": float(acc[r]), "ints": ints[r].tolist()} for r in index]

        expected = ref.merge_rows(rows(old_t, old_acc, old_int, range(old_from, a)),
                                  rows(new_t, new_acc, new_int, range(b)))
        assert rows(out_t, out_acc, out_int, range(total)) == expected
