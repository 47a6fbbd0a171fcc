"""The benchmark suite's structure and outputs (speed is claimed by the benchmarks, never by these tests).

The suite runs once, in its ``tiny`` size, into a temporary folder; the tests read what it returned and wrote.
The NumPy-vectorized references that the suite reports as a second column are checked against exact results
and the pure-Python references here, so that a ratio against them compares like with like.
"""

from __future__ import annotations

import json
import os
import random
import struct

import numpy as np
import pytest

from mcsim.bench import kernels
from mcsim.bench import run as bench_run
from mcsim.bench.report import PNG_SIGNATURE, format_table
from mcsim.bench.run import run_suite
from tests.helpers import python_prints


#: This process's CPUs before any test ran.
AFFINITY = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("bench")
    return run_suite(False, out_dir, size="tiny", progress=None), out_dir


def test_every_stage_has_kernel_rows_with_positive_throughputs(suite):
    result, _ = suite
    rows = result["kernels"]
    assert {r["stage"] for r in rows} == set(kernels.STAGES)
    for r in rows:
        assert r["fast"] > 0 and r["reference"] > 0, r["name"]
        assert r["items_fast"] > 0 and r["items_reference"] > 0
        assert r["fast"] == pytest.approx(r["items_fast"] / r["fast_s"], rel=1e-12)
        assert r["reference"] == pytest.approx(r["items_reference"] / r["reference_s"], rel=1e-12)
        assert r["ratio"] == pytest.approx(r["fast"] / r["reference"], rel=1e-12)


def test_numpy_column_where_a_vectorized_reference_exists(suite):
    result, _ = suite
    with_numpy = {r["name"] for r in result["kernels"] if r["numpy"] is not None}
    assert any(name.startswith("speculative") for name in with_numpy)
    assert any(name.startswith("expert routing") for name in with_numpy)
    assert not any(name.startswith("KV tiers") for name in with_numpy)
    for r in result["kernels"]:
        if r["numpy"] is None:
            assert r["ratio_numpy"] is None
        else:
            assert r["numpy"] > 0
            assert r["ratio_numpy"] == pytest.approx(r["fast"] / r["numpy"], rel=1e-12)


def test_json_written_and_ratios_recomputed_from_it(suite):
    result, out_dir = suite
    saved = json.loads((out_dir / "bench.json").read_text())
    assert saved["suite"] == "tiny"
    assert len(saved["kernels"]) == len(result["kernels"])
    for row in saved["kernels"]:
        assert row["fast"] > 0 and row["reference"] > 0
        assert row["ratio"] == pytest.approx(row["fast"] / row["reference"], rel=1e-12)
        target = row["target"]
        assert target is None or (isinstance(target["met"], bool) and target["text"])
    assert saved["machine"]["cpu_count"] >= 1 and saved["machine"]["processor"]
    for target in saved["targets"]:
        assert target["met"] in (True, False, None) and target["figure"]
    assert {"requests", "grid", "workers", "overhead", "compile"} <= set(saved["scaling"])


def test_targets_follow_the_rows(suite):
    result, _ = suite
    targets = {t["target"]: t for t in result["targets"]}
    kv = [r for r in result["kernels"] if r["stage"] == "kv_tiers"]
    assert targets["KV tiers: >= 50 M block look-ups/s/core"]["met"] == all(r["fast"] >= 50e6 for r in kv)
    assert targets["KV tiers: >= 50x the OrderedDict reference"]["met"] == all(r["ratio"] >= 50 for r in kv)
    batching = [r for r in result["kernels"] if r["stage"] == "batching"]
    assert all(r["target"]["met"] == (r["fast"] >= 1e6) for r in batching)
    # The tiny suite has no sample of a million requests.
    assert [t["met"] for t in result["targets"] if t["target"].startswith("end to end")] == [None]


def test_scaling_parts(suite):
    result, _ = suite
    sc = result["scaling"]
    sizes = [r["requests"] for r in sc["requests"]]
    assert sizes == list(bench_run.SETTINGS["tiny"].request_sizes)
    for r in sc["requests"]:
        assert r["seconds"] > 0 and r["first_call_s"] >= r["seconds"]
        assert r["requests_per_s"] == pytest.approx(r["requests"] / r["seconds"])
    assert [r["points"] for r in sc["grid"]["rows"]] == list(bench_run.SETTINGS["tiny"].grid_points)
    workers = sc["workers"]
    assert workers["workers"][0] == 1
    for kind in ("threads", "independent"):
        assert len(workers[kind]["seconds"]) == len(workers["workers"])
        assert workers[kind]["efficiency"][0] == pytest.approx(1.0)
    assert sc["overhead"]["tasks"] == bench_run.SETTINGS["tiny"].overhead_tasks
    # the tiny suite runs its samples in this process, which it must not pin to one core
    assert all(r["cores"] is None for r in sc["requests"])
    if AFFINITY is not None:
        assert os.sched_getaffinity(0) == AFFINITY


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_a_pinned_process_and_the_threads_it_starts_run_on_one_core():
    pinned, after, in_thread = json.loads(python_prints(
        "import json, os, threading", "from mcsim.bench.scaling import pin_to_one_core",
        "pinned = pin_to_one_core()", "seen = []",
        "t = threading.Thread(target=lambda: seen.append(len(os.sched_getaffinity(0))))", "t.start(); t.join()",
        "print(json.dumps([pinned, len(os.sched_getaffinity(0)), seen[0]]))"))
    assert pinned and after == 1 and in_thread == 1
    assert os.sched_getaffinity(0) == AFFINITY  # this process is left as it was


def test_png_is_a_valid_png(suite):
    _, out_dir = suite
    data = (out_dir / "scaling.png").read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 400 and height > 300
    assert data[-8:-4] == b"IEND"


def test_table_names_every_kernel_and_target(suite):
    result, _ = suite
    text = format_table(result)
    for r in result["kernels"]:
        assert r["name"] in text
    for t in result["targets"]:
        assert t["target"] in text
    assert "NumPy/s" in text and "target" in text


def test_bench_command_prints_and_returns_paths(suite, monkeypatch, capsys, tmp_path):
    result, _ = suite
    calls = []

    def fake_run_suite(quick, out_dir):
        calls.append((quick, out_dir))
        return result

    monkeypatch.setattr(bench_run, "run_suite", fake_run_suite)
    paths = bench_run.bench_command(True, True, tmp_path)
    assert calls == [(True, tmp_path)]
    assert json.loads(capsys.readouterr().out)["kernels"] == json.loads(json.dumps(result["kernels"]))
    assert set(paths) == {"json", "png"} and all(p.exists() for p in paths.values())
    bench_run.bench_command(False, False, None)
    assert calls[-1] == (False, None)
    assert "Performance targets (benchmarks/README.md)" in capsys.readouterr().out


def test_unknown_part_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark parts"):
        run_suite(True, tmp_path, parts=["nope"], progress=None)


# --- the NumPy references against exact results and the pure-Python references ---------------------------------


def test_numpy_speculative_exact_cases():
    output = np.array([1, 2, 7, 10, 33], np.int64)
    rng = np.random.default_rng(0)
    passes, accepted = kernels.verify_passes_numpy(output, np.full(5, 0.7), 0, 1.0, rng)
    assert passes.tolist() == output.tolist() and accepted.tolist() == [0] * 5
    passes, accepted = kernels.verify_passes_numpy(output, np.ones(5), 4, 1.0, rng)  # every draft accepted
    assert passes.tolist() == (-(-output // 5)).tolist()
    assert accepted.tolist() == (output - passes).tolist()


def test_numpy_speculative_matches_leviathan():
    # Long outputs, so that the capped last pass of each request hardly matters.
    alpha, k, n, tokens = 0.8, 4, 100, 20_000
    passes, _ = kernels.verify_passes_numpy(np.full(n, tokens, np.int64), np.full(n, alpha), k, 1.0,
                                            np.random.default_rng(1))
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    gains = np.arange(1, k + 2)
    law = np.append((1 - alpha) * alpha ** np.arange(k), alpha**k)  # 1 + leading accepted drafts
    sd = np.sqrt(law @ gains**2 - expected**2)
    total = passes.sum()
    tolerance = 4 * sd / np.sqrt(total) + expected * n / total  # sampling error + at most one short pass each
    assert n * tokens / total == pytest.approx(expected, abs=tolerance)


def test_numpy_routing_inclusion_matches_plackett_luce():
    from mcsim.reference.experts import plackett_luce_inclusion

    weights = np.array([[5.0, 3.0, 1.0, 1.0, 0.5, 0.0]])
    top_k, tokens, steps = 2, 4000, 5
    counts = kernels.route_steps_numpy(tokens, np.array([1.0]), weights, top_k, steps, np.random.default_rng(2))
    assert (counts.sum(axis=1) == tokens * top_k).all()
    assert counts[:, -1].sum() == 0  # a zero-weight expert is never chosen
    exact = np.array(plackett_luce_inclusion(weights[0].tolist(), top_k))
    n = tokens * steps
    se = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(counts.sum(axis=0) / n - exact) <= 4.5 * se + 1e-12)


def test_numpy_rank_loads_match_reference():
    from mcsim.reference.experts import rank_loads_reference

    rng = np.random.default_rng(3)
    phy2log = np.array([0, 1, 2, 3, 0, 1, 4, 5], np.int64)
    logcnt = np.bincount(phy2log, minlength=6)
    counts = rng.integers(0, 50, (7, 6))
    fast_max, fast_mean = kernels.rank_loads_numpy(counts, phy2log, logcnt, 4)
    ref_max, ref_mean = rank_loads_reference(counts.tolist(), phy2log.tolist(), logcnt.tolist(), 4)
    assert fast_max == pytest.approx(ref_max, rel=1e-12)
    assert fast_mean == pytest.approx(ref_mean, rel=1e-12)


def test_numpy_speculative_agrees_with_reference_in_distribution():
    from mcsim.reference.speculative import verify_passes

    output, acceptance = kernels.speculative_workload(400)
    ref_passes, _ = verify_passes(output.tolist(), acceptance.tolist(), 4, 0.9, random.Random(5))
    np_passes, _ = kernels.verify_passes_numpy(output, acceptance, 4, 0.9, np.random.default_rng(5))
    # Same requests, independent draws: per-request pass counts differ by noise only.
    diff = np_passes - np.array(ref_passes)
    assert abs(diff.mean()) <= 4 * diff.std(ddof=1) / np.sqrt(diff.size)


def test_the_frontier_day_runs_only_when_asked_and_reports_its_rate(tmp_path):
    """Asked for, the frontier day's sample runs (in a process of its own, but for the tiny suite) and the table
    quotes its time, rate and memory; its 15-minute target is judged at 10^8 requests only."""
    asked = run_suite(False, tmp_path, size="tiny", parts=["frontier"], progress=None)
    day = asked["scaling"]["frontier"]
    assert day["requests"] == 3_000 and day["seconds"] > 0 and day["peak_rss_mib"] > 50
    assert day["requests_per_s"] == pytest.approx(3_000 / day["seconds"], rel=1e-12)
    assert "the frontier day (scenarios/frontier-day.toml), one sample of 3,000 requests" in format_table(asked)
    assert not [t for t in asked["targets"] if t["target"].startswith("the frontier day")]


def test_the_default_suite_leaves_the_frontier_day_out(suite):
    result, _ = suite
    assert result["scaling"]["frontier"] is None


def test_a_run_is_compared_with_the_one_before_in_its_folder(tmp_path):
    """The second run in a folder reports each figure the first also has as a speed-up over it (its own two
    values recomputed here); the first has none to compare with."""
    first = run_suite(False, tmp_path, size="tiny", parts=["frontier"], progress=None)
    assert first["against_previous"] is None
    second = run_suite(False, tmp_path, size="tiny", parts=["frontier"], progress=None)
    rows = {r["figure"]: r for r in second["against_previous"]["rows"]}
    day = rows["the frontier day's sample, s"]
    assert day["before"] == first["scaling"]["frontier"]["seconds"]
    assert day["now"] == second["scaling"]["frontier"]["seconds"]
    assert day["speedup"] == pytest.approx(day["before"] / day["now"], rel=1e-12)
    assert "against the run before in this folder" in format_table(second)
