"""Real request traces: read Mooncake JSONL, Azure LLM inference CSV and BurstGPT CSV into one struct of arrays.

A :class:`Trace` holds one row per request, sorted by arrival: arrival time, prompt and output lengths,
and (when the format has them) the chain-hashed ids of the prompt's fixed-size blocks as a CSR
(``block_ptr``, ``block_hashes``). The workload stage can use it instead of its generator.

Formats
-------
``mooncake``
    JSON lines with ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``: the ids of
    the prompt's 512-token blocks, prefix-chained (two requests share an id only if they share the whole
    prefix up to and including that block), so ``len(hash_ids) == ceil(input_length / 512)``.
    Other fields are ignored.
``azure``
    CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps like
    ``2023-11-16 18:17:03.9799600`` (ISO 8601, space or ``T``, up to nanoseconds). No prefix
    information: every request has zero blocks and ``block_tokens`` is None.
``burstgpt``
    CSV with (at least) the columns ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
    (Wang et al., BurstGPT): ``Timestamp`` in seconds, request and response lengths in tokens. Columns are
    found by name, so the later release's extra ``Session ID`` and ``Elapsed time`` columns are accepted;
    ``Model``, ``Total tokens`` and ``Log Type`` are not used. No prefix information. BurstGPT marks a
    *failed* request by 0 response tokens; those rows are dropped (see below).

Conventions
-----------
* ``arrival_s`` counts seconds from the first request, which arrives at 0.
* Rows are sorted by arrival (stably: ties keep file order). Error messages give line numbers in the
  file as written.
* A request with 0 output tokens is counted as 1. The serving system still prefilled its prompt, and
  prefill itself produces the first output token, so the request cost at least one token's work;
  dropping it would lose its prefill load, and downstream stages (decode, speculative passes) count
  at least one token per request. When this happens ``Trace.source`` says how many rows were raised.
  (The bundled traces have none.)
* BurstGPT is different: its authors document 0 response tokens as a failed request and publish
  "without fails" files that are exactly the other rows. A failure may be a rejection before the model
  ran, so its prefill load is unknown; :func:`read_burstgpt` drops these rows by default
  (``failed="keep"`` applies the one-token rule above instead) and ``Trace.source`` says how many. A kept
  BurstGPT request with 0 request tokens is counted as 1 (the model reads at least one position).
* Any other malformed row is an error (:class:`TraceError`) naming ``path:line N``, what was found and
  what was expected.

Bundled traces (see ``mcsim/data/traces/README.md`` for source, licence and attribution) are found with
:func:`bundled_trace_path`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import itertools
import json
import math
import os
import pathlib
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from mcsim.errors import McsimError
from mcsim.fileio import readable_kind
from mcsim.text import shape_of

MOONCAKE_BLOCK_TOKENS = 512
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
FORMATS = ("mooncake", "azure", "burstgpt")
BUNDLED_TRACES = {
    "mooncake": "mooncake_synthetic_trace.jsonl",
    "azure-code": "AzureLLMInferenceTrace_code_2023.csv",
    "azure-conv": "AzureLLMInferenceTrace_conv_2023.csv",
}
_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


#: The longest span of arrival times a trace may have, s (ten years): beyond it a timestamp is an error.
MAX_SPAN_S = 10 * 365.25 * 86400.0
#: Dates that nanosecond timestamps can hold (NumPy datetime64[ns]).
NS_RANGE = (np.datetime64("1678-01-01", "us"), np.datetime64("2262-04-11", "us"))


class TraceError(McsimError, ValueError):
    """A trace file that does not follow its format; the message names the file and the line."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests of a trace as a struct of arrays, one row per request, sorted by arrival.

    Attributes
    ----------
    arrival_s : float64[n]
        Arrival time in seconds from the first request (the first is 0).
    prompt_tokens : int64[n]
        Prompt (input, context) length in tokens.
    output_tokens : int64[n]
        Generated tokens (>= 1).
    block_ptr : int64[n + 1]
        CSR offsets: request ``i``'s block ids are ``block_hashes[block_ptr[i]:block_ptr[i + 1]]``.
        All rows are empty when the format has no prefix information.
    block_hashes : int64[nnz]
        Chain-hashed block ids exactly as the trace gives them.
    block_tokens : int or None
        Tokens per hashed block (512 for Mooncake); None without prefix information.
    source : str
        Provenance: file name and format.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    block_ptr: np.ndarray
    block_hashes: np.ndarray
    block_tokens: int | None
    source: str

    def __post_init__(self) -> None:
        n = self.arrival_s.shape[0]
        for name, dtype, length in [
            ("arrival_s", np.float64, n),
            ("prompt_tokens", np.int64, n),
            ("output_tokens", np.int64, n),
            ("block_ptr", np.int64, n + 1),
            ("block_hashes", np.int64, None),
        ]:
            array = getattr(self, name)
            if array.ndim != 1 or array.dtype != dtype or (length is not None and array.shape[0] != length):
                expected_length = "nnz" if length is None else length
                raise ValueError(
                    f"Trace.{name} must be a one-dimensional {np.dtype(dtype)} array of length "
                    f"{expected_length}, got {array.dtype} with shape {array.shape}"
                )
        if self.block_ptr[0] != 0 or self.block_ptr[-1] != self.block_hashes.shape[0]:
            raise ValueError("Trace.block_ptr must start at 0 and end at len(block_hashes)")
        if np.any(np.diff(self.block_ptr) < 0) or np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("Trace.block_ptr and Trace.arrival_s must be non-decreasing")

    def __len__(self) -> int:
        return self.arrival_s.shape[0]

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self)


def read_trace(path: str | os.PathLike, format: str | None = None) -> Trace:
    """Read a trace file in any supported format.

    Parameters
    ----------
    path : str or path-like
        Trace file.
    format : {"mooncake", "azure", "burstgpt"} or None
        File format; None infers it: ``.jsonl`` is Mooncake, ``.csv`` is BurstGPT when its header names
        BurstGPT's columns and Azure otherwise.

    Returns
    -------
    Trace

    Examples
    --------
    >>> trace = read_trace(bundled_trace_path("azure-code"))
    >>> len(trace), trace.block_tokens
    (8819, None)
    """
    path = pathlib.Path(path)
    kind = readable_kind(path)
    if kind:
        raise TraceError(f"{path}: is {kind}, not a trace file (a regular file)")
    try:
        with path.open("rb") as head:
            magic = head.read(4)
    except OSError as err:
        raise TraceError(f"{path}: cannot read the trace ({err.strerror or err})") from None
    if magic[:2] == b"\x1f\x8b" or magic[:4] in (b"PK\x03\x04", b"\x28\xb5\x2f\xfd") or magic[:3] == b"BZh":
        raise TraceError(f"{path}: a compressed file; decompress it first (traces are read as UTF-8 text)")
    if format is None:
        suffix = path.suffix.lower()
        if suffix == ".jsonl":
            format = "mooncake"
        elif suffix == ".csv":
            format = "burstgpt" if _looks_like_burstgpt(path) else "azure"
        else:
            raise TraceError(
                f"{path}: cannot tell the trace format from the extension {path.suffix!r}; expected .jsonl "
                "(mooncake) or .csv (azure, burstgpt), or set workload.trace_format to mooncake, azure or burstgpt"
            )
    readers = {"mooncake": read_mooncake, "azure": read_azure, "burstgpt": read_burstgpt}
    if format not in readers:
        raise TraceError(f"unknown trace format {format!r}; expected one of {', '.join(FORMATS)}")
    try:
        trace = readers[format](path)
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text (byte {err.start}); traces are UTF-8 JSON lines or CSV") from None
    except RecursionError:
        raise TraceError(f"{path}: a JSON value nested too deeply; expected one flat JSON object per line") from None
    except OSError as err:
        raise TraceError(f"{path}: cannot read the trace ({err.strerror or err})") from None
    if len(trace) and not np.any(trace.prompt_tokens > 0):
        raise TraceError(f"{path}: every request has 0 input tokens; a replay needs prompts (is the input-length "
                         "column the right one?)")
    return trace


def _looks_like_burstgpt(path: pathlib.Path) -> bool:
    """Whether a CSV file's first line names BurstGPT's columns (read only that line)."""
    try:
        with path.open(encoding="utf-8-sig") as lines:
            header = lines.readline(1 << 16)
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text (byte {err.start}); traces are UTF-8 JSON lines or CSV") from None
    names = {name.strip() for name in header.split(",")}
    return {"Timestamp", "Request tokens", "Response tokens"} <= names


def bundled_trace_path(name: str) -> pathlib.Path:
    """Path of a trace shipped with mcsim.

    Parameters
    ----------
    name : {"mooncake", "azure-code", "azure-conv"}
        Mooncake FAST'25 synthetic trace, Azure LLM inference 2023 code or conversation trace.

    Returns
    -------
    pathlib.Path
        The file inside the installed package (source and licence: ``mcsim/data/traces/README.md``).

    Examples
    --------
    >>> bundled_trace_path("mooncake").name
    'mooncake_synthetic_trace.jsonl'
    """
    if name not in BUNDLED_TRACES:
        close = difflib.get_close_matches(name, BUNDLED_TRACES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TraceError(f"bundled:{name}: no bundled trace {name!r}{hint}; expected one of "
                         + ", ".join(f"bundled:{n}" for n in BUNDLED_TRACES))
    resource = importlib.resources.files("mcsim.data").joinpath("traces", BUNDLED_TRACES[name])
    return pathlib.Path(str(resource))


# --- Mooncake ------------------------------------------------------------------------------------


def read_mooncake(path: str | os.PathLike) -> Trace:
    """Read a Mooncake JSONL trace (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``).

    Parameters
    ----------
    path : str or path-like
        JSON-lines file, one request object per line; blank lines are skipped.

    Returns
    -------
    Trace
        With ``block_tokens == 512`` and the ``hash_ids`` of each request as its CSR row.

    Raises
    ------
    TraceError
        Invalid JSON, a missing field, a non-integer or negative length, a bad timestamp, or
        ``len(hash_ids) != ceil(input_length / 512)``; the message names ``path:line N``.

    Examples
    --------
    >>> trace = read_mooncake(bundled_trace_path("mooncake"))
    >>> len(trace), trace.block_tokens, round(float(trace.prompt_tokens.mean()))
    (3993, 512, 15325)
    """
    path = pathlib.Path(path)
    records = []
    line_numbers = []
    with path.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise TraceError(
                    f"{path}:line {line_number}: invalid JSON ({error.msg}, column {error.colno}); "
                    "expected one JSON object per line"
                ) from None
            line_numbers.append(line_number)
    if not records:
        raise TraceError(f"{path}: no requests; expected one JSON object per line with {', '.join(MOONCAKE_FIELDS)}")

    columns = _mooncake_columns(records)
    if columns is None:
        _diagnose_mooncake(path, records, line_numbers)
    timestamp_ms, prompt_tokens, output_tokens, block_counts, block_hashes = columns
    expected_blocks = -(-prompt_tokens // MOONCAKE_BLOCK_TOKENS)
    if (
        not np.all(np.isfinite(timestamp_ms))
        or np.any(timestamp_ms < 0)
        or np.any(prompt_tokens < 0)
        or np.any(output_tokens < 0)
        or np.any(block_counts != expected_blocks)
    ):
        _diagnose_mooncake(path, records, line_numbers)

    block_ptr = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(block_counts, out=block_ptr[1:])
    return _finish(
        path,
        "mooncake",
        (timestamp_ms - timestamp_ms.min()) / 1000.0,
        prompt_tokens,
        output_tokens,
        block_ptr,
        block_hashes,
        MOONCAKE_BLOCK_TOKENS,
    )


def _mooncake_columns(records: list):
    """Columns as arrays when every record has the right fields and types, else None.

    Types are checked on whole columns (a set of Python types per column); range checks follow in
    NumPy. Anything unusual sends the caller to the record-by-record diagnosis.
    """
    if set(map(type, records)) != {dict}:
        return None
    try:
        timestamps = [record["timestamp"] for record in records]
        inputs = [record["input_length"] for record in records]
        outputs = [record["output_length"] for record in records]
        hash_lists = [record["hash_ids"] for record in records]
    except KeyError:
        return None
    if not set(map(type, timestamps)) <= {int, float}:
        return None
    if not (set(map(type, inputs)) <= {int} and set(map(type, outputs)) <= {int}):
        return None
    if not set(map(type, hash_lists)) <= {list}:
        return None
    flat_hashes = list(itertools.chain.from_iterable(hash_lists))
    if not set(map(type, flat_hashes)) <= {int}:
        return None
    try:
        timestamp_ms = np.array(timestamps, dtype=np.float64)
        prompt_tokens = np.array(inputs, dtype=np.int64)
        output_tokens = np.array(outputs, dtype=np.int64)
        block_hashes = np.array(flat_hashes, dtype=np.int64)
    except OverflowError:
        return None
    block_counts = np.fromiter(map(len, hash_lists), dtype=np.int64, count=len(hash_lists))
    return timestamp_ms, prompt_tokens, output_tokens, block_counts, block_hashes


def _diagnose_mooncake(path: pathlib.Path, records: list, line_numbers: list[int]) -> NoReturn:
    """Raise :class:`TraceError` for the first malformed record (slow; only on the error path)."""
    for record, line_number in zip(records, line_numbers):
        where = f"{path}:line {line_number}"
        if not isinstance(record, dict):
            raise TraceError(
                f"{where}: got a JSON {type(record).__name__}; expected an object with fields "
                f"{', '.join(MOONCAKE_FIELDS)}"
            )
        for field in MOONCAKE_FIELDS:
            if field not in record:
                raise TraceError(f"{where}: missing field {field!r}; expected fields {', '.join(MOONCAKE_FIELDS)}")
        timestamp = record["timestamp"]
        if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)) or not (
            math.isfinite(timestamp) and timestamp >= 0
        ):
            raise TraceError(f"{where}: timestamp is {shape_of(timestamp)}; expected a non-negative number of milliseconds")
        for field in ("input_length", "output_length"):
            _check_count(record[field], f"{where}: {field}")
        hash_ids = record["hash_ids"]
        if not isinstance(hash_ids, list):
            raise TraceError(f"{where}: hash_ids is {shape_of(hash_ids)}; expected a list of integer block ids")
        for block_id in hash_ids:
            if type(block_id) is not int or not _INT64_MIN <= block_id <= _INT64_MAX:
                raise TraceError(f"{where}: hash_ids contains {shape_of(block_id)}; expected 64-bit integer block ids")
        expected_blocks = -(-record["input_length"] // MOONCAKE_BLOCK_TOKENS)
        if len(hash_ids) != expected_blocks:
            raise TraceError(
                f"{where}: {len(hash_ids)} hash_ids for input_length {record['input_length']}; expected "
                f"ceil(input_length / {MOONCAKE_BLOCK_TOKENS}) = {expected_blocks}"
            )
    # The vectorised checks only call this when some record is malformed, so this line is a guard.
    raise TraceError(f"{path}: malformed records; expected fields {', '.join(MOONCAKE_FIELDS)}")


def _check_count(value, what: str) -> None:
    if type(value) is not int or not 0 <= value <= _INT64_MAX:
        raise TraceError(f"{what} is {shape_of(value)}; expected a non-negative integer")


# --- Azure ---------------------------------------------------------------------------------------


def read_azure(path: str | os.PathLike) -> Trace:
    """Read an Azure LLM inference CSV trace (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Parameters
    ----------
    path : str or path-like
        CSV file with exactly that header; blank lines are skipped. Parsed column-wise with NumPy.

    Returns
    -------
    Trace
        Without prefix information (every ``block_ptr`` row empty, ``block_tokens`` None).

    Raises
    ------
    TraceError
        A wrong header, a row without exactly three fields, an unparsable timestamp, or a non-integer
        or negative token count; the message names ``path:line N``.

    Examples
    --------
    >>> trace = read_azure(bundled_trace_path("azure-conv"))
    >>> len(trace), round(float(trace.output_tokens.mean()))
    (19366, 211)
    """
    path = pathlib.Path(path)
    _, fields, line_numbers = _csv_fields(path, AZURE_HEADER, require_exact=True)
    timestamps = _parse_timestamps(path, fields[:, 0], line_numbers)
    prompt_tokens = _parse_counts(path, fields[:, 1], line_numbers, AZURE_HEADER[1])
    output_tokens = _parse_counts(path, fields[:, 2], line_numbers, AZURE_HEADER[2])
    arrival_ns = (timestamps - timestamps.min()).astype(np.int64)
    return _finish(
        path,
        "azure",
        arrival_ns / 1e9,
        prompt_tokens,
        output_tokens,
        np.zeros(prompt_tokens.shape[0] + 1, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        None,
    )


def _csv_fields(path: pathlib.Path, columns: tuple, require_exact: bool):
    """Header, fields (str[rows, width], stripped) and file line numbers of a plain CSV trace.

    ``require_exact``: the header must be ``columns`` in order; otherwise it must contain them in any order.
    Blank lines are skipped; every other row must have as many fields as the header. Parsed column-wise
    with NumPy (the formats have no quoting).
    """
    # utf-8-sig: tolerate the byte-order mark that spreadsheet exports put before the header.
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    header = [name.strip() for name in lines[0].split(",")] if lines else []
    # described by its shape, never echoed: a file given by mistake (a key, a password list) stays unprinted
    known = [name for name in header if name in columns]
    found = (f"a first line of {len(header)} comma-separated field{'' if len(header) == 1 else 's'}, "
             + (f"of which {len(known)} {'is a column' if len(known) == 1 else 'are columns'} of the format"
                if known else "none of them a column of the format, so not the header")) if lines else "an empty file"
    if require_exact and header != list(columns):
        order = " (the same names in another order)" if sorted(header) == sorted(columns) else ""
        raise TraceError(f"{path}:line 1: {found}{order}; expected the header {','.join(columns)!r}")
    missing = [name for name in columns if name not in header]
    if missing:
        raise TraceError(
            f"{path}:line 1: {found}, without {', '.join(map(repr, missing))}; expected columns "
            f"{','.join(columns)!r}"
        )
    expected_row = ",".join(header)

    body = np.array(lines[1:], dtype=str)
    nonblank = np.flatnonzero(np.char.str_len(np.char.strip(body)) > 0)
    if nonblank.size == 0:
        raise TraceError(f"{path}: no requests after the header; expected rows of {expected_row}")
    body = body[nonblank]
    line_numbers = nonblank + 2  # file lines are 1-based and the header is line 1

    field_counts = np.char.count(body, ",") + 1
    wrong_width = np.flatnonzero(field_counts != len(header))
    if wrong_width.size:
        row = wrong_width[0]
        raise TraceError(
            f"{path}:line {line_numbers[row]}: {field_counts[row]} fields; expected {len(header)} ({expected_row})"
        )
    fields = np.char.strip(np.array(",".join(body.tolist()).split(","), dtype=str).reshape(-1, len(header)))
    return header, fields, line_numbers


def _parse_timestamps(path: pathlib.Path, column: np.ndarray, line_numbers: np.ndarray) -> np.ndarray:
    expectation = "expected a date and time like '2023-11-16 18:17:03.9799600'"
    try:  # parsed at microseconds (a range of 290,000 years) so a date nanoseconds cannot hold is caught, not wrapped
        wide = column.astype("datetime64[us]")
    except ValueError:
        wide = None
    if wide is not None:
        bad = np.flatnonzero(~np.isnat(wide) & ((wide < NS_RANGE[0]) | (wide > NS_RANGE[1])))
        if bad.size:
            row = bad[0]
            raise TraceError(f"{path}:line {line_numbers[row]}: TIMESTAMP is a date outside "
                             f"{NS_RANGE[0]} .. {NS_RANGE[1]}; {expectation}")
    try:
        timestamps = column.astype("datetime64[ns]")
    except ValueError:
        for text, line_number in zip(column.tolist(), line_numbers.tolist()):
            try:
                np.datetime64(text, "ns")
            except ValueError:
                raise TraceError(f"{path}:line {line_number}: TIMESTAMP is {shape_of(text, csv_field=True)}; {expectation}") from None
        raise
    missing = np.flatnonzero(np.isnat(timestamps))
    if missing.size:
        row = missing[0]
        raise TraceError(f"{path}:line {line_numbers[row]}: TIMESTAMP is {shape_of(str(column[row]), csv_field=True)}; {expectation}")
    return timestamps


def _parse_counts(path: pathlib.Path, column: np.ndarray, line_numbers: np.ndarray, name: str) -> np.ndarray:
    expectation = "expected a non-negative integer"
    try:
        counts = column.astype(np.int64)
    except (ValueError, OverflowError):
        for text, line_number in zip(column.tolist(), line_numbers.tolist()):
            try:
                np.array([text]).astype(np.int64)
            except (ValueError, OverflowError):
                raise TraceError(f"{path}:line {line_number}: {name} is {shape_of(text, csv_field=True)}; {expectation}") from None
        raise
    negative = np.flatnonzero(counts < 0)
    if negative.size:
        row = negative[0]
        raise TraceError(f"{path}:line {line_numbers[row]}: {name} is {shape_of(str(column[row]), csv_field=True)}; {expectation}")
    return counts


# --- BurstGPT ------------------------------------------------------------------------------------


def read_burstgpt(path: str | os.PathLike, failed: str = "drop") -> Trace:
    """Read a BurstGPT CSV trace (``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``).

    Parameters
    ----------
    path : str or path-like
        CSV file whose header holds at least those columns, in any order (extra columns such as
        ``Session ID`` and ``Elapsed time`` are accepted and ignored); blank lines are skipped.
    failed : {"drop", "keep"}
        Rows with 0 response tokens are failed requests. ``"drop"`` (default) leaves them out, as the
        authors' "without fails" files do; ``"keep"`` keeps them as one-token requests.

    Returns
    -------
    Trace
        Without prefix information (every ``block_ptr`` row empty, ``block_tokens`` None); arrivals in
        seconds from the first kept request.

    Raises
    ------
    TraceError
        A header without the required columns, a row with a different number of fields than the header,
        a timestamp that is not a finite non-negative number of seconds, a token count that is not a
        non-negative integer, or no request left; the message names ``path:line N``.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "burst.csv"
    >>> _ = path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\\n"
    ...                     "5,ChatGPT,472,18,490,Conversation log\\n9,GPT-4,300,0,300,API log\\n")
    >>> trace = read_burstgpt(path)
    >>> trace.prompt_tokens.tolist(), trace.source
    ([472], 'burst.csv (burstgpt); 1 failed requests (0 response tokens) dropped')
    """
    if failed not in ("drop", "keep"):
        raise ValueError(f"failed must be 'drop' or 'keep', got {failed!r}")
    path = pathlib.Path(path)
    header, fields, line_numbers = _csv_fields(path, BURSTGPT_COLUMNS, require_exact=False)
    column = {name: header.index(name) for name in BURSTGPT_COLUMNS}
    seconds = _parse_seconds(path, fields[:, column["Timestamp"]], line_numbers, "Timestamp")
    prompt_tokens = _parse_counts(path, fields[:, column["Request tokens"]], line_numbers, "Request tokens")
    output_tokens = _parse_counts(path, fields[:, column["Response tokens"]], line_numbers, "Response tokens")

    notes = []
    failures = output_tokens == 0
    if failed == "drop" and failures.any():
        keep = ~failures
        if not keep.any():
            raise TraceError(
                f"{path}: all {failures.size} requests failed (0 response tokens); nothing left to replay "
                "(read with failed='keep' to count them as one-token requests)"
            )
        seconds, prompt_tokens, output_tokens = seconds[keep], prompt_tokens[keep], output_tokens[keep]
        notes.append(f"{int(failures.sum())} failed requests (0 response tokens) dropped")
    empty_prompts = int(np.count_nonzero(prompt_tokens == 0))
    if empty_prompts:
        prompt_tokens = np.maximum(prompt_tokens, 1)
        notes.append(f"{empty_prompts} requests with 0 request tokens counted as 1")
    trace = _finish(
        path,
        "burstgpt",
        seconds - seconds.min(),
        prompt_tokens,
        output_tokens,
        np.zeros(prompt_tokens.shape[0] + 1, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        None,
    )
    if not notes:
        return trace
    name, _, rest = trace.source.partition(";")
    source = "; ".join([name, *notes] + ([rest.strip()] if rest else []))
    return dataclasses.replace(trace, source=source)


def _parse_seconds(path: pathlib.Path, column: np.ndarray, line_numbers: np.ndarray, name: str) -> np.ndarray:
    expectation = "expected a non-negative number of seconds"
    try:
        seconds = column.astype(np.float64)
    except ValueError:
        for text, line_number in zip(column.tolist(), line_numbers.tolist()):
            try:
                float(text)
            except ValueError:
                raise TraceError(f"{path}:line {line_number}: {name} is {shape_of(text, csv_field=True)}; {expectation}") from None
        raise
    bad = np.flatnonzero(~np.isfinite(seconds) | (seconds < 0))
    if bad.size:
        row = bad[0]
        raise TraceError(f"{path}:line {line_numbers[row]}: {name} is {shape_of(str(column[row]), csv_field=True)}; {expectation}")
    return seconds


# --- shared --------------------------------------------------------------------------------------


def _finish(path, format_name, arrival_s, prompt_tokens, output_tokens, block_ptr, block_hashes, block_tokens):
    """Raise zero outputs to one token, sort by arrival (stably) and build the Trace."""
    source = f"{path.name} ({format_name})"
    span = float(np.max(arrival_s) - np.min(arrival_s)) if len(arrival_s) else 0.0
    if not span <= MAX_SPAN_S:
        raise TraceError(f"{path}: the requests span {span:.3g} s, more than {MAX_SPAN_S:.3g} s (ten years): a "
                         f"timestamp far from the others (request {int(np.argmax(arrival_s)) + 1} in file order), or "
                         "in other units than the format's")
    zero_outputs = int(np.count_nonzero(output_tokens == 0))
    if zero_outputs:
        output_tokens = np.maximum(output_tokens, 1)
        source += f"; {zero_outputs} requests with 0 output tokens counted as 1"
    if np.any(np.diff(arrival_s) < 0):
        order = np.argsort(arrival_s, kind="stable")
        arrival_s = arrival_s[order]
        prompt_tokens = prompt_tokens[order]
        output_tokens = output_tokens[order]
        block_ptr, block_hashes = _reorder_rows(block_ptr, block_hashes, order)
    return Trace(
        arrival_s=np.ascontiguousarray(arrival_s, dtype=np.float64),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        block_ptr=block_ptr,
        block_hashes=block_hashes,
        block_tokens=block_tokens,
        source=source,
    )


def _reorder_rows(block_ptr: np.ndarray, block_hashes: np.ndarray, order: np.ndarray):
    """CSR rows taken in ``order``."""
    counts = np.diff(block_ptr)[order]
    new_ptr = np.zeros_like(block_ptr)
    np.cumsum(counts, out=new_ptr[1:])
    # Element e of new row i comes from old position block_ptr[order[i]] + (e - new_ptr[i]).
    shift = np.repeat(block_ptr[:-1][order] - new_ptr[:-1], counts)
    return new_ptr, block_hashes[np.arange(new_ptr[-1]) + shift]
