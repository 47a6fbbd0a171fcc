"""mcsim list: catalog presets with their published figures, every scenario key with its facts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mcsim.cli import main
from mcsim.scenario import load_scenario
from mcsim.scenario.schema import UNMEASURED_STAND_INS


def invoke(*args, columns=80):
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, [str(a) for a in args])


def row_of(text: str, first: str) -> list[str]:
    """The cells of the table row that starts with ``first`` (cells are two or more spaces apart)."""
    for line in text.splitlines():
        if line.split("  ")[0] == first:
            return [c.strip() for c in line.split("  ") if c.strip()]
    raise AssertionError(f"no row {first!r} in\n{text}")


def fits(text: str, columns: int = 80) -> bool:
    return max(len(line) for line in text.splitlines()) <= columns


def test_models_show_their_published_figures():
    result = invoke("list", "models")
    assert result.exit_code == 0, result.output
    assert fits(result.stdout)
    # DeepSeek-V3 technical report: 671B total, 37B activated, 61 layers, MLA, 256 routed + 1 shared, top-8, 128K
    assert row_of(result.stdout, "deepseek-v3") == ["deepseek-v3", "671", "37", "61", "MLA", "256+1, top 8", "128k"]
    # Meta's Llama 3 70B: 80 layers, GQA, dense, 8K context
    assert row_of(result.stdout, "llama-3-70b")[3:] == ["80", "GQA", "dense", "8k"]


def test_hardware_shows_datasheet_figures():
    result = invoke("list", "hardware")
    assert result.exit_code == 0, result.output
    assert fits(result.stdout)
    # NVIDIA H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s, 989 dense BF16 TFLOPS, 1,979 dense FP8, 700 W
    assert row_of(result.stdout, "h100")[:6] == ["h100", "80", "3.35", "989", "1,979", "700"]
    # A100: 2,039 GB/s, 312 BF16 TFLOPS, no FP8, 400 W
    assert row_of(result.stdout, "a100")[:6] == ["a100", "80", "2.039", "312", "-", "400"]
    assert "estimates" in result.stdout


def test_presets_list_models_hardware_and_the_bundled_scenarios():
    result = invoke("list", "presets")
    assert result.exit_code == 0, result.output
    assert fits(result.stdout)
    for name in ("deepseek-v3", "mixtral-8x7b", "h800", "mi300x", "factory", "sweep", "dense-node"):
        assert name in result.stdout
    data = json.loads(invoke("list", "presets", "--json").stdout)
    assert set(data) == {"models", "hardware", "scenarios"}
    h800 = next(h for h in data["hardware"] if h["preset"] == "h800")
    assert h800["hbm_gb"] == 80.0 and "source" in h800


def test_keys_of_a_section_with_type_default_range_distribution_and_fidelity():
    result = invoke("list", "keys", "cache")
    assert result.exit_code == 0, result.output
    assert fits(result.stdout)
    wide = invoke("list", "keys", "cache", columns=120).stdout  # one line a row, to read its cells
    assert row_of(wide, "block_tokens") == ["block_tokens", "integer", "64", "[1, 1000000]", "yes", "both"]
    assert row_of(wide, "enabled") == ["enabled", "bool", "true", "true, false", "no", "both"]
    assert row_of(wide, "dram_usd_per_gb_month")[:4] == ["dram_usd_per_gb_month", "number", "0.1", "[0, 10000]"]
    performance = invoke("list", "keys", "performance").stdout
    assert row_of(performance, "gemm_floor_s")[-1] == "roofline"
    efficiency = invoke("list", "keys", "efficiency").stdout
    assert row_of(efficiency, "base_decode_tok_s_per_gpu")[-1] == "factor"
    mc = invoke("list", "keys", "mc").stdout
    assert row_of(mc, "samples")[4] == "no"  # shapes the run: never uncertain


def test_every_key_fits_the_terminal_and_describe_adds_the_meaning():
    everything = invoke("list", "keys")
    assert everything.exit_code == 0 and fits(everything.stdout)
    assert "[economics]" in everything.stdout and "[deployment]" in everything.stdout
    described = invoke("list", "keys", "speculative", "--describe", columns=60)
    assert fits(described.stdout, 60)
    assert "Draft tokens k per verification pass." in " ".join(described.stdout.split())


def test_keys_as_json_are_what_the_loader_accepts(tmp_path):
    rows = json.loads(invoke("list", "keys", "--json").stdout)
    by_key = {r["key"]: r for r in rows}
    assert by_key["economics.target_utilization"]["minimum"] == 0
    assert by_key["economics.target_utilization"]["minimum_exclusive"] is True
    assert by_key["workload.classes.<name>.acceptance"]["distribution"] == "per-request"
    assert by_key["hardware.hbm_gb"]["type"] == "number"
    # a key read by the roofline only is not drawn under the factor fidelity, and the other way round
    for key, row in by_key.items():
        if row["fidelity"] == "both" or row["distribution"] != "uncertain":
            continue
        section, name = key.split(".")
        low = row["minimum"] if row["minimum"] is not None else 0
        high = row["maximum"] if row["maximum"] is not None else low + 2
        other = "factor" if row["fidelity"] == "roofline" else "roofline"
        text = (f'[{section}]\n{name} = {{ dist = "uniform", low = {low + (high - low) / 4}, high = '
                f'{low + (high - low) / 2} }}\n')
        # a stand-in for unmeasured GEMMs is read only on an accelerator without them (and not on the default H100)
        stand_in = key in UNMEASURED_STAND_INS
        unmeasured = '[hardware]\npreset = "mi300x"\n' if stand_in else ""
        for fidelity, drawn in ((row["fidelity"], True), (other, False)):
            scn = load_scenario(tmp_path / "k.toml", text=text + unmeasured,
                                overrides=[f'performance.fidelity="{fidelity}"'])
            assert (key in scn.uncertain()) is drawn, (key, fidelity)
        if stand_in:
            scn = load_scenario(tmp_path / "k.toml", text=text, overrides=['performance.fidelity="roofline"'])
            assert key not in scn.uncertain() and key in scn.uncertain(include_unused=True), key


@pytest.mark.parametrize("args, words", [
    (("list", "keys", "cachee"), ["cachee", "did you mean 'cache'", "economics"]),
    (("list", "keys", "sweep"), ["sweep", "the sections with keys are"]),
    (("list", "models", "cache"), ["only 'keys' takes a SECTION"]),
])
def test_bad_list_requests_are_one_line_and_exit_2(args, words):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0]
