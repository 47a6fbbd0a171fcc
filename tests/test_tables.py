"""Tables that fit the terminal: no line longer than the width, no cell lost, labels repeated in every block."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from mcsim.cli import main
from mcsim.tables import GAP, MIN_WIDTH, table

FACTORY = Path(__file__).resolve().parents[1] / "scenarios" / "factory.toml"

WORD = st.text(alphabet="abcxyz0123456789.,[]", min_size=1, max_size=12)
CELL = st.lists(WORD, min_size=0, max_size=4).map(" ".join)


@st.composite
def tables(draw):
    columns = draw(st.integers(1, 9))
    rows = draw(st.lists(st.lists(CELL, min_size=columns, max_size=columns), min_size=1, max_size=6))
    return rows


def characters(lines) -> Counter:
    """Every printed character but spaces and the dashed line under the header (cells hold no dashes)."""
    return Counter(c for line in lines if set(line) - {"-", " "} for c in line if c != " ")


@settings(max_examples=60, deadline=None)
@given(rows=tables(), width=st.integers(MIN_WIDTH, 140), keep=st.integers(0, 3), wrap=st.booleans())
def test_no_line_exceeds_the_width_and_no_cell_is_cut(rows, width, keep, wrap):
    lines = table(rows, width=width, keep=keep, wrap=wrap)
    assert all(len(line) <= width for line in lines), (width, lines)
    given_chars = Counter(c for row in rows for cell in row for c in cell if c != " ")
    shown = characters(lines)
    n = len(rows[0])
    # a wrapped table is split into blocks after all when its columns cannot fit even one character wide
    wraps_whole = wrap and n + GAP * (n - 1) <= width
    if keep == 0 or wraps_whole or n == 1:  # nothing is repeated: exactly the cells' characters
        assert shown == given_chars, lines
    else:  # blocks repeat the label columns
        assert not given_chars - shown, lines


def test_a_table_that_fits_is_printed_as_is():
    rows = [["metric", "units", "value"], ["gpus", "GPUs", "832 [803, 861]"]]
    assert table(rows, width=80) == ["metric  units  value",
                                     "------  -----  --------------",
                                     "gpus    GPUs   832 [803, 861]"]


def test_a_wide_table_is_split_into_blocks_that_repeat_the_labels():
    rows = [["metric", "a" * 30, "b" * 30, "c" * 30], ["x", "1", "2", "3"]]
    lines = table(rows, width=80, keep=1)
    assert lines == ["metric  " + "a" * 30 + "  " + "b" * 30, "------  " + "-" * 30 + "  " + "-" * 30,
                     "x       1" + " " * 31 + "2", "",
                     "metric  " + "c" * 30, "------  " + "-" * 30, "x       3"]


def test_wrap_keeps_rows_whole():
    rows = [["key", "allowed"], ["routing", "one of 'random', 'round-robin', 'prefix-affinity', 'cache-aware'"]]
    lines = table(rows, width=40, wrap=True)
    assert lines[0].split() == ["key", "allowed"] and len(lines) > 3
    assert all(len(line) <= 40 for line in lines)
    assert lines[2].startswith("routing  one of")
    assert all(line.startswith(" " * 9) for line in lines[3:])  # the continuation stays in its column


@pytest.mark.parametrize("columns", [80, 100])
def test_the_tables_of_a_small_sweep_and_a_compare_fit_the_terminal(tmp_path, monkeypatch, columns):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"COLUMNS": str(columns)})
    small = ["--samples", "2", "--requests", "300", "--no-progress"]
    sweep = runner.invoke(main, ["sweep", str(FACTORY), *small, "--grid", "speculative.draft_tokens=0,1",
                                 "--grid", "hardware.preset=h800,h200,b200", "-o", "s.nc"])
    assert sweep.exit_code == 0, sweep.output
    compare = runner.invoke(main, ["compare", str(FACTORY), *small, "-o", "c.nc"])
    assert compare.exit_code == 0, compare.output
    for result in (sweep, compare):
        lines = result.stdout.splitlines()
        assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    # every grid point's values are printed (the sweep has six, in one layout or the other)
    assert "per grid point" in sweep.stdout
    assert all(name in sweep.stdout for name in ("h800", "h200", "b200", "gross margin", "USD/Mtok"))
    assert all(name in compare.stdout for name in ("baseline", "factory", "factory vs baseline", "gross_margin"))
