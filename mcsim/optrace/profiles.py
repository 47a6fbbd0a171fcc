"""Hardware profiles for pricing an op trace, and micro-benchmarks of the machine mcsim runs on.

A :class:`Profile` is two numbers, a peak FLOP rate and a memory bandwidth, plus where they come from:

- ``"theoretical"``: a round-number device for reasoning (100 TFLOP/s, 512 GB/s);
- ``"datasheet"``: figures quoted publicly by vendors or spec databases (laptop and desktop GPUs
  below; every datacenter GPU of :func:`mcsim.scenario.catalog.hardware`, at its dense BF16 tensor peak);
- ``"measured"``: this machine, from :func:`measure_this_machine` (NumPy GEMM and array streaming).

:func:`price` turns one op's counted FLOPs and bytes into a roofline time on a profile:
``max(flops / peak_flops, bytes / bandwidth)``. That is a synthetic estimate, not a measurement: it
assumes the op reaches the profile's peaks and overlaps compute with memory traffic perfectly.

Examples
--------
>>> from mcsim.optrace.decoder import OpRecord
>>> gemv = OpRecord("q_proj", 0, "decode", "matmul", 2 * 4096 * 4096, 4 * 4096 * 4096, 4 * 4096, 0.0)
>>> price(gemv, THEORETICAL)["bound"]
'memory'
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
import time

import numpy as np

from mcsim.scenario import catalog

try:  # optional: names the BLAS's thread pools when it is installed
    import threadpoolctl
except ImportError:
    threadpoolctl = None

__all__ = [
    "HOST_PRESETS",
    "THEORETICAL",
    "Profile",
    "catalog_profiles",
    "datasheet_profiles",
    "default_profiles",
    "measure_this_machine",
    "price",
    "runtime_environment",
]

KINDS = ("theoretical", "datasheet", "measured")


@dataclasses.dataclass(frozen=True)
class Profile:
    """Roofline description of one device.

    Attributes
    ----------
    name : str
        Display name.
    peak_flops : float
        Peak floating-point rate, FLOP/s.
    bandwidth_bytes_s : float
        Main-memory bandwidth, bytes/s.
    kind : str
        ``"theoretical"``, ``"datasheet"`` or ``"measured"``.
    source : str
        Where the figures come from (citations, or how they were measured).
    peak_dtype : str
        The arithmetic the peak refers to (``"fp32"``, ``"bf16 tensor"``, ...).
    """

    name: str
    peak_flops: float
    bandwidth_bytes_s: float
    kind: str
    source: str
    peak_dtype: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not (self.peak_flops > 0 and self.bandwidth_bytes_s > 0):
            raise ValueError(f"profile {self.name!r}: peak_flops and bandwidth_bytes_s must be positive")

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which an op is compute-bound on this device."""
        return self.peak_flops / self.bandwidth_bytes_s


THEORETICAL = Profile(
    "theoretical 100 TOPS / 512 GB/s", 100e12, 512e9, "theoretical",
    "round-number reference device: 100 T operations/s, 512 GB/s", "any",
)

_APPLE_M1 = Profile(
    "Apple M1 laptop (8-core GPU)", 2.6e12, 68.25e9, "datasheet",
    "GPU FP32 peak ~2.6 TFLOPS (1024 ALUs x 2 x 1.278 GHz = 2.617 TFLOPS: "
    "https://askgeek.io/en/cpus/Apple/M1-8-core-GPU, https://nanoreview.info/en/gpu/apple-m1-gpu); "
    "unified LPDDR4X-4266 on a 128-bit bus = 4266e6 x 16 B = 68.25 GB/s (askgeek lists 66.67 GB/s)",
    "fp32",
)

_RTX_3060_TI = Profile(
    "NVIDIA GeForce RTX 3060 Ti", 16.2e12, 448e9, "datasheet",
    "FP32 16,197 GFLOPS (4,864 CUDA cores at 1,665 MHz boost), 8 GB GDDR6 14 Gbps on 256 bit = 448 GB/s: "
    "https://www.scan.co.uk/tekspek/gpu-graphics/nvidia-geforce-rtx-3060ti; "
    "https://wccftech.com/nvidia-geforce-rtx-3060-ti-specifications-leak-4864-cores-8-gb-gddr6-memory/",
    "fp32",
)

_RTX_2070_SUPER = Profile(
    "NVIDIA GeForce RTX 2070 Super", 9.1e12, 448e9, "datasheet",
    "FP32 9,062 GFLOPS (2,560 CUDA cores at 1,770 MHz boost), 8 GB GDDR6 14 Gbps on 256 bit = 448 GB/s: "
    "https://www.scan.co.uk/tekspek/gpu-graphics/nvidia-geforce-rtx-3060ti (comparison table)",
    "fp32",
)


#: Catalog presets that are not datacenter GPUs: the stand-in for the host, which a measured
#: "this machine" profile replaces.
HOST_PRESETS = ("cpu-host",)


def catalog_profiles(peak: str = "bf16") -> list[Profile]:
    """One datasheet profile per datacenter GPU of :func:`mcsim.scenario.catalog.hardware`.

    ``peak="bf16"`` takes the dense BF16 tensor peak (``bf16_tflops``); ``peak="fp32"`` the dense FP32
    peak (``fp32_tflops``), the like-for-like rate for a float32 trace. Bandwidth is ``hbm_tb_s``.
    """
    if peak not in ("bf16", "fp32"):
        raise ValueError(f"peak must be 'bf16' or 'fp32', got {peak!r}")
    field, label = ("bf16_tflops", "bf16 tensor (dense)") if peak == "bf16" else ("fp32_tflops", "fp32 (dense)")
    return [
        Profile(entry["name"], entry[field] * 1e12, entry["hbm_tb_s"] * 1e12, "datasheet",
                f"mcsim hardware catalog preset {key!r} ({field}, hbm_tb_s): {entry['source']}", label)
        for key, entry in catalog.hardware().items()
        if key not in HOST_PRESETS and entry.get(field, 0) > 0
    ]


def datasheet_profiles(peak: str = "bf16") -> list[Profile]:
    """Laptop and desktop GPUs (FP32 shader peaks), then the catalog's datacenter GPUs at ``peak``."""
    return [_APPLE_M1, _RTX_3060_TI, _RTX_2070_SUPER, *catalog_profiles(peak)]


def default_profiles(this_machine: Profile | None = None, peak: str = "bf16") -> list[Profile]:
    """``this_machine`` (if given) first, then :data:`THEORETICAL`, then :func:`datasheet_profiles`."""
    head = [this_machine] if this_machine is not None else []
    return [*head, THEORETICAL, *datasheet_profiles(peak)]


def price(record, profile: Profile) -> dict:
    """Roofline time of one op on one profile: a synthetic estimate.

    Parameters
    ----------
    record : OpRecord or mapping
        Anything with ``flops``, ``bytes_read`` and ``bytes_written`` (attributes or keys).
    profile : Profile

    Returns
    -------
    dict
        ``t_compute = flops / peak_flops`` (s), ``t_memory = bytes / bandwidth`` (s),
        ``t_estimate = max(t_compute, t_memory)`` (s), ``bound`` (``"compute"`` when the intensity
        reaches the ridge point, else ``"memory"``), ``intensity = flops / bytes`` (FLOP/byte; inf
        for an op that moves no bytes) and ``ridge = peak_flops / bandwidth`` (FLOP/byte).
    """
    def get(key):
        return float(record[key] if isinstance(record, dict) else getattr(record, key))

    flops = get("flops")
    moved = get("bytes_read") + get("bytes_written")
    t_compute = flops / profile.peak_flops
    t_memory = moved / profile.bandwidth_bytes_s
    intensity = flops / moved if moved > 0 else (math.inf if flops > 0 else 0.0)
    ridge = profile.ridge
    return {"t_compute": t_compute, "t_memory": t_memory, "t_estimate": max(t_compute, t_memory),
                "bound": "compute" if intensity >= ridge else "memory", "intensity": intensity, "ridge": ridge}


# --------------------------------------------------------------------------------------------------
# This machine


def _best_rate(work: float, fn, budget_s: float) -> float:
    """Best ``work / seconds`` of ``fn()`` over repeats filling ``budget_s`` (at least two runs)."""
    best, spent, runs = 0.0, 0.0, 0
    while runs < 2 or spent < budget_s:
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        spent += elapsed
        runs += 1
        if elapsed > 0:
            best = max(best, work / elapsed)
    return best


def measure_gemm_flops(seconds: float = 0.5, dtype: str = "float32") -> tuple[float, dict]:
    """Best GEMM rate of ``numpy.matmul`` on square matrices of a few sizes, FLOP/s (and per size)."""
    sizes = (256, 512, 1024, 2048) if seconds >= 0.4 else (256, 512, 1024)
    rng = np.random.default_rng(0)
    by_size = {}
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
        b = rng.standard_normal((n, n), dtype=np.float32).astype(dtype)
        out = np.empty((n, n), dtype=dtype)
        np.matmul(a, b, out=out)  # warm-up
        by_size[n] = _best_rate(2.0 * n**3, functools.partial(np.matmul, a, b, out=out), seconds / len(sizes))
    return max(by_size.values()), by_size


def measure_stream_bandwidth(seconds: float = 0.5, megabytes: int = 128) -> tuple[float, dict]:
    """Best streaming rate over arrays far larger than the caches, bytes/s (and per access pattern).

    Copy moves ``2 * nbytes`` (read the source, write the destination; the write-allocate read is
    not counted, as in STREAM); a sum reads ``nbytes``; a matrix-vector product (BLAS, on every
    core, which is how a decode step reads its weights) reads the matrix once. NumPy's copy and sum
    run on one core, so the GEMV is usually the best of the three on a multi-core machine.
    """
    n = megabytes * 2**20 // 4
    side = math.isqrt(n)
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    matrix = src[: side * side].reshape(side, side)
    vector = np.ones(side, dtype=np.float32)
    product = matrix @ vector  # warm-up
    rates = {
        "copy": _best_rate(2.0 * src.nbytes, lambda: np.copyto(dst, src), seconds / 3),
        "sum": _best_rate(float(src.nbytes), lambda: src.sum(), seconds / 3),
        "gemv": _best_rate(float(matrix.nbytes), lambda: np.matmul(matrix, vector, out=product),
                           seconds / 3),
    }
    return max(rates.values()), rates


def measure_this_machine(seconds: float = 1.0, dtype: str = "float32") -> Profile:
    """Profile of this machine from micro-benchmarks, labelled ``kind="measured"``.

    Parameters
    ----------
    seconds : float
        Total time budget, split between GEMM and streaming (each size runs at least twice, so very
        short budgets take somewhat longer).
    dtype : str
        GEMM dtype (the decoder's compute dtype).

    Returns
    -------
    Profile
        ``peak_flops``: best ``numpy.matmul`` rate over square sizes 256..2048; ``bandwidth_bytes_s``:
        best of large-array copy and sum. Both are what NumPy reaches, not the silicon's peaks.
    """
    flops, by_size = measure_gemm_flops(seconds / 2, dtype)
    bandwidth, by_pattern = measure_stream_bandwidth(seconds / 2)
    env = runtime_environment()
    sizes = ", ".join(f"{n}: {rate / 1e9:.1f}" for n, rate in by_size.items())
    patterns = ", ".join(f"{k}: {rate / 1e9:.1f}" for k, rate in by_pattern.items())
    source = (f"measured here with numpy {np.__version__} ({env['blas']}, {env['cpu_count']} CPUs, "
              f"{env['processor']}): {dtype} GEMM GFLOP/s by size {{{sizes}}}; "
              f"stream GB/s {{{patterns}}}; best of each")
    return Profile("this machine", flops, bandwidth, "measured", source, f"{dtype} numpy matmul")


def _blas_description() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas.get('name', 'unknown')} {blas.get('version', '')}".strip()
    except (KeyError, TypeError, AttributeError, ValueError):  # the layout is not a stable API
        name = "unknown BLAS"
    if threadpoolctl is not None:
        pools = threadpoolctl.threadpool_info()
        blas_pools = [p for p in pools if p.get("user_api") == "blas"]
        if blas_pools:
            pool = blas_pools[0]
            name += f" ({pool.get('internal_api')}, {pool.get('num_threads')} threads)"
    return name


def _processor_name() -> str:
    """CPU model name (``/proc/cpuinfo`` on Linux, where ``platform.processor()`` is often empty)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def runtime_environment() -> dict:
    """Where a measurement ran: NumPy and BLAS, CPU, Python and OS."""
    return {
        "backend": "numpy",
        "numpy_version": np.__version__,
        "blas": _blas_description(),
        "processor": _processor_name(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "system": platform.platform(),
        # Other work on the CPUs slows multi-threaded BLAS a lot; keep the load with the figures.
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
