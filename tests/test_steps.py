"""`mcsim steps` and `mcsim.step_time`: one step, op by op, against the roofline called directly."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mcsim
from mcsim.cli import main
from mcsim.perf import roofline
from mcsim.perf.capacity import memory_projection
from mcsim.perf.factor import _model, parallelism, precision
from mcsim.perf.roofline_model import _hardware, options
from mcsim.scenario import catalog, draw_uncertain, load_scenario, resolve

ROOT = Path(__file__).resolve().parents[1]
DENSE = ROOT / "scenarios" / "dense-node.toml"
FACTORY = ROOT / "scenarios" / "factory.toml"


def test_one_roofline_step_against_the_roofline():
    step = mcsim.step_time(DENSE, decode_seqs=1, context=2048, requests=800)
    scn = load_scenario(DENSE)
    draws = draw_uncertain(scn, [0], scn["mc.seed"], n_samples=scn["mc.samples"])  # sample 0 of a run
    p = resolve(scn, {k: float(v[0]) for k, v in draws.items()})
    k = p["speculative.draft_tokens"]
    kwargs = options(p)
    verify = roofline.step_cost(_model(p), _hardware(p), decode_seqs=1, decode_context=2048, verify_tokens=k + 1,
                                **kwargs)
    plain = roofline.step_cost(_model(p), _hardware(p), decode_seqs=1, decode_context=2048, **kwargs).t_step
    assert step["step_s"] == pytest.approx(verify.t_step + k * p["speculative.draft_cost"] * plain, rel=1e-12)
    assert sum(op["t_s"] for op in step["ops"].values()) == pytest.approx(step["step_s"], rel=1e-12)
    # at one sequence the all-reduce and the launch/step overheads are visible next to the weight reads
    for name in ("tp_allreduce", "overhead", "dense_ffn"):
        assert step["ops"][name]["t_s"] == pytest.approx(verify.breakdown[name]["t"], rel=1e-12)
        assert step["ops"][name]["t_s"] > 0
    assert step["ops"]["tp_allreduce"]["bound"] == "network" and step["ops"]["overhead"]["bound"] == "overhead"
    assert step["ops"]["dense_ffn"]["bound"] == "memory"  # one sequence: weight streaming
    # the kernel floors are visible: two GEMMs per layer at the H100's fitted 6.5 us each (without the measured
    # surface, which scales each GEMM's whole time, floor included, as the sample's gemm_error draw does)
    h100 = catalog.hardware_preset("h100")
    plain_step = mcsim.step_time(DENSE, decode_seqs=1, context=2048, requests=800,
                                 overrides=["performance.gemm_surface=none"])
    assert plain_step["ops"]["attention_proj"]["floor_s"] == pytest.approx(
        2 * 80 * h100["gemm_floor_us"] * 1e-6 * p["performance.gemm_error"])  # the sample's drawn model error
    assert step["ops"]["attention_proj"]["floor_s"] != plain_step["ops"]["attention_proj"]["floor_s"]
    mem = memory_projection(_model(p), _hardware(p), precision=precision(p), parallel=parallelism(p),
                            block_tokens=p["cache.block_tokens"], context=2048,
                            memory_fraction=p["deployment.memory_fraction"],
                            activation_gb=p["deployment.activation_gb_per_gpu"])
    assert step["memory"]["decode"]["weights_gb_per_gpu"] == pytest.approx(mem.weights_per_gpu / 1e9, rel=1e-12)


def test_a_large_batch_is_compute_bound():
    step = mcsim.step_time(DENSE, decode_seqs=2048, context=1024, requests=800)
    assert step["ops"]["dense_ffn"]["bound"] == "compute"


def test_factor_steps_name_their_parts():
    step = mcsim.step_time(FACTORY, decode_seqs=64, prefill_tokens=2048, requests=800,
                           overrides=["deployment.gpus_per_instance=32", "moe.nodes=4"])
    assert step["fidelity"] == "factor" and set(step["ops"]) == {"weights", "decode", "prefill"}
    assert all(op["bound"] == "factor" and np.isnan(op["flops"]) for op in step["ops"].values())
    assert set(step["memory"]) == {"decode", "prefill"}


def test_the_command():
    runner = CliRunner()
    result = runner.invoke(main, ["steps", str(DENSE), "--decode-seqs", "1", "--context", "2048"])
    assert result.exit_code == 0, result.output
    assert "tp_allreduce" in result.output and "overhead" in result.output and "modelled" in result.output
    as_json = runner.invoke(main, ["steps", str(DENSE), "--decode-seqs", "8", "--json"])
    assert json.loads(as_json.output)["decode_seqs"] == 8
    for args in (["--set", "deployment.tp=3"], ["--pool", "prefill"], ["--decode-seqs", "0"]):
        bad = runner.invoke(main, ["steps", str(DENSE), *args])
        assert bad.exit_code == 2 and "Traceback" not in bad.output, args


def test_the_serving_stack_sets_the_allreduce_and_the_host_overlap():
    base = ["deployment.disaggregated=false", "speculative.enabled=false"]

    def step(*changes):
        return mcsim.step_time(DENSE, decode_seqs=8, context=2048, requests=400, overrides=[*base, *changes])

    vllm, sglang, generic = step(), step("performance.stack=sglang"), step("performance.stack=generic")
    assert vllm["stack"] == "vllm" and vllm["ops"]["tp_allreduce"]["implementation"] == "custom one-shot"
    assert generic["ops"]["tp_allreduce"]["implementation"].startswith("nccl")
    # sglang's overlap scheduler hides the host's work per step: the whole difference is step_overhead_s
    scn = load_scenario(DENSE)
    assert vllm["ops"]["overhead"]["t_s"] - sglang["ops"]["overhead"]["t_s"] == pytest.approx(
        scn["performance.step_overhead_s"], rel=1e-9)
    assert sglang["ops"]["tp_allreduce"]["t_s"] == pytest.approx(vllm["ops"]["tp_allreduce"]["t_s"], rel=1e-12)
    # a scenario's own implementation wins over its stack's
    forced = step("performance.stack=generic", "performance.allreduce_impl=custom")
    assert forced["ops"]["tp_allreduce"]["implementation"] == "custom one-shot"
    ds = mcsim.run(DENSE, samples=1, requests=300, workers=1, overrides=["performance.stack=trtllm"])
    assert ds.attrs["serving_stack"] == "trtllm"


def test_an_instance_is_its_tp_x_pp_gpus_unless_told_otherwise(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[meta]\nname = "m"\n[model]\npreset = "llama-3.1-70b"\n[hardware]\npreset = "h100"\n'
                    '[deployment]\ntp = 4\npp = 2\nprefill_tp = 2\n[performance]\nfidelity = "roofline"\n')
    assert mcsim.step_time(path, requests=200)["gpus_per_instance"] == 8
    assert mcsim.step_time(path, requests=200, pool="prefill")["gpus_per_instance"] == 2
    wide = mcsim.step_time(path, requests=200, overrides=["deployment.gpus_per_instance=16"])
    assert wide["gpus_per_instance"] == 16  # the rest is attention data parallelism


def test_mcsim_steps_says_which_allreduce_ran_and_under_which_stack():
    from helpers import invoke

    result = invoke("steps", DENSE, "--decode-seqs", "8", "--set", "performance.stack=generic")
    assert result.exit_code == 0
    assert "generic stack" in result.output.replace("\n", " ")
    assert "tp_allreduce ran as: nccl" in result.output
    result = invoke("steps", DENSE, "--decode-seqs", "8")
    assert "vllm stack" in result.output.replace("\n", " ") and "tp_allreduce ran as: custom" in result.output


@pytest.mark.parametrize("args, message", [(("--decode-seqs", "nan"), "finite"), (("--context", "inf"), "finite"),
                                           (("--prefill-tokens", "1e400"), "finite"),
                                           (("--decode-seqs", "100000"), "sequences of this context fit")])
def test_mcsim_steps_refuses_nonsense_in_one_line(args, message):
    from helpers import invoke

    result = invoke("steps", DENSE, *args)
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
