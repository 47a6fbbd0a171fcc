"""The README's examples, run as written: their commands work and print the figures the README quotes.

The README walks a study end to end (search, capacity, report), runs a node over a day's rate profile, prices a KV
tier and finds a deployment's capacity, quoting what each command printed. This runs those commands, with their
outputs in a temporary folder, and checks each quoted figure against what they print now, so that the README and
the program cannot drift apart. (Speed figures come from the benchmarks, which say so where they are quoted.)
"""

from __future__ import annotations

import re
import shlex

import numpy as np
import pytest
from helpers import ROOT, invoke

README = ROOT / "README.md"


def study_commands() -> list[list[str]]:
    """The ``mcsim`` commands of the README's "A capacity study, end to end" code block, as argument lists."""
    text = README.read_text()
    section = text[text.index("## A capacity study, end to end"):]
    block = section[section.index("```bash") + len("```bash"):section.index("```", section.index("```bash") + 7)]
    lines = block.replace("\\\n", " ").strip().splitlines()
    return [shlex.split(line)[1:] for line in lines if line.startswith("mcsim ")]


def section_text() -> str:
    text = README.read_text()
    start = text.index("## A capacity study, end to end")
    return " ".join(text[start:text.index("\n## ", start + 10)].split())


@pytest.mark.slow
def test_the_readme_capacity_study_runs_as_written_and_prints_what_it_quotes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the commands' outputs/ folder
    commands = study_commands()
    assert [c[0] for c in commands] == ["search", "capacity", "report", "report"]
    scenario = str(ROOT / "scenarios" / "dense-node.toml")
    printed = {}
    for args in commands:
        args = [scenario if a == "scenarios/dense-node.toml" else a for a in args]
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        printed[args[0]] = printed.get(args[0], "") + " ".join(result.output.split())
    quoted = section_text()
    search, capacity = printed["search"], printed["capacity"]
    # the search: the optimum and each candidate's median objective, as the README quotes them
    figures = re.search(r"robust optimum at ([\d.]+) USD/Mtok median, ahead of H200 TP4 \(([\d.]+)\), H100 TP8 "
                        r"\(([\d.]+)\) and H200 TP8 \(([\d.]+)\); (\d+) sample runs of the (\d+)", quoted).groups()
    assert ("robust optimum: hardware.preset=h100, deployment.tp=4 (cost_usd_per_mtok at quantile 0.5: "
            f"{figures[0]} USD/Mtok)") in search
    for candidate, value in zip(("h200 tp=4", "h100 tp=8", "h200 tp=8"), figures[1:4]):
        assert re.search(rf"{candidate} \d+ - 100 % {value} ", search), (candidate, value)
    assert f"{figures[4]} sample runs of the {figures[5]} an exhaustive sweep needs" in search
    assert "NOT AT STEADY STATE" not in search
    # the capacity: its band, the fleet it held and the cost there
    band = re.search(r"capacity_rps requests/s ([\d.]+) \[([\d.]+), ([\d.]+)\]", capacity).groups()
    assert f"{band[0]} requests/s median [{band[1]}, {band[2]}]" in quoted
    instances, low, high = re.search(r"([\d-]+) decode instance\(s\)", capacity).group(1), *re.search(
        r"gpus at capacity GPUs [\d.]+ \[([\d.]+), ([\d.]+)\]", capacity).groups()
    assert f"({instances} instances, {float(low):.0f}-{float(high):.0f} GPUs)" in quoted
    cost = re.search(r"cost_usd_per_mtok at capacity USD/Mtok ([\d.]+)", capacity).group(1)
    assert f"{float(cost):.2f} USD/Mtok there" in quoted
    assert (tmp_path / "outputs" / "study-capacity-report" / "capacity.png").is_file()
    assert (tmp_path / "outputs" / "study-search-report" / "summary.md").is_file()


@pytest.mark.slow
def test_the_readme_rate_profile_example_prints_what_it_quotes(tmp_path):
    text = " ".join(README.read_text().split())
    start = text.index("`mcsim run scenarios/dense-node.toml --set deployment.fleet=slo --set 'workload.rate_profile")
    command = text[start + 1:text.index("`", start + 1)]
    args = [str(ROOT / "scenarios" / "dense-node.toml") if a == "scenarios/dense-node.toml" else a
            for a in shlex.split(command)[1:]]
    result = invoke(*args, "-o", tmp_path / "day.nc", "--no-progress")
    assert result.exit_code == 0, result.output
    printed = " ".join(result.output.split())
    # the medians over samples of the night's and the day's cost per Mtok, as the summary prints them (3 digits)
    import xarray as xr

    with xr.open_dataset(tmp_path / "day.nc") as ds:
        night, day = ("%.3g" % v for v in ds.cost_usd_per_mtok.median("sample").values.ravel())
    quoted = re.search(r"\(([\d.]+) against ([\d.]+) USD/Mtok, medians over samples", text).groups()
    assert (night, day) == quoted and "10,800 " in printed and "54,000 " in printed
    assert "STEADY STATE NOT JUDGED: 8 of 8 sample runs" in printed and "NOT AT STEADY STATE" not in printed


@pytest.mark.slow
def test_the_readme_kv_tier_money_is_what_the_factory_prints(tmp_path):
    text = " ".join(README.read_text().split())
    start = text.index("On the factory (`mcsim run")
    command = text[start + len("On the factory (`"):text.index("`", start + len("On the factory (`"))]
    args = [str(ROOT / "scenarios" / "factory.toml") if a == "scenarios/factory.toml" else a
            for a in shlex.split(command)[1:]]
    assert invoke(*args, "-o", tmp_path / "f.nc", "--no-progress").exit_code == 0
    import xarray as xr

    with xr.open_dataset(tmp_path / "f.nc") as ds:
        dram = ds.sel(tier="dram")
        gb = sorted(int(round(v)) for v in dram.kv_tier_gb.values.ravel())
        order = np.argsort(dram.kv_tier_gb.values.ravel())
        cost = [int(round(v)) for v in dram.kv_tier_cost_usd_per_day.values.ravel()[order]]
        saved = [int(round(v)) for v in dram.kv_tier_recompute_saved_usd_per_day.values.ravel()[order]]
    quoted = text[start:start + 400]
    assert f"{gb[0]:,} and {gb[1]:,} GB" in quoted and f"cost {cost[0]} and {cost[1]} USD a day" in quoted
    assert f"saved {saved[0]:,} and {saved[1]:,} USD of prefill" in quoted


@pytest.mark.slow
def test_the_readme_capacity_figures_are_what_the_commands_print(tmp_path):
    """The Capacity section: `mcsim capacity scenarios/dense-node.toml` prints the band the README quotes, and the
    fixed-fleet sweep it quotes meets the SLOs in the quoted number of samples at each rate (the test a capacity
    bisection puts each rate to: feasible, not saturated, TTFT and TPOT at the SLO quantile within their targets)."""
    import xarray as xr

    from mcsim.scenario import load_scenario

    text = " ".join(README.read_text().split())
    section = text[text.index("## Capacity: the highest rate within the SLOs"):text.index("## A capacity study")]
    scenario = str(ROOT / "scenarios" / "dense-node.toml")
    result = invoke("capacity", scenario, "-o", tmp_path / "c.nc", "--no-progress")
    assert result.exit_code == 0, result.output
    band = re.search(r"capacity_rps requests/s ([\d.]+ \[[\d.]+, [\d.]+\])", " ".join(result.output.split())).group(1)
    assert f"For `dense-node.toml` it prints {band} requests/s" in section

    command = re.search(r"`(mcsim run scenarios/dense-node.toml --set deployment.fleet=fixed [^`]*)`", section).group(1)
    args = [scenario if a == "scenarios/dense-node.toml" else a for a in shlex.split(command)[1:]]
    assert invoke(*args, "-o", tmp_path / "f.nc", "--no-progress").exit_code == 0
    p = load_scenario(scenario)
    ttft, tpot = float(p["deployment.ttft_target_s"]), float(p["deployment.tpot_target_s"])
    with xr.open_dataset(tmp_path / "f.nc") as ds:
        met = ((ds.feasible == 1) & (ds.saturated == 0) & (ds.tpot_at_slo_quantile_s <= tpot)
               & ((ds.ttft_at_slo_quantile_s <= ttft) if ttft > 0 else True))
        counts = [int(c) for c in met.sum("sample").values]
        samples = ds.sizes["sample"]
    quoted = re.search(r"meets the SLOs in ([\d, and]+) of the (\d+) samples", section).groups()
    assert [int(c) for c in re.findall(r"\d+", quoted[0])] == counts and int(quoted[1]) == samples


@pytest.mark.slow
def test_the_readme_hardware_figures_are_what_the_sweep_and_the_calibrations_hold(tmp_path):
    """The decode capacities the README quotes for a hardware sweep of dense-model.toml are what that sweep prints
    (medians over samples), and the held-out errors it quotes for the bundled measured GEMM surfaces are those the
    calibration files recorded when mcsim calibrate wrote them."""
    import tomllib

    import xarray as xr

    text = " ".join(README.read_text().split())
    command = re.search(r"`(mcsim sweep scenarios/dense-model.toml --grid hardware.preset=a100,h100,h200,b200[^`]*)`",
                        text).group(1)
    args = [str(ROOT / "scenarios" / "dense-model.toml") if a == "scenarios/dense-model.toml" else a
            for a in shlex.split(command)[1:]]
    assert invoke(*args, "-o", tmp_path / "hw.nc", "--no-progress").exit_code == 0
    with xr.open_dataset(tmp_path / "hw.nc") as ds:
        got = [f"{v:,.0f}" for v in ds.decode_capacity_tok_s_per_gpu.median("sample").values.ravel()]
    quoted = re.search(r"\(`decode_capacity_tok_s_per_gpu`\) at ([\d,]+), ([\d,]+), ([\d,]+) and ([\d,]+) tok/s",
                       text).groups()
    assert list(quoted) == got
    cv = {}
    names = ("h100-bf16", "h200-bf16", "b200-bf16", "h100-fp8", "h200-fp8", "b200-fp8")
    for name in names:
        table = tomllib.loads((ROOT / "mcsim" / "data" / "calibrations" / f"{name}.toml").read_text())
        cv[name] = 100 * table["classes"]["gemm"]["cv_mape"]
    low, high, fp8_b200 = (float(x) for x in re.search(
        r"`h100-bf16.toml` to `b200-fp8.toml`: ([\d.]+)-([\d.]+) % held out, B200's FP8 ([\d.]+) %", text).groups())
    assert f"{min(cv[n] for n in names[:-1]):.1f}" == f"{low:.1f}"
    assert f"{max(cv[n] for n in names[:-1]):.1f}" == f"{high:.1f}"
    assert f"{cv['b200-fp8']:.1f}" == f"{fp8_b200:.1f}"
