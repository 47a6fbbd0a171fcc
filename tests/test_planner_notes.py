"""What a planner reads beside the numbers: which accelerators' figures no measurement supports, and which search
candidates or capacity runs have not settled."""

from __future__ import annotations

import xarray as xr
from helpers import DENSE_NODE, invoke

ROOFLINE = ["--set", 'performance.fidelity="roofline"']


def test_an_unmeasured_gpu_is_named_in_the_result_and_the_summary(tmp_path):
    out = tmp_path / "x.nc"
    result = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "300", "--no-progress", *ROOFLINE,
                    "--grid", "hardware.preset=h100,h200,mi300x", "-o", out)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "UNMEASURED: mi300x: no measured kernels" in text and "h100," not in text.split("UNMEASURED")[1][:30]
    report = invoke("report", out, "-o", tmp_path / "rep")
    assert report.exit_code == 0, report.output
    summary = (tmp_path / "rep" / "summary.md").read_text()
    assert "## Unmeasured accelerators" in summary and "mi300x: no measured kernels" in summary
    with xr.open_dataset(out) as ds:
        assert ds.attrs["kernel_data_unmeasured"] == "mi300x"
        facts = ds.attrs["kernel_data"]
        assert "h100: GEMMs and attention kernels measured under vLLM 0.24.0" in facts
        assert "h200: GEMMs and attention kernels measured under vLLM 0.24.0 (the bundled h200-bf16.toml)" in facts
        h200 = facts.split("h200:")[1].split("mi300x:")[0]
        assert "routed experts as vLLM 0.24.0's fused MoE kernel (BF16 and FP8), measured" in h200
        assert "MLA attention from DeepSeek-V3's attention modules measured on H200" in h200
        assert "DeepEP all-to-all from dispatches and combines measured on H100 under SGLang 0.5.6.post2" in h200
    measured = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "300", "--no-progress", *ROOFLINE, "-o",
                      tmp_path / "y.nc")
    assert measured.exit_code == 0 and "UNMEASURED" not in measured.output
    with xr.open_dataset(tmp_path / "y.nc") as ds:
        assert ds.attrs["kernel_data_unmeasured"] == ""
        assert "performance.stack" not in ds.attrs["kernel_data"]  # vLLM's stack, vLLM's kernels: nothing to say
    # another stack is priced with vLLM's kernel tables, and the result says so (a run, and a grid over stacks)
    for args, out in ((("--set", 'performance.stack="sglang"'), "z.nc"),
                      (("--grid", "performance.stack=vllm,trtllm"), "g.nc")):
        other = invoke("sweep" if args[0] == "--grid" else "run", DENSE_NODE, "--samples", "1", "--requests", "300",
                       "--no-progress", *ROOFLINE, *args, "-o", tmp_path / out)
        assert other.exit_code == 0, other.output
        with xr.open_dataset(tmp_path / out) as ds:
            stack = "sglang" if out == "z.nc" else "trtllm"
            assert (f"performance.stack {stack}: the measured kernels are vLLM 0.24.0's (DeepEP's, SGLang's) "
                    "whatever the stack") in ds.attrs["kernel_data"]


def test_search_names_its_unsettled_candidates_and_an_unmeasured_optimum(tmp_path):
    result = invoke("search", DENSE_NODE, "--space", "hardware.preset=h100,mi300x", "--samples", "2", "--requests",
                    "800", *ROOFLINE, "--no-progress", "-o", tmp_path / "s.nc")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    with xr.open_dataset(tmp_path / "s.nc") as ds:
        unsettled = int((ds.steady_state.values == 0).sum())
        best = int(ds.attrs["robust_optimum_candidate"])
        best_preset = str(ds[ds.attrs["search_axes"].split()[0]].values[best])
    assert unsettled > 0  # 800 requests do not fill dense-node's caches
    assert f"NOT AT STEADY STATE: {unsettled} of 4 sample runs" in text and "still depend on mc.requests" in text
    assert ("CAVEAT: the optimum runs on mi300x" in text) == (best_preset == "mi300x")
    assert "UNMEASURED: mi300x" in text
