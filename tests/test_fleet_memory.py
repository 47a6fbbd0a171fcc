"""The memory a fleet's simulation takes per instance: stated before anything is allocated, equal to the bytes of the
arrays a small fleet allocates (so the statement cannot drift from the code), and refused in one line, before any
per-instance allocation, for every routing and mode, when it cannot fit."""

import re

import numpy as np
import pytest
from helpers import DENSE_NODE, TABLE, invoke, random_blocks

from mcsim.errors import RunLimitError
from mcsim.kernels import batching_helpers as slots
from mcsim.kernels import kv_tiers, step_loop
from mcsim.perf import fleet_batching, fleet_memory
from mcsim.scenario import draw_uncertain, load_scenario, resolve
from mcsim.scenario.choices import REPRESENTATIVE_ROUTERS, ROUTERS
from mcsim.stages import kvcache, workload
from mcsim.stages.kvcache_plan import replay_bytes, replay_plan

#: The factory's model with caches small enough that a few thousand requests fill them.
SMALL_CACHES = ("cache.hbm_gb_per_instance=30", "cache.dram_gb_per_node=20", "cache.nvme_gb_per_node=60")


def _factory_requests(n=1500):
    """The generator's requests: block ids as runs, over a sparse id space (the replay renumbers them)."""
    scn = load_scenario(DENSE_NODE.parent / "factory.toml", overrides=list(SMALL_CACHES))
    p = resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 4).items()})
    return workload.generate(p, scn.classes, n, np.random.default_rng(3), 20000)


def _small_id_requests(n=1500, runs=True):
    """Requests whose blocks are a system prompt's (one of three) and then their session's conversation so far,
    as runs of small ids; or the same ids written out only (as a trace gives them)."""
    rng = np.random.default_rng(7)
    sessions = 60
    system_blocks, system_base = np.array([4, 7, 0]), np.array([0, 100, 200])
    session = rng.integers(0, sessions, n)
    system = rng.integers(0, 3, n)
    grown = np.zeros(sessions, np.int64)
    own = np.empty(n, np.int64)
    for r in range(n):
        grown[session[r]] = min(grown[session[r]] + int(rng.integers(1, 4)), 40)
        own[r] = grown[session[r]]
    shared = system_blocks[system]
    counts = shared + own
    block_runs = np.stack([shared, system_base[system], 1000 + 50 * session - shared], axis=1)
    block_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    fields = dict(arrival_s=np.arange(n) * 0.01, class_id=np.zeros(n, np.int32), prompt_tokens=16 * counts + 1,
                  output_tokens=np.full(n, 10), acceptance=np.zeros(n), block_ptr=block_ptr, block_tokens=16,
                  session_id=session, class_names=("chat",), block_runs=block_runs)
    req = workload.Requests(**fields)
    if runs:
        return req
    return workload.Requests(**{**fields, "block_runs": None}, block_ids=req.block_ids.copy())


class _Allocations:
    """The arrays the KV-tier kernels are handed, recorded by wrapping their loops; the per-thread workspace is
    emptied first, so that the call allocates it afresh."""

    # Each loop's arguments that a replay allocates (the workspace is counted whole, from the thread's buffer).
    PICKS = {"_replay": (7, 8, 9, 13, 14), "_replay_runs": (6, 7, 8),
             # (not top: six int64, outside RunCaches.most_bytes; the hash table apart, below)
             "_replay_segments": (7, 8, 9, 10, 11, 12, 13, 14, 18, 19)}

    def __init__(self, monkeypatch):
        self.arrays, self.uses_workspace, self.table_at_most = {}, False, 0
        monkeypatch.setattr(kv_tiers._local, "state", None, raising=False)
        for name, picks in self.PICKS.items():
            workspace = name != "_replay_segments"  # the segments are the caches' own arrays
            monkeypatch.setattr(kv_tiers, name, self._wrap(getattr(kv_tiers, name), picks, workspace))

    def _wrap(self, loop, picks, workspace):
        def call(*args):
            self.arrays.update((id(args[i]), args[i]) for i in picks)  # a replay may call its loop again
            self.uses_workspace |= workspace
            if not workspace:  # the table grows as runs come: up to half full for every segment at most
                segments = args[7].shape[0]
                assert args[15].nbytes <= 4 * kv_tiers._slots(segments)
                self.table_at_most = 4 * kv_tiers._slots(segments)
            return loop(*args)
        return call

    @property
    def nbytes(self) -> int:
        workspace = kv_tiers._local.state.nbytes if self.uses_workspace else 0
        return workspace + sum(a.nbytes for a in self.arrays.values()) + self.table_at_most


@pytest.mark.parametrize("policy, caches, capacity, private, requests, kind", [
    ("cache-aware", 3, (200, 300, 900), -1, "factory", "routed"),  # a row per (instance, distinct block)
    ("cache-aware", 7, (20, 30, 90), -1, "small ids", "routed"),
    ("random", 5, (100, 0, 200), 2, "factory", "routed"),  # pooled tiers: the pool's rows too
    ("round-robin", 4, (200, 300, 900), -1, "small runs", "runs"),  # a row per key of the key space
    ("random", 2, (3, 2, 4), -1, "small runs", "runs"),  # bounded rows
    ("pooled", 4, (300, 500, 0), -1, "small runs", "runs"),
    ("prefix-affinity", 3, (200, 100, 0), -1, "small ids", "keys"),  # one key per (instance, block)
    ("round-robin", 4, (200, 300, 900), -1, "factory", "keys"),  # renumbered: at most a key per block
])
def test_the_cache_stage_allocates_what_its_plan_says(monkeypatch, policy, caches, capacity, private, requests, kind):
    req = {"factory": _factory_requests, "small runs": _small_id_requests,
           "small ids": lambda: _small_id_requests(runs=False)}[requests]()
    plan = replay_plan(req, policy, caches, np.array(capacity), private)
    stated = replay_bytes(plan, req)
    assert plan.kind == kind and replay_bytes(plan, req, exact=False) >= stated  # (a bound found without sorting)
    seen = _Allocations(monkeypatch)
    hits = kvcache.cache_hits(req, policy, caches, np.array(capacity), np.random.default_rng(0),
                              private_tiers=private).cached_tokens
    assert hits.sum() > 0 and seen.arrays
    if requests == "factory" and kind == "keys":  # the (instance, block) pairs the routing makes: at most the blocks
        assert seen.nbytes <= stated and seen.nbytes > 0.5 * stated
    else:
        assert seen.nbytes == stated


def test_the_step_loop_state_is_what_instance_bytes_says():
    for k, pf_cap, static, wheel, preempt, n_lists in [(1, 1, False, 2, True, 3), (5, 7, True, 16, False, 18),
                                                        (3, 4, False, 8, True, 12), (9, 256, True, 64, True, 27)]:
        steps, routing = step_loop.instance_arrays(k, pf_cap, static, wheel, preempt, n_lists, 100)
        assert sum(a.nbytes for a in (*steps, *routing)) == step_loop.instance_bytes(k, pf_cap, static, wheel,
                                                                                      preempt, n_lists)


def _kernel_layout(args):
    """What the step loop allocates per instance, read from its arguments as its prologue reads them."""
    passes, capacity, pooled, params, cache_state, instance_steps = args[4], args[12], args[13], args[14], args[24], \
        args[31]
    k, n = instance_steps.shape[0], passes.shape[0]
    static = params[slots.P_POLICY] == slots.POLICY_STATIC
    pf_cap = max(1, min(int(params[slots.P_MAX_SEQS]), n))
    shared = capacity[0] > 0 and not pooled and params[slots.P_POOLED_TIERS] > 0
    n_lists = len(capacity) * (k + 1 if shared else k)
    state = step_loop.instance_arrays(k, pf_cap, static, step_loop.wheel_length(k, int(passes.max()), pf_cap),
                                      params[slots.P_PREEMPT] != 0 and not static, n_lists, 0)
    logs = args[33:38]
    workspace = kv_tiers._local.state.nbytes if cache_state.shape[0] else 0
    return workspace + sum(a.nbytes for a in (*state[0], *state[1], instance_steps, *logs))


@pytest.mark.parametrize("router, capacity, pooled_tiers, policy, preempt, max_steps", [
    ("cache-aware", (20, 10, 0), 0, "fcfs", True, 0),
    ("round-robin", (20, 10, 30), 1, "static", False, 50),
    ("pooled", (20, 10, 0), 0, "priority", True, 0),
    ("least-kv", (0, 0, 0), 0, "fcfs", False, 10),
])
def test_the_replicas_allocate_what_replica_bytes_says(monkeypatch, router, capacity, pooled_tiers, policy,
                                                       preempt, max_steps):
    rng = np.random.default_rng(5)
    n, block_tokens = 300, 4
    _, prompt, ptr, ids = random_blocks(rng, n, block_tokens)
    arrival = np.sort(rng.uniform(0, 3.0, n))
    output = rng.integers(1, 30, n)
    stated, allocated = [], []
    real_bytes, real_loop = fleet_batching.replica_bytes, step_loop.simulate
    monkeypatch.setattr(kv_tiers._local, "state", None, raising=False)
    monkeypatch.setattr(fleet_batching, "replica_bytes", lambda *a, **kw: stated.append(real_bytes(*a, **kw))
                        or stated[-1])
    monkeypatch.setattr(step_loop, "simulate", lambda *a: allocated.append(_kernel_layout(a)) or real_loop(*a))
    fleet_batching.simulate_fleet_batching(
        arrival, prompt, prompt, output, n_instances=3, router=router, router_uniform=rng.uniform(size=n),
        block_ptr=ptr, block_ids=ids, capacity_blocks=capacity, pooled_tiers=pooled_tiers,
        block_tokens=block_tokens, token_budget=256, max_seqs=8, policy=policy, preempt=preempt,
        max_steps=max_steps, **TABLE)
    assert [s.total for s in stated] == allocated and allocated[0] > 0


def _dense_node_params(overrides):
    scn = load_scenario(DENSE_NODE, overrides=["deployment.fleet=fixed", *overrides])
    return resolve(scn, {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 4).items()}), scn


@pytest.mark.parametrize("routing", ["cache-aware", "random", "pooled"])
def test_the_check_before_the_cache_stage_bounds_what_the_run_allocates(monkeypatch, routing):
    """The sample's check (the replicas' admission caps and passes bounded before the step model knows them) is at
    least what the replicas' own check then counts, and the cache stage's estimate is exact."""
    import mcsim

    checked, ran = [], []
    real_check, real_bytes = fleet_memory.check_sample, fleet_batching.replica_bytes

    def check(p, cache_in, requests):
        checked.append((fleet_memory.cache_stage_bytes(p, cache_in, requests),
                        fleet_memory.replica_pools(p, cache_in, requests)))
        return real_check(p, cache_in, requests)

    monkeypatch.setattr(fleet_memory, "check_sample", check)
    monkeypatch.setattr(fleet_batching, "replica_bytes", lambda *a, **kw: ran.append(real_bytes(*a, **kw)) or ran[-1])
    mcsim.run(DENSE_NODE, samples=1, requests=600, workers=1,
              overrides=["deployment.fleet=fixed", "deployment.instances=3", "deployment.disaggregated=false",
                         f"deployment.routing={routing}", "deployment.fleet_simulation=replicas"])
    (cache, (before,)), = checked[-1:]
    assert ran and before.total >= ran[-1].total > 0
    assert cache.instances == 3 and cache.key == "deployment.instances"


def test_every_routing_and_mode_is_refused_in_one_line_before_allocating(monkeypatch):
    """With little memory available, every routing of both modes is refused, exit 2, in one line naming the
    instances, the routing and the estimate against what is available, before the cache stage or the step loop
    runs. (Pooled routing in the representative mode replays one cache and simulates one instance: nothing grows
    with the instances there.)"""
    monkeypatch.setattr(fleet_memory, "available_bytes", lambda: 3 << 20)

    def fail(*args, **kwargs):
        raise AssertionError("allocated before the refusal")

    monkeypatch.setattr(kvcache, "cache_hits", fail)
    monkeypatch.setattr(step_loop, "simulate", fail)
    cases = [("representative", r) for r in REPRESENTATIVE_ROUTERS if r != "pooled"]
    cases += [("replicas", r) for r in ROUTERS]
    for mode, routing in cases:
        result = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "300", "--set", "deployment.fleet=fixed",
                        "--set", "deployment.instances=100000", "--set", f"deployment.routing={routing}", "--set",
                        f"deployment.fleet_simulation={mode}", "--set", "deployment.disaggregated=false")
        line = result.output.strip()
        assert result.exit_code == 2 and "\n" not in line, (mode, routing, result.output)
        assert re.fullmatch(rf"error: deployment\.instances = 100,000 with deployment\.routing = '{routing}' "
                            rf"\(fleet_simulation = '{mode}'\): the .+ would need about [\d.]+ [KMG]iB \([\d.]+ "
                            r"[KMG]?i?B per instance: .+\), more than the (3\.0 MiB of memory available|.+ may take"
                            r".*|.+ rows the kernel can index .+); use fewer instances or requests.*", line), line


def test_the_disaggregated_prefill_pool_is_named_by_its_key(monkeypatch):
    monkeypatch.setattr(fleet_memory, "available_bytes", lambda: 1 << 20)
    p, scn = _dense_node_params(["deployment.disaggregated=true", "deployment.prefill_instances=50000",
                                 "deployment.routing=cache-aware"])
    req = workload.generate(p, scn.classes, 300, np.random.default_rng(1), 20000)
    cache_in = kvcache.Inputs.from_params(p, req.block_tokens, 1e5)
    with pytest.raises(RunLimitError, match=r"^deployment.prefill_instances = 50,000 with deployment.routing = "
                       r"'cache-aware' \(fleet_simulation = 'representative'\): the cache stage's replay would need "
                       r"about [\d.]+ [KMG]iB \([\d.]+ [KMG]iB per instance: a row of 16 B for each of the sample's "
                       r"[\d,]+ distinct blocks"):
        fleet_memory.check_sample(p, cache_in, req)


def test_available_memory_respects_an_address_space_limit(monkeypatch):
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda what: (fleet_memory.psutil.Process().memory_info().vms
                                                              + (5 << 20), resource.RLIM_INFINITY))
    assert 0 < fleet_memory.available_bytes() <= 5 << 20
