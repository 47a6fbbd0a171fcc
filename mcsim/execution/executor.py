"""Sweeps on Dask: (grid point x chunk of samples) tasks, parts saved as they finish, resumable.

Every run — ``run``, ``compare``, ``sweep`` — goes through :func:`execute`. Tasks go to a ``dask.distributed``
client: an in-process cluster of threads by default (the kernels release the GIL), a local cluster of processes
with ``processes=True``, or an existing cluster by its address (that is how a study grows past one machine).

Determinism: a task's result depends only on (scenario, grid point, sample indices, seed) — each sample's
streams come from the seed and the sample index — so results are bit-identical whatever the chunking, worker
count or scheduler. Grid points share sample streams (common random numbers): differences across the grid are
caused by the parameter, not by noise.

Nothing lost: with an output file, each finished task is written at once as a part file in ``<output>.parts/``
(atomically), stamped with a fingerprint of the run. An interrupted run keeps its parts; ``resume=True`` checks
them (a damaged or foreign part is recomputed, never merged) and runs only what is missing. The final file is
assembled, written atomically, and then the parts are removed. The client holds one chunk's result at a time,
so memory is bounded by the chunk, not by the grid.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import tqdm
import xarray as xr

from mcsim import __version__
from mcsim.errors import McsimError, OutputError
from mcsim.execution import progress as progress_events
from mcsim.execution import sample as one_sample
from mcsim.fileio import (atomic_path, not_a_regular_file, readable_kind, refuse_inputs, stale_temporaries,
                          temporary_pattern)
from mcsim.results import dataset as results
from mcsim.results.attribution import ablation_variants, reduce_row, saved_variants
from mcsim.scenario import Scenario, ScenarioError, draw_uncertain
from mcsim.scenario.calibration_file import CalibrationError
from mcsim.scenario.calibration_file import load as load_calibration
from mcsim.scenario.grid import Axis, points, pricing_note
from mcsim.scenario.schema import READS_CHANGING_KEYS, workload_reads
from mcsim.stages.workload import resolve_trace_path
from mcsim.text import one_line, si

PART_FORMAT = 2  # 2: parts carry a checksum of their values


class GridPointFailed(McsimError):
    """A refusal at run time at one grid point (its values, then the refusal, on one line); the run stops."""

    @classmethod
    def at(cls, plan: "Plan", point: int, err: McsimError) -> McsimError:
        """The error to raise for ``err`` at ``point``: this class where the point has grid values to name, the
        refusal itself (its own type) where the run has no grid."""
        return cls(plan, point, err) if plan.grid and plan.grid[point] else err

    def __init__(self, plan: "Plan", point: int, err: Exception):
        values = plan.grid[point] if plan.grid and plan.grid[point] else {}
        where = ", ".join(f"{k}={v}" for k, v in values.items())
        super().__init__(f"at grid point {where}: {err}" if where else str(err))
        self.point = point


class SweepInterrupted(McsimError):
    """The run stopped before every task finished; its finished parts are kept."""

    def __init__(self, done: int, total: int, parts_dir: Path | None):
        where = f" in {parts_dir}" if parts_dir else ""
        hint = "; run the same command again with --resume to finish it" if parts_dir else ""
        super().__init__(f"interrupted: {done} of {total} tasks finished and saved{where}{hint}")
        self.done, self.total, self.parts_dir = done, total, parts_dir


@dataclass(frozen=True)
class Plan:
    """Everything a task needs; pickled once to the workers."""

    scn: Scenario
    variants: dict = field(hash=False)  # name -> overrides
    axes: tuple = ()
    samples: int = 1
    requests: int = 1000
    seed: int = 0
    chunk_size: int = 1
    ablate: bool = False

    @property
    def grid(self) -> list[dict]:
        return points(list(self.axes))

    @property
    def chunks(self) -> list[np.ndarray]:
        return [np.arange(i, min(i + self.chunk_size, self.samples)) for i in range(0, self.samples, self.chunk_size)]

    @property
    def saved_variants(self) -> tuple:
        if self.ablate:
            return saved_variants(self)
        return tuple(self.variants)

    def fingerprint(self) -> str:
        """Identity of the run's results: parts from any other run are foreign."""
        spec = {
            "format": PART_FORMAT, "version": __version__, "scenario": self.scn.text,
            "overrides": list(self.scn.overrides), "variants": self.variants,
            "axes": [[a.path, list(a.values)] for a in self.axes], "samples": self.samples,
            "requests": self.requests, "seed": self.seed, "chunk_size": self.chunk_size,
            "sampling": self.scn["mc.sampling"], "ablate": self.ablate,
            "calibration": None if self.scn.calibration is None else self.scn.calibration.digest,
            "files": {str(path): _file_digest(path) for path in self.input_files()},
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()

    def trace_paths(self) -> list[Path]:
        """The traces the run replays: the scenario's and its grid points' ``workload.trace``."""
        traces = {self.scn["workload.trace"]} | {str(v) for a in self.axes if a.path == "workload.trace"
                                                  for v in a.values}
        return [resolve_trace_path(t, self.scn.base_dir) for t in sorted(traces) if t]

    def own_inputs(self) -> list:
        """Every file the run reads, the scenario's own included: none of them may be its output."""
        return [self.scn.source, *self.input_files()]

    def input_files(self) -> list[Path]:
        """Every file the run reads besides the scenario text: its traces and its calibration (their content is
        part of the fingerprint)."""
        files = self.trace_paths()
        if self.scn.calibration is not None and self.scn.calibration.path:
            files.append(Path(self.scn.calibration.path))
        return files + self.surface_paths()

    def surface_paths(self) -> list[Path]:
        """The GEMM surfaces the run reads: the scenario's and its grid points' ``performance.gemm_surface``."""
        surfaces = {str(self.scn.values.get("performance.gemm_surface", ""))} | {
            str(v) for a in self.axes if a.path == "performance.gemm_surface" for v in a.values}
        return [Path(s).expanduser() for s in sorted(surfaces) if s not in ("", "none")]


def _file_digest(path: Path) -> str:
    """SHA-256 of a file's content ("missing" when it cannot be read: the run then fails on it by name)."""
    digest = hashlib.sha256()
    if readable_kind(path):  # a pipe or device would block or never end: the run refuses it by name
        return "not a regular file"
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return "missing"
    return digest.hexdigest()


def check_inputs(plan: "Plan") -> None:
    """Read and check every trace the run will replay and every GEMM surface it reads before any work starts (a
    bad one is a one-line error, and no part is written)."""
    own = str(plan.scn.values.get("performance.gemm_surface", ""))
    for path in plan.surface_paths():
        if str(path) == own:
            continue  # read and checked when the scenario loaded (loading.attach_surface)
        cal = load_calibration(path)  # a CalibrationError naming the file, the key and what was expected
        if "gemm" not in cal.surfaces:
            raise CalibrationError(str(path), "performance.gemm_surface: the calibration has no [surfaces.gemm] "
                                   "table (mcsim calibrate writes one from per-GEMM measurements)",
                                   key="performance.gemm_surface")
    for path in plan.trace_paths():
        kind = readable_kind(path)
        if kind:
            raise ScenarioError(plan.scn.source, "workload.trace", f"{path} is {kind}, not a trace file")
        if not path.is_file():
            raise ScenarioError(plan.scn.source, "workload.trace", f"no such trace file: {path}")
        one_sample._read_trace(str(path), plan.scn["workload.trace_format"])


def check_output(output: Path, force: bool, inputs=()) -> None:
    """Refuse, before any work, an output the run could not write: an existing file (without ``force``), one of
    the run's own ``inputs`` (with ``force`` too), a folder, a path under a file, a folder that is missing or not
    writable."""
    if output.is_dir():
        raise OutputError(f"{output}: is a folder; give a file name for the result")
    reason = not_a_regular_file(output)
    if reason:
        raise OutputError(f"{output}: {reason}")
    refuse_inputs(output, inputs, "the result")
    if output.exists() and not force:
        raise FileExistsError(f"{output} exists; use --force to overwrite it")
    parent = output.parent if str(output.parent) else Path(".")
    for folder in (parent, *parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise OutputError(f"{output}: {folder} is a file, not a folder")
            if folder == parent and not os.access(folder, os.W_OK | os.X_OK):
                raise OutputError(f"{output}: the folder {folder} is not writable")
            break


def run_task(plan: Plan, point: int, chunk: int) -> list[dict]:
    """Rows of one (grid point, chunk of samples): variant -> metric -> value per sample."""
    scn = plan.scn
    overrides = plan.grid[point]
    point_scn = scn.with_values(overrides, origin="--grid") if overrides else scn
    indices = plan.chunks[chunk]
    # Draws come from the unswept scenario, so every grid point sees the same uncertain values.
    draws = draw_uncertain(scn, indices, plan.seed, n_samples=plan.samples, include_unused=_reads_swept(plan))
    rows = []
    for j, sample in enumerate(indices):
        row = one_sample.run_sample(point_scn, plan.variants, int(sample), plan.seed, plan.requests,
                         {k: float(v[j]) for k, v in draws.items()})
        if plan.ablate:
            row = reduce_row(plan, row)
        rows.append(row)
    return rows


def _part_path(parts_dir: Path, point: int, chunk: int) -> Path:
    return parts_dir / f"point{point:06d}-chunk{chunk:06d}.npz"


def _checksum(table: dict) -> str:
    """SHA-256 over a part's arrays (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for name in sorted(table):
        array = np.ascontiguousarray(table[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _write_part(path: Path, table: dict, plan: Plan, point: int, chunk: int, fingerprint: str):
    """Save one task's table atomically (temporary name in the same folder, then rename); the parts folder is
    created with its first part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {"__fingerprint__": np.array(fingerprint), "__point__": np.array(point), "__chunk__": np.array(chunk),
             "__sample__": plan.chunks[chunk], "__format__": np.array(PART_FORMAT),
             "__checksum__": np.array(_checksum(table))}
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, **table, **stamp)


def _read_part(path: Path, plan: Plan, point: int, chunk: int, fingerprint: str) -> dict | None:
    """The part's table if the file is whole, belongs to this run and its values match their checksum; None
    otherwise (it is then recomputed, never merged)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            table = {k: z[k] for k in z.files}
    except Exception:  # damaged: any failure to read it means recompute
        return None
    try:
        ok = (str(table.pop("__fingerprint__", "")) == fingerprint and int(table.pop("__point__", -1)) == point
              and int(table.pop("__chunk__", -1)) == chunk and int(table.pop("__format__", -1)) == PART_FORMAT
              and np.array_equal(table.pop("__sample__", None), plan.chunks[chunk]))
        checksum = str(table.pop("__checksum__", ""))
    except (TypeError, ValueError):
        return None
    return table if ok and checksum == _checksum(table) else None


#: Seconds to wait for a dask.distributed scheduler to answer once its port accepts connections.
SCHEDULER_TIMEOUT_S = 5.0
#: Seconds to resolve a scheduler's host name, and then to open a TCP connection to its port.
SCHEDULER_CONNECT_TIMEOUT_S = 3.0


class SchedulerError(McsimError, ValueError):
    """A scheduler address that is malformed or does not answer."""


def check_scheduler(address: str) -> str:
    """``address`` if dask.distributed can read it as a scheduler address (``tcp://host:port``, ``host:port``,
    ``tls://...``, ``inproc://...``); a :class:`SchedulerError` naming it otherwise."""
    # start-up: dask.distributed takes about 1 s to import, and only running tasks needs it
    from distributed.comm.addressing import parse_address, parse_host_port

    text = address.strip()
    try:
        scheme, location = parse_address(text if "://" in text else f"tcp://{text}")
        if scheme not in ("tcp", "tls", "ws", "wss", "ucx", "inproc"):
            raise ValueError(scheme)
        if scheme in ("tcp", "tls"):
            host, port = parse_host_port(location, 8786)
            if not host or any(c.isspace() for c in host) or not 0 < int(port) < 65536:
                raise ValueError(location)
    except (ValueError, TypeError):
        raise SchedulerError(f"--scheduler {address!r}: expected an address like tcp://10.0.0.5:8786") from None
    return text


def reach_scheduler(address: str) -> None:
    """Fail fast, in one line, when nothing can answer at a ``tcp://`` or ``tls://`` scheduler address: a host name
    that does not resolve, or a port that refuses the connection or does not accept it within
    :data:`SCHEDULER_CONNECT_TIMEOUT_S` (dask.distributed itself would retry for its whole timeout). Other
    schemes are left to dask.distributed. Raises :class:`SchedulerError`."""
    # start-up: dask.distributed takes about 1 s to import, and only running tasks needs it
    from distributed.comm.addressing import parse_address, parse_host_port

    text = check_scheduler(address)
    scheme, location = parse_address(text if "://" in text else f"tcp://{text}")
    if scheme not in ("tcp", "tls"):
        return
    host, port = parse_host_port(location, 8786)
    found: dict = {}

    def resolve():
        try:
            found["addresses"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as err:
            found["error"] = err

    # getaddrinfo has no timeout of its own: wait for it in a daemon thread, and no longer than the deadline
    resolver = threading.Thread(target=resolve, daemon=True)
    resolver.start()
    resolver.join(SCHEDULER_CONNECT_TIMEOUT_S)
    if resolver.is_alive():
        raise SchedulerError(f"--scheduler {address}: the host name {host!r} did not resolve within "
                             f"{SCHEDULER_CONNECT_TIMEOUT_S:g} s")
    if "error" in found:
        err = found["error"]
        raise SchedulerError(f"--scheduler {address}: cannot resolve the host name {host!r} "
                             f"({getattr(err, 'strerror', None) or err})")
    failure = "no address"
    for family, kind, proto, _, sockaddr in found["addresses"]:
        with socket.socket(family, kind, proto) as sock:
            sock.settimeout(SCHEDULER_CONNECT_TIMEOUT_S)
            try:
                sock.connect(sockaddr)
                return
            except ConnectionRefusedError:
                failure = "connection refused: is a scheduler running there (dask scheduler)?"
            except (TimeoutError, socket.timeout):
                failure = f"no answer within {SCHEDULER_CONNECT_TIMEOUT_S:g} s"
            except OSError as err:
                failure = err.strerror or type(err).__name__
    raise SchedulerError(f"--scheduler {address}: {failure}")


#: Memory one simulated request holds while its sample runs, bytes: the peak growth of one sample of 1,000,000
#: requests with every stage on is about 1.4 GiB (``mcsim bench``), 1.5 kB a request; 2 kB leaves room for
#: longer prompts (more KV blocks per request).
BYTES_PER_REQUEST = 2048


def sample_bytes(plan: "Plan") -> int:
    """Memory one sample of the plan needs: :data:`BYTES_PER_REQUEST` a request, or for a streamed sample (its
    first sample's draws, every variant) a chunk's worth and its caches' state
    (:func:`mcsim.execution.sample.streamed_bytes`)."""
    whole = plan.requests * BYTES_PER_REQUEST
    if plan.axes:  # a grid point may not stream
        return whole
    scn = plan.scn
    try:
        draws = draw_uncertain(scn, [0], plan.seed, n_samples=plan.samples)
        values = {k: float(v[0]) for k, v in draws.items()}
        sizes = [one_sample.streamed_bytes(scn, one_sample.variant_params(scn, name, overrides, values),
                                           plan.requests, BYTES_PER_REQUEST)
                 for name, overrides in plan.variants.items()]
    except Exception:  # the run itself reports what is wrong with the scenario
        return whole
    return whole if None in sizes else min(max(sizes), whole)


class MemoryLimitError(McsimError, ValueError):
    """A run whose samples cannot fit in this machine's memory."""


def check_memory(plan: "Plan", concurrent: int) -> None:
    """Refuse, with the numbers, a run whose concurrently running samples would need more than this machine's
    memory (``concurrent`` samples of ``requests`` requests at :data:`BYTES_PER_REQUEST` each)."""
    try:
        total = psutil.virtual_memory().total
    except Exception:  # no way to tell: do not refuse
        return
    one = sample_bytes(plan)
    at_once = max(1, min(concurrent, plan.samples))
    if one * at_once <= total:
        return
    head = (f"{plan.requests:,} requests per sample need about {one / 2**30:.1f} GiB of memory each; this machine "
            f"has {total / 2**30:.1f} GiB")
    if one > total:
        raise MemoryLimitError(f"{head}. Use fewer requests (--requests or mc.requests)")
    raise MemoryLimitError(f"{head}, and {at_once} samples would run at once ({one * at_once / 2**30:.1f} GiB). "
                           f"Use --workers {total // one} or fewer requests")


def _client(workers: int, processes: bool, scheduler: str | None):
    # start-up: dask.distributed takes about 1 s to import, and only running tasks needs it
    from dask.distributed import Client, LocalCluster

    if scheduler:
        address = check_scheduler(scheduler)
        try:
            return Client(address, timeout=SCHEDULER_TIMEOUT_S), None
        except (OSError, TimeoutError) as err:
            raise SchedulerError(f"--scheduler {address}: no dask.distributed scheduler answered within "
                                 f"{SCHEDULER_TIMEOUT_S:g} s ({type(err).__name__})") from None
    if processes:
        # Compiled kernels are loaded from the on-disk cache the parent has just written (see _warm_up), so the
        # workers do not race to compile.
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                               silence_logs=logging.CRITICAL)
    else:
        cluster = LocalCluster(n_workers=1, threads_per_worker=workers, processes=False, dashboard_address=":0",
                               silence_logs=logging.CRITICAL)
    return Client(cluster, set_as_default=False), cluster


def _warm_up(plan: Plan):
    """Compile (or load) every kernel in this process before any worker needs them; fail fast on bad input."""
    point = plan.grid[0]
    scn = plan.scn.with_values(point, origin="--grid") if point else plan.scn
    variants = dict(list(plan.variants.items())[:2])
    run_task(Plan(scn, variants, (), 1, min(plan.requests, 400), plan.seed, 1, False), 0, 0)


def _assemble(plan: Plan, parts: dict, attrs: dict) -> xr.Dataset:
    variants = plan.saved_variants
    per_point = [
        results.dataset_from_table(results.concat_tables([parts[(point, c)] for c in range(len(plan.chunks))]),
                                   variants, np.arange(plan.samples), {}, {})
        for point in range(len(plan.grid))
    ]
    paths = [a.path for a in plan.axes]
    names = [results.dataset_name(p) for p in paths]  # dims without dots (CF names, xarray identifiers)
    tiers = list(dict.fromkeys(tuple(ds["tier"].values.tolist()) for ds in per_point))
    if len(tiers) > 1:  # one tier dim for the whole grid: the points must name the same tiers, in one order
        raise ScenarioError(plan.scn.source, "cache.tiers", "the grid points have different cache tiers ("
                            + "; ".join(", ".join(t) for t in tiers[:3]) + "); sweep scenarios with the same tiers")
    if not paths:
        out = per_point[0]
    else:
        stacked = xr.concat(per_point, dim="__point__", data_vars="all", coords="minimal", compat="override",
                            combine_attrs="override")
        grid = plan.grid
        if len(paths) == 1:
            out = stacked.rename({"__point__": names[0]}).assign_coords({names[0]: [g[paths[0]] for g in grid]})
        else:
            stacked = stacked.assign_coords({n: ("__point__", [g[p] for g in grid]) for n, p in zip(names, paths)})
            out = stacked.set_index(__point__=names).unstack("__point__")
            # unstack sorts; keep the user's order
            out = out.reindex({n: list(a.values) for n, a in zip(names, plan.axes)})
        out = out.transpose(*names, ...)
        for name, path in zip(names, paths):
            out[name].attrs.update(results.grid_axis_attrs(path))
    swept = set(paths)
    draws = draw_uncertain(plan.scn, np.arange(plan.samples), plan.seed, n_samples=plan.samples,
                           include_unused=_reads_swept(plan))
    for path, values in draws.items():
        if path in swept:
            continue
        name, variable = results.input_variable(path, values)
        out[name] = variable
    out.attrs = attrs
    return out


def _workload_over_grid(plan: Plan, description: str, most: int = 24) -> str:
    """The ``workload`` attribute: the scenario's, or each grid point's where workload axes make them differ."""
    def describe(values: dict) -> str:
        return results.workload_description(plan.scn.with_values(values, origin="--grid"))

    axes = [a for a in plan.axes if workload_reads(a.path)]
    first = {a.path: a.values[0] for a in axes}
    # only the axes that change the description (a trace keeps its own rate, so workload.rate_rps does not)
    axes = [a for a in axes if len({describe({**first, a.path: v}) for v in a.values[:most]}) > 1]
    if not axes:
        return description
    combos = list(itertools.islice(itertools.product(*(a.values for a in axes)), most + 1))
    texts = []
    for combo in combos[:most]:
        values = dict(zip((a.path for a in axes), combo))
        texts.append((", ".join(f"{p}={v}" for p, v in values.items()), describe(values)))
    if len({t for _, t in texts}) == 1:
        return texts[0][1]
    more = "; ..." if len(combos) > most else ""
    return "varies over the grid: " + "; ".join(f"{where}: {text}" for where, text in texts) + more


def open_parts(plan: Plan, tasks: list, fingerprint: str, output: Path | None, resume: bool, force: bool):
    """The parts folder of ``output`` and the valid parts of ``tasks`` it holds, before any work.

    Returns ``(parts, parts_dir, reused, recomputed)``: ``{(point, chunk): table}`` of the parts reused (with
    ``resume``), the folder (None without an output), and how many parts were reused and found damaged or foreign
    (removed, to be recomputed). Leftover parts without ``resume`` or ``force`` are refused; ``force`` discards them.
    A parts folder that is a link, or holds anything but part files, is refused whatever the flags: only files
    mcsim wrote are ever removed.
    """
    parts: dict = {}
    parts_dir = None
    reused = recomputed = 0
    if output is not None:
        check_output(output, force, inputs=plan.own_inputs())
        parts_dir = output.with_name(output.name + ".parts")
        for stale in stale_temporaries(output):  # a final write cut short by a kill
            stale.unlink(missing_ok=True)
        held = _part_files(parts_dir)
        if held and resume:
            for p, c in tasks:
                path = _part_path(parts_dir, p, c)
                if not path.exists():
                    continue
                part = _read_part(path, plan, p, c, fingerprint)
                if part is None:
                    path.unlink(missing_ok=True)
                    recomputed += 1
                else:
                    parts[(p, c)] = part
                    reused += 1
            for leftover in held:  # a write cut short by a crash
                if not _PART_NAME.fullmatch(leftover.name):
                    leftover.unlink(missing_ok=True)
        elif held and force:
            remove_parts(parts_dir)
        elif held:
            raise FileExistsError(f"{parts_dir} holds parts of an interrupted run; use --resume to finish it "
                                  "or --force to start again")
        elif parts_dir.is_dir():
            parts_dir.rmdir()  # empty: nothing to keep
    return parts, parts_dir, reused, recomputed


#: A part's file name, and the temporary names its atomic write uses (this version's, and the earlier 8-hex form).
_PART_NAME = re.compile(r"point\d{6}-chunk\d{6}\.npz")
_PART_TEMP = re.compile(temporary_pattern(_PART_NAME.pattern) + r"|\." + _PART_NAME.pattern + r"\.[0-9a-f]{8}\.tmp")


def _is_part_file(path: Path) -> bool:
    """A part file or one of its temporaries, as a regular file (a link or a folder of that name is not)."""
    if not (_PART_NAME.fullmatch(path.name) or _PART_TEMP.fullmatch(path.name)):
        return False
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _part_files(parts_dir: Path) -> list[Path]:
    """The files of a parts folder (none where it is missing), after checking that it is mcsim's: a real folder
    holding only part files and their temporaries, each a regular file. Anything else is refused by name, so a
    link or a user's file in it is never followed, replaced or removed."""
    try:
        mode = os.lstat(parts_dir).st_mode
    except FileNotFoundError:
        return []
    if stat.S_ISLNK(mode):
        raise OutputError(f"{parts_dir}: is a symbolic link, not the parts folder mcsim makes; move it away, "
                          "--force or not")
    if not stat.S_ISDIR(mode):
        raise OutputError(f"{parts_dir}: expected the parts folder of an interrupted run, found a file")
    files = [parts_dir / name for name in sorted(os.listdir(parts_dir))]
    for path in files:
        if not _is_part_file(path):
            raise OutputError(f"{parts_dir}: holds {one_line(path.name, 80)}, which is not a part file mcsim wrote; "
                              "move it away, --force or not")
    return files


def remove_parts(parts_dir: Path | None) -> None:
    """Remove a parts folder's part files and then the folder; anything that is not mcsim's stays (and with it
    the folder)."""
    if parts_dir is None:
        return
    try:
        mode = os.lstat(parts_dir).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(mode):
        return
    for name in os.listdir(parts_dir):
        if _is_part_file(parts_dir / name):
            (parts_dir / name).unlink(missing_ok=True)
    try:
        parts_dir.rmdir()
    except OSError:
        pass


def run_attrs(plan: Plan, command: str | None, fingerprint: str, reused: int, recomputed: int) -> dict:
    """The attributes of a run's result: provenance, the grid, the parts reused and the notes of its axes."""
    attrs = results.provenance(plan.scn, plan.seed, plan.samples, plan.requests, command, {
        "variants": " ".join(plan.saved_variants),
        "grid_axes": " ".join(a.path for a in plan.axes),
        "chunk_size": plan.chunk_size,
        "fingerprint": fingerprint,
        "parts_reused": reused,
        "parts_recomputed": recomputed,
    })
    attrs["workload"] = _workload_over_grid(plan, attrs["workload"])
    swept = {a.path: [str(v) for v in a.values] for a in plan.axes}
    if "hardware.preset" in swept or "performance.fidelity" in swept or "performance.stack" in swept:
        attrs.update(results.kernel_data(plan.scn, swept.get("hardware.preset"), swept.get("performance.fidelity"),
                                         swept.get("performance.stack")))
    for path, key in (("performance.fidelity", "fidelity"), ("deployment.fleet", "fleet"),
                      ("deployment.fleet_simulation", "fleet_simulation")):
        if any(axis.path == path for axis in plan.axes):
            attrs[key] = f"swept: see the {results.dataset_name(path)} coordinate"
    note = pricing_note(plan.scn, list(plan.axes))
    if note:
        attrs["pricing_note"] = note
    records = trace_records(plan)
    if records is not None:
        attrs["trace_records"] = records
    attrs["streamed_samples"] = streamed_note(plan)
    return attrs


def streamed_note(plan: "Plan") -> str:
    """How the samples ran: whole, or streamed chunk by chunk (the first sample's draws, every variant; a grid's
    points may differ), and with replicas where their prefix-cache hits came from."""
    if plan.axes:
        return "per grid point: whole or streamed as its values say (see the README's Streamed samples)"
    scn = plan.scn
    try:
        draws = draw_uncertain(scn, [0], plan.seed, n_samples=plan.samples)
        values = {k: float(v[0]) for k, v in draws.items()}
        params = [one_sample.variant_params(scn, name, overrides, values) for name, overrides in plan.variants.items()]
        streams = [one_sample.streamed(scn, p, plan.requests) for p in params]
    except Exception:  # the run itself reports what is wrong with the scenario
        return ""
    if not any(streams):
        return "no: every request of a sample in memory at once"
    chunk = one_sample.chunk_requests(params[streams.index(True)])
    note = f"yes: chunks of {chunk:,} requests, latency quantiles from sketches (0.5 % relative error)"
    if any(s and p["deployment.fleet_simulation"] == "replicas" for s, p in zip(streams, params)):
        note += ("; the replicas ran every request with the cache stage's prefix-cache hits (arrival order), "
                 "not their own caches")
    return note


def trace_records(plan: Plan) -> int | None:
    """Requests the run's one replayed trace holds from ``workload.trace_start_s`` on (what any request count can
    replay of it); None for a generated workload, or when a grid varies the trace or where it starts."""
    swept = {a.path for a in plan.axes}
    paths = plan.trace_paths()
    if len(paths) != 1 or "workload.trace_start_s" in swept:
        return None
    start = plan.scn["workload.trace_start_s"]
    if not isinstance(start, (int, float)):  # an uncertain start: each sample replays from its own
        return None
    trace = one_sample._read_trace(str(paths[0]), plan.scn["workload.trace_format"])
    return int(len(trace.arrival_s) - np.searchsorted(trace.arrival_s, float(start), side="left"))


def check_workers(plan: Plan, workers: int | None, processes: bool, scheduler: str | None) -> int:
    """The number of workers (default: this machine's cores), after refusing a run that cannot fit in memory, a
    scheduler together with ``processes`` and a scheduler that does not answer."""
    workers = int(workers or os.cpu_count() or 1)
    check_memory(plan, 1 if scheduler else workers)
    if scheduler is not None:
        if processes:
            raise SchedulerError("--processes and --scheduler exclude each other: the scheduler's workers run "
                                 "the tasks")
        reach_scheduler(scheduler)
    return workers


def execute(plan: Plan, *, output=None, resume: bool = False, force: bool = False, workers: int | None = None,
            processes: bool = False, scheduler: str | None = None, progress: bool = False,
            command: str | None = None) -> xr.Dataset:
    """Run every (grid point, chunk) task of ``plan`` and return the assembled Dataset.

    Parameters
    ----------
    plan : Plan
    output : path, optional
        Final NetCDF file. With it, finished tasks are saved in ``<output>.parts/`` as they complete.
    resume : bool
        Reuse the valid parts of an interrupted run of the same plan.
    force : bool
        Overwrite an existing output and discard leftover parts.
    workers : int, optional
        Threads (or processes) on this machine; default: its cores.
    processes : bool
        A local cluster of processes instead of threads.
    scheduler : str, optional
        Address of an existing ``dask.distributed`` scheduler.

    Raises
    ------
    SweepInterrupted
        On Ctrl-C; finished parts are kept.
    """
    workers = check_workers(plan, workers, processes, scheduler)
    fingerprint = plan.fingerprint()
    tasks = [(p, c) for p in range(len(plan.grid)) for c in range(len(plan.chunks))]
    output = None if output is None else Path(output)
    parts, parts_dir, reused, recomputed = open_parts(plan, tasks, fingerprint, output, resume, force)
    todo = [t for t in tasks if t not in parts]
    if todo:
        check_inputs(plan)
        try:
            if in_process(len(todo), workers, processes, scheduler):
                _run_in_process(plan, todo, parts, parts_dir, fingerprint, progress, len(tasks))
            else:
                if processes or scheduler:
                    _warm_up(plan)  # other processes load the kernels this one compiled, never racing to write them
                _run_tasks(plan, todo, parts, parts_dir, fingerprint, workers, processes, scheduler, progress,
                           len(tasks))
        except BaseException:
            # parts are kept for --resume; a folder that never received one is not left behind
            if parts_dir is not None and parts_dir.is_dir() and not any(parts_dir.glob("*.npz")):
                remove_parts(parts_dir)
            raise
    attrs = run_attrs(plan, command, fingerprint, reused, recomputed)
    try:
        ds = _assemble(plan, parts, attrs)
        if output is not None:
            results.write_netcdf(ds, output, force=force)
    except KeyboardInterrupt:  # every part is saved: the rerun with --resume only assembles them
        raise SweepInterrupted(len(tasks), len(tasks), parts_dir if output is not None else None) from None
    if output is not None:
        remove_parts(parts_dir)
    return ds


def in_process(tasks: int, workers: int, processes: bool, scheduler: str | None) -> bool:
    """Whether the tasks run in this process, one after another, without Dask: on this machine's threads, where
    there is one task or one worker (Dask's import and cluster would cost more than the tasks; a small study then
    takes a fraction of a second)."""
    return scheduler is None and not processes and (tasks == 1 or workers == 1)


def _keep_part(plan, point: int, chunk: int, rows, parts: dict, parts_dir, fingerprint: str) -> None:
    """One finished task's rows as a table, saved as its part file (with an output) and kept in ``parts``."""
    table = results.rows_to_table(rows, plan.saved_variants)
    if parts_dir is not None:
        _write_part(_part_path(parts_dir, point, chunk), table, plan, point, chunk, fingerprint)
    parts[(point, chunk)] = table


def _refused(plan, point: int, err: McsimError, parts_dir) -> McsimError:
    """The error to raise for a refusal at one grid point, its parts removed first: the same command would fail
    at the same point, and a changed one has another fingerprint, so no part it kept could be resumed."""
    remove_parts(parts_dir)
    return GridPointFailed.at(plan, point, err)


def _run_in_process(plan, todo, parts, parts_dir, fingerprint, progress, total):
    """Run ``todo`` here, in order, saving each part as it finishes; the same tasks and rows as on Dask.

    Kernels compile (or load from the on-disk cache) at their first call: this process is the only one that
    compiles, so no warm-up is needed. Ctrl-C stops the run between two parts or inside one (whose part is then
    not written); every part saved is kept for ``--resume``.
    """
    chunk_sizes = [len(chunk) for chunk in plan.chunks]
    all_requests = sum(chunk_sizes[c] for _, c in todo) * plan.requests
    bar = _progress_bar(total, total - len(todo)) if progress else None
    started, simulated = time.perf_counter(), 0
    shown = [0.0]

    def in_flight(requests):  # a streamed sample's requests so far, shown beside the bar
        now = time.perf_counter()
        if bar is not None and now - shown[0] > 1.0:
            shown[0] = now
            _show_rate(bar, simulated + requests // max(len(plan.variants), 1), now - started, all_requests)
            bar.refresh()

    try:
        with progress_events.listening(in_flight if bar is not None else None):
            for p, c in todo:
                try:
                    rows = run_task(plan, p, c)
                except McsimError as err:
                    raise _refused(plan, p, err, parts_dir) from None
                _keep_part(plan, p, c, rows, parts, parts_dir, fingerprint)
                progress_events.task_done()
                if bar is not None:
                    simulated += chunk_sizes[c] * plan.requests
                    _show_rate(bar, simulated, time.perf_counter() - started, all_requests)
                    bar.update(1)
    except KeyboardInterrupt:
        raise SweepInterrupted(total - len(todo) + sum(1 for t in todo if t in parts), total, parts_dir) from None
    finally:
        if bar is not None:
            bar.close()


def _run_tasks(plan, todo, parts, parts_dir, fingerprint, workers, processes, scheduler, progress, total,
               client=None):
    """Run ``todo`` on a client (``client``, kept open, or a new one for these tasks), saving each part as it
    finishes."""
    # start-up: dask.distributed takes about 1 s to import, and only running tasks needs it
    from dask.distributed import as_completed

    own = client is None
    client, cluster = _client(workers, processes, scheduler) if own else (client, None)
    bar = None
    futures = []
    try:
        chunk_sizes = [len(chunk) for chunk in plan.chunks]
        all_requests = sum(chunk_sizes[c] for _, c in todo) * plan.requests
        keys = {(p, c): f"mcsim-{fingerprint[:12]}-{p}-{c}" for p, c in todo}
        bar = _progress_bar(total, total - len(todo)) if progress else None
        inflight = None
        if bar is not None:  # streamed samples report their requests as they go
            inflight = progress_events.InFlight({keys[t]: chunk_sizes[t[1]] * plan.requests for t in todo},
                                                weight=len(plan.variants))
            client.subscribe_topic(progress_events.TOPIC, inflight)
        plan_future = client.scatter(plan, broadcast=True, hash=False)
        futures = [client.submit(run_task, plan_future, p, c, pure=False, retries=2, key=keys[(p, c)])
                   for p, c in todo]
        started, simulated, shown = time.perf_counter(), 0, 0.0
        # Ctrl-C only sets a flag, checked between results, so a part file is never cut half-written and the
        # client shuts down cleanly.
        with _stop_on_sigint() as stop:
            pending = as_completed(futures, loop=client.loop)
            while not pending.is_empty():
                if stop.is_set():
                    raise KeyboardInterrupt
                batch = pending.next_batch(block=False)
                if not batch:
                    time.sleep(0.02)
                    now = time.perf_counter()
                    if inflight is not None and now - shown > 1.0:
                        shown = now
                        _show_rate(bar, simulated + inflight.requests(), now - started, all_requests)
                        bar.refresh()
                    continue
                for future in batch:
                    p, c = (int(x) for x in future.key.rsplit("-", 2)[1:])
                    try:
                        rows = future.result()
                    except McsimError as err:
                        for f in futures:
                            f.cancel()
                        raise _refused(plan, p, err, parts_dir) from None
                    _keep_part(plan, p, c, rows, parts, parts_dir, fingerprint)
                    future.release()
                    if bar is not None:
                        inflight.finish(future.key)
                        simulated += chunk_sizes[c] * plan.requests
                        _show_rate(bar, simulated, time.perf_counter() - started, all_requests)
                        bar.update(1)
    except KeyboardInterrupt:
        for f in futures:
            f.cancel()
        raise SweepInterrupted(total - len(todo) + sum(1 for t in todo if t in parts), total, parts_dir) from None
    finally:
        if bar is not None:
            bar.close()
        if own:
            client.close()
        if cluster is not None:
            cluster.close()


def _show_rate(bar, requests: int, seconds: float, total: int | None = None) -> None:
    """Requests simulated (requests per sample x samples finished, and what the samples in flight reported), per
    second of this run so far and, given the run's ``total``, the time left at that rate, beside the progress bar
    (tqdm's own estimate counts whole tasks, and a run of one task has none until it ends)."""
    rate = requests / max(seconds, 1e-9)
    left = ""
    if total and 0 < requests < total and rate > 0:
        remaining = int((total - requests) / rate)
        left = f", about {remaining // 3600}:{remaining % 3600 // 60:02d}:{remaining % 60:02d} left"
    bar.set_postfix_str(f"{si(requests)} requests, {si(rate)} requests/s{left}", refresh=False)


def _progress_bar(total: int, done: int, stream=None):
    """A progress bar on ``stream`` (default: stderr) when it is a terminal, else None: a log file or a pipe gets
    no progress frames mixed with the table. It appears once a run has taken two seconds."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        return None

    return tqdm.tqdm(total=total, initial=done, unit="task", desc="mcsim", delay=2.0, leave=False, file=stream)


@contextlib.contextmanager
def _stop_on_sigint():
    """An Event set by Ctrl-C (SIGINT) while the block runs; the default handler elsewhere."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _reads_swept(plan) -> bool:
    """A grid over the fidelity, or over what says whether the hardware's GEMMs are measured, draws every input
    (each grid point reads its own)."""
    return any(axis.path in READS_CHANGING_KEYS for axis in plan.axes)


def make_plan(scn: Scenario, variants, *, axes=(), samples=None, requests=None, seed=None, chunk_size=None,
              workers=None, ablate=False) -> Plan:
    """A :class:`Plan` with the scenario's ``[mc]`` defaults; ``chunk_size`` defaults to about four tasks per
    worker per grid point (at most 64 samples a task)."""
    samples = int(samples or scn["mc.samples"])
    if isinstance(requests, str) and not (requests.strip().isascii() and requests.strip().isdigit()):
        raise McsimError(f"--requests {requests}: only run, compare and sweep grow the requests until steady; give "
                         "a count of requests per sample")
    requests = int(requests or scn["mc.requests"])
    seed = int(scn["mc.seed"] if seed is None else seed)
    workers = int(workers or os.cpu_count() or 1)
    if chunk_size is None:
        chunk_size = int(min(64, max(1, -(-samples // (4 * workers)))))
    specs = one_sample.variant_specs(scn, variants)
    if ablate:
        specs = ablation_variants(scn)
    for axis in axes:
        if not isinstance(axis, Axis):
            raise ScenarioError(scn.source, str(axis), "not a grid axis")
    return Plan(scn, specs, tuple(axes), samples, requests, seed, int(chunk_size), bool(ablate))
