"""The measured GEMM surface: its rule on hand-made points, its file round trip, and refusals."""

import math

import numpy as np
import pytest

from helpers import invoke
from mcsim.calibration.files import CalibrationError, dumps, load, new_calibration
from mcsim.perf import gemm_surface
from mcsim.perf.gemm_surface import GemmSurface

# two measured shapes one octave apart in N, each at 16 and 64 rows
N = [1024.0, 1024.0, 2048.0, 2048.0]
K = [4096.0] * 4
ROWS = [16.0, 64.0, 16.0, 64.0]
RATIO = [0.2, -0.1, -0.3, 0.1]


def test_one_gemm_at_a_time_is_numpys_interpolation_to_the_bit():
    """The scalar path (what the step model calls per GEMM) against np.interp on the same blended curve, at random
    shapes near and far from the bundled H100 surface's, rows inside, beyond and at its knots."""
    surface = gemm_surface.for_hardware("h100")
    rng = np.random.default_rng(11)
    for _ in range(3000):
        if rng.random() < 0.3:
            i = rng.integers(len(surface.n))
            n, k = float(surface.n[i]), float(surface.k[i])
        else:
            n, k = float(2 ** rng.uniform(7, 15)), float(2 ** rng.uniform(7, 15))
        grid, curve = surface._blend(n, k)
        rows = float(2 ** rng.choice(grid)) if rng.random() < 0.2 else float(2 ** rng.uniform(-1, 16))
        expected = float(np.interp(np.log2(np.maximum(rows, 1.0)), grid, curve))
        assert surface.log_factor(rows, n, k) == expected, (rows, n, k)


def test_a_measured_shape_takes_its_own_curve_linear_in_log_rows():
    surface = GemmSurface.from_points(N, K, ROWS, RATIO)
    assert surface.factor(16.0, 1024, 4096) == pytest.approx(math.exp(0.2), rel=1e-12)
    assert surface.factor(64.0, 2048, 4096) == pytest.approx(math.exp(0.1), rel=1e-12)
    # 32 rows is half way between 16 and 64 in log2: the mean of the two log ratios
    assert surface.factor(32.0, 1024, 4096) == pytest.approx(math.exp(0.05), rel=1e-12)
    # held at the ends
    assert surface.factor(1.0, 1024, 4096) == pytest.approx(math.exp(0.2), rel=1e-12)
    assert surface.factor(4096.0, 1024, 4096) == pytest.approx(math.exp(-0.1), rel=1e-12)
    rows = np.array([16.0, 32.0, 64.0])
    assert np.allclose(surface.factor(rows, 1024, 4096), np.exp([0.2, 0.05, -0.1]), rtol=1e-12)


def test_an_unmeasured_shape_blends_its_neighbours_and_far_ones_keep_the_roofline():
    surface = GemmSurface.from_points(N, K, ROWS, RATIO)
    # N = 1448 is half an octave from both: equal weights w = exp(-0.25 / (2 sigma^2))
    n_mid = 1024 * 2 ** 0.5
    w = math.exp(-0.25 / (2 * gemm_surface.SIGMA ** 2))
    expected = w * (0.2 - 0.3) / (gemm_surface.W0 + 2 * w)
    assert surface.log_factor(16.0, n_mid, 4096) == pytest.approx(expected, rel=1e-9)
    # six octaves away in K: no measured shape weighs anything
    assert surface.factor(16.0, 1024, 4096 * 64) == 1.0
    # repeated measurements of one point are averaged in log
    twice = GemmSurface.from_points([512.0, 512.0], [512.0, 512.0], [8.0, 8.0], [0.1, 0.3])
    assert twice.log_factor(8.0, 512, 512) == pytest.approx(0.2, rel=1e-12)


def test_bad_points_are_refused():
    with pytest.raises(ValueError, match="same number"):
        GemmSurface.from_points([1.0], [1.0, 2.0], [1.0], [0.0])
    with pytest.raises(ValueError, match="positive"):
        GemmSurface.from_points([1.0], [1.0], [0.0], [0.0])
    with pytest.raises(ValueError, match="finite"):
        GemmSurface.from_points([1.0], [1.0], [1.0], [math.inf])


def _calibration(surface_table):
    regime = {"hardware": "h100", "dtype": "bf16", "fidelity": "roofline"}
    parameters = {"performance.gemm_floor_s": {"class": "gemm", "estimate": 6e-6, "low": 6e-6, "high": 6e-6,
                                               "replicates": [6e-6, 6e-6]}}
    return new_calibration(regime, parameters, {}, source="test", seed=0, surfaces={"gemm": surface_table})


def test_a_calibration_file_carries_its_surface(tmp_path):
    surface = GemmSurface.from_points(N, K, ROWS, RATIO)
    path = tmp_path / "cal.toml"
    path.write_text(dumps(_calibration(surface.points())))
    cal = load(path)
    assert cal.surfaces["gemm"]["n"] == N and cal.surfaces["gemm"]["log_ratio"] == RATIO
    assert cal.overrides()["performance.gemm_surface"] == str(path.resolve())
    read = gemm_surface.read(path)
    for n, k, rows, ratio in zip(N, K, ROWS, RATIO):
        assert read.log_factor(rows, n, k) == pytest.approx(ratio, abs=1e-6)


@pytest.mark.parametrize("table, message", [
    ({"n": [1.0], "k": [1.0], "rows": [1.0, 2.0], "log_ratio": [0.0]}, "surfaces.gemm.rows: has 2 values"),
    ({"n": [1.0], "k": [-1.0], "rows": [1.0], "log_ratio": [0.0]}, "surfaces.gemm.k: expected positive"),
    ({"n": [1.0], "k": [1.0], "rows": [1.0]}, "surfaces.gemm.log_ratio: expected a non-empty list"),
    ({"n": [1.0], "k": [1.0], "rows": [1.0], "log_ratio": [0.0], "m": [1.0]}, "surfaces.gemm.m: unknown key"),
])
def test_a_bad_surface_table_is_refused_naming_the_key(tmp_path, table, message):
    path = tmp_path / "cal.toml"
    path.write_text(dumps(_calibration(table)))
    with pytest.raises(CalibrationError, match=message.replace(".", r"\.")):
        load(path)


def test_a_surface_file_must_have_a_surface_and_the_scenarios_gpu(tmp_path):
    from tests.test_calibrate import DENSE

    bare = tmp_path / "bare.toml"
    bare.write_text(dumps(_calibration({"n": [1.0], "k": [1.0], "rows": [1.0], "log_ratio": [0.0]})).split(
        "[surfaces.gemm]")[0])
    result = invoke("steps", DENSE, "--set", f"performance.gemm_surface={bare}")
    assert result.exit_code == 2 and "no [surfaces.gemm] table" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    a100 = gemm_surface.bundled_path("a100")
    result = invoke("steps", DENSE, "--set", f"performance.gemm_surface={a100}")
    assert result.exit_code == 2 and "measured on 'a100'" in result.stderr


def test_the_plain_surface_reader_gives_what_the_toml_parser_gives(tmp_path):
    import tomllib

    from mcsim.perf.gemm_surface import _plain_surface, bundled_path

    for name in ("h100", "a100"):
        raw = bundled_path(name).read_bytes()
        assert _plain_surface(raw) == tomllib.loads(raw.decode())["surfaces"]["gemm"]
    # any other layout is left to the TOML parser: a comment, a multi-line list, a table after it
    raw = bundled_path("h100").read_bytes()
    for edit in (raw + b"# a note\n", raw.replace(b"log_ratio = [", b"log_ratio = [\n"), raw + b"[other]\nx = 1\n"):
        assert _plain_surface(edit) is None


def test_the_bundled_surfaces_sit_well_inside_the_bound_on_log_ratios():
    """calibration_file.MAX_LOG_RATIO (ln 100) refuses absurd surfaces; every measured correction is far inside it."""
    import tomllib

    from mcsim.perf.gemm_surface import bundled_path
    from mcsim.scenario.calibration_file import MAX_LOG_RATIO

    for name in ("h100", "a100"):
        ratios = np.abs(tomllib.loads(bundled_path(name).read_text())["surfaces"]["gemm"]["log_ratio"])
        assert 0.5 < ratios.max() <= 0.7 < MAX_LOG_RATIO, (name, ratios.max())
