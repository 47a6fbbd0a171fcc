"""Trace readers: published figures of the bundled traces, the Mooncake block chain, malformed files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mcsim.stages.requests_trace import (
    BUNDLED_TRACES,
    Trace,
    TraceError,
    bundled_trace_path,
    read_azure,
    read_burstgpt,
    read_mooncake,
    read_trace,
)

AZURE_HEADER_LINE = "TIMESTAMP,ContextTokens,GeneratedTokens"


@pytest.fixture(scope="module")
def mooncake():
    return read_trace(bundled_trace_path("mooncake"))


@pytest.fixture(scope="module")
def azure_code():
    return read_trace(bundled_trace_path("azure-code"))


@pytest.fixture(scope="module")
def azure_conv():
    return read_trace(bundled_trace_path("azure-conv"))


def mooncake_line(timestamp=0, input_length=1000, output_length=5, hash_ids=None, drop=None):
    record = {
        "timestamp": timestamp,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": list(range(math.ceil(input_length / 512))) if hash_ids is None else hash_ids,
    }
    if drop:
        del record[drop]
    return json.dumps(record)


def write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- published figures ---------------------------------------------------------------------------


def test_mooncake_matches_fast25_table_2(mooncake):
    # Qin et al. FAST'25, Table 2: synthetic trace, average input 15,325 and average output 149 tokens.
    assert len(mooncake) == 3993
    assert round(float(mooncake.prompt_tokens.mean())) == 15325
    assert round(float(mooncake.output_tokens.mean())) == 149
    assert mooncake.block_tokens == 512
    np.testing.assert_array_equal(np.diff(mooncake.block_ptr), -(-mooncake.prompt_tokens // 512))


@pytest.mark.parametrize(
    ("fixture", "requests", "mean_context", "mean_generated"),
    [("azure_code", 8819, 2048, 28), ("azure_conv", 19366, 1155, 211)],
)
def test_azure_matches_published_means(fixture, requests, mean_context, mean_generated, request):
    trace = request.getfixturevalue(fixture)
    assert len(trace) == requests
    assert round(float(trace.prompt_tokens.mean())) == mean_context
    assert round(float(trace.output_tokens.mean())) == mean_generated
    assert trace.block_tokens is None
    assert trace.block_hashes.size == 0
    np.testing.assert_array_equal(trace.block_ptr, 0)


def test_azure_arrivals_span_about_an_hour(azure_code, azure_conv):
    # First and last rows of the code file: 18:17:03.9799600 and 19:14:19.9280160.
    assert azure_code.arrival_s[-1] == pytest.approx(3435.948056, abs=1e-6)
    assert azure_code.arrival_s[1] == pytest.approx(0.052, abs=1e-9)
    assert 3000 < azure_conv.arrival_s[-1] < 3700


def test_mooncake_arrivals_are_milliseconds(mooncake):
    # First rows: timestamps 0, 0, 40 ms; the last is 1,022,025 ms.
    np.testing.assert_allclose(mooncake.arrival_s[:3], [0.0, 0.0, 0.04])
    assert mooncake.arrival_s[-1] == pytest.approx(1022.025)


@pytest.mark.parametrize("name", sorted(BUNDLED_TRACES))
def test_arrivals_sorted_from_zero(name):
    trace = read_trace(bundled_trace_path(name))
    assert trace.arrival_s[0] == 0.0
    assert np.all(np.diff(trace.arrival_s) >= 0)
    assert np.all(trace.output_tokens >= 1)
    assert trace.source.startswith(bundled_trace_path(name).name)


def test_mooncake_block_chain_property(mooncake):
    # Prefix-chained ids: a block id always sits at the same position after the same predecessor, so
    # requests sharing an id share every earlier id (by induction over positions).
    counts = np.diff(mooncake.block_ptr)
    position = np.arange(mooncake.block_hashes.size) - np.repeat(mooncake.block_ptr[:-1], counts)
    predecessor = np.where(position > 0, np.roll(mooncake.block_hashes, 1), -1)
    triples = np.unique(np.stack([mooncake.block_hashes, position, predecessor]), axis=1)
    ids, occurrences = np.unique(triples[0], return_counts=True)
    assert ids.size < mooncake.block_hashes.size  # the trace does reuse blocks
    assert np.all(occurrences == 1)


def test_mooncake_block_chain_pairwise_on_shared_ids(mooncake):
    # The same property stated literally, for every pair of requests sharing their last shared id.
    rows = [
        mooncake.block_hashes[mooncake.block_ptr[i] : mooncake.block_ptr[i + 1]].tolist() for i in range(len(mooncake))
    ]
    first_seen: dict[int, tuple[int, int]] = {}
    for request, ids in enumerate(rows):
        for position, block_id in enumerate(ids):
            if block_id in first_seen:
                other, other_position = first_seen[block_id]
                assert other_position == position
                assert rows[other][: position + 1] == ids[: position + 1]
            else:
                first_seen[block_id] = (request, position)


def test_mooncake_prefix_reuse_near_published_cache_ratio(mooncake):
    # FAST'25 Table 2 gives a 66 % cache ratio. With an unbounded cache and exact leading-block reuse,
    # the token fraction of prompts found cached comes out at 65.1 %; a misread CSR or block order
    # would move it far away.
    seen: set[int] = set()
    cached_tokens = 0
    for request in range(len(mooncake)):
        ids = mooncake.block_hashes[mooncake.block_ptr[request] : mooncake.block_ptr[request + 1]].tolist()
        leading = 0
        while leading < len(ids) and ids[leading] in seen:
            leading += 1
        cached_tokens += min(leading * 512, int(mooncake.prompt_tokens[request]))
        seen.update(ids)
    assert cached_tokens / mooncake.prompt_tokens.sum() == pytest.approx(0.66, abs=0.015)


# --- reading small files -------------------------------------------------------------------------


def test_mooncake_unsorted_rows_are_sorted_with_their_blocks(tmp_path):
    path = write(
        tmp_path,
        "t.jsonl",
        [
            mooncake_line(timestamp=3000, input_length=600, hash_ids=[7, 8]),
            "",
            mooncake_line(timestamp=1000, input_length=100, output_length=2, hash_ids=[5]),
            # Unknown fields are ignored.
            json.dumps({"timestamp": 2000, "input_length": 1100, "output_length": 4, "hash_ids": [7, 9, 10], "x": 1}),
        ],
    )
    trace = read_mooncake(path)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 1.0, 2.0])
    assert trace.prompt_tokens.tolist() == [100, 1100, 600]
    assert trace.output_tokens.tolist() == [2, 4, 5]
    assert trace.block_ptr.tolist() == [0, 1, 4, 6]
    assert trace.block_hashes.tolist() == [5, 7, 9, 10, 7, 8]
    assert trace.source == "t.jsonl (mooncake)"


def test_azure_small_file(tmp_path):
    path = write(
        tmp_path,
        "a.csv",
        [
            AZURE_HEADER_LINE,
            "2023-11-16 18:17:04.0000000,10,3",
            "2023-11-16 18:17:03.5000000,20,0",
            "",
            "2023-11-16T18:18:03.5,30,7",
        ],
    )
    trace = read_azure(path)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 0.5, 60.0])
    assert trace.prompt_tokens.tolist() == [20, 10, 30]
    # A request that generated nothing still had its prompt prefilled: counted as one token.
    assert trace.output_tokens.tolist() == [1, 3, 7]
    assert "1 requests with 0 output tokens counted as 1" in trace.source


def test_read_trace_by_extension_and_format(tmp_path):
    jsonl = write(tmp_path, "x.jsonl", [mooncake_line()])
    csv = write(tmp_path, "x.csv", [AZURE_HEADER_LINE, "2023-11-16 18:17:04,10,3"])
    other = write(tmp_path, "x.txt", [mooncake_line()])
    assert read_trace(jsonl).block_tokens == 512
    assert read_trace(csv).block_tokens is None
    assert read_trace(other, format="mooncake").prompt_tokens.tolist() == [1000]
    with pytest.raises(ValueError, match="extension"):
        read_trace(other)
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(jsonl, format="sharegpt")


def test_bundled_trace_path():
    for name, file_name in BUNDLED_TRACES.items():
        path = bundled_trace_path(name)
        assert path.name == file_name and path.is_file()
        assert "shared" not in path.parts
    with pytest.raises(ValueError, match="did you mean 'azure-code'"):
        bundled_trace_path("azure_code")


def test_trace_rejects_inconsistent_arrays():
    with pytest.raises(ValueError, match="block_ptr"):
        Trace(
            arrival_s=np.zeros(2),
            prompt_tokens=np.ones(2, np.int64),
            output_tokens=np.ones(2, np.int64),
            block_ptr=np.zeros(2, np.int64),
            block_hashes=np.zeros(0, np.int64),
            block_tokens=None,
            source="test",
        )


# --- malformed files: the error names the line ----------------------------------------------------


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected an object"),
        (mooncake_line(drop="output_length"), "missing field 'output_length'"),
        (mooncake_line(drop="hash_ids"), "missing field 'hash_ids'"),
        (mooncake_line(input_length=1000.5, hash_ids=[1, 2]), "input_length is 1000.5; expected a non-negative integer"),
        (mooncake_line(output_length="7"), "output_length is a text of 1 character; expected a non-negative integer"),
        (mooncake_line(output_length=-1), "output_length is -1; expected a non-negative integer"),
        (mooncake_line(output_length=True), "output_length is a boolean"),
        (mooncake_line(input_length=2**70, hash_ids=[]), "input_length"),
        (mooncake_line(timestamp="noon"), "timestamp is a text of 4 characters; expected a non-negative number of milliseconds"),
        (mooncake_line(timestamp=-5), "timestamp is -5"),
        (mooncake_line(hash_ids=[1, "2"]), "hash_ids contains a text of 1 character"),
        (mooncake_line(hash_ids=3), "hash_ids is 3"),
        (mooncake_line(input_length=1025, hash_ids=[1, 2]), r"2 hash_ids for input_length 1025; expected .* = 3"),
        (mooncake_line(input_length=512, hash_ids=[1, 2]), r"expected ceil\(input_length / 512\) = 1"),
    ],
)
def test_mooncake_errors_name_the_line(tmp_path, bad_line, message):
    path = write(tmp_path, "bad.jsonl", [mooncake_line(), "", mooncake_line(timestamp=5), bad_line, mooncake_line()])
    with pytest.raises(TraceError, match=rf"bad\.jsonl:line 4: .*{message}"):
        read_mooncake(path)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("2023-11-16 18:17:05.1,10", "2 fields; expected 3"),
        ("2023-11-16 18:17:05.1,10,3,4", "4 fields; expected 3"),
        ("yesterday,10,3", "TIMESTAMP is a text of 9 characters; expected a date and time"),
        ("NaT,10,3", "TIMESTAMP is a text of 3 characters"),
        ("2023-11-16 18:17:05.1,ten,3", "ContextTokens is a text of 3 characters; expected a non-negative integer"),
        ("2023-11-16 18:17:05.1,10.5,3", "ContextTokens is the number 10.5"),
        ("2023-11-16 18:17:05.1,10,-3", "GeneratedTokens is the number -3; expected a non-negative integer"),
        ("2023-11-16 18:17:05.1,10,", "GeneratedTokens is an empty text"),
    ],
)
def test_azure_errors_name_the_line(tmp_path, bad_line, message):
    path = write(
        tmp_path,
        "bad.csv",
        [AZURE_HEADER_LINE, "2023-11-16 18:17:04.0,10,3", "", "2023-11-16 18:17:05.0,11,4", bad_line],
    )
    with pytest.raises(TraceError, match=rf"bad\.csv:line 5: .*{message}"):
        read_azure(path)


@pytest.mark.parametrize(
    "header", ["TIMESTAMP,ContextTokens", "timestamp,ContextTokens,GeneratedTokens", "2023-11-16 18:17:04,1,2"]
)
def test_azure_wrong_header(tmp_path, header):
    path = write(tmp_path, "bad.csv", [header, "2023-11-16 18:17:04.0,10,3"])
    expected = r"bad\.csv:line 1: a first line of \d comma-separated fields.*; expected the header " \
               r"'TIMESTAMP,ContextTokens,GeneratedTokens'"
    with pytest.raises(TraceError, match=expected):
        read_azure(path)


@pytest.mark.parametrize("content", ["SECRET-TOKEN-abc123,xyz\n", "password = hunter2\nSECRET\n",
                                     '{"api_key": "SECRET-TOKEN-abc123"}\n'])
@pytest.mark.parametrize("fmt", ["azure", "burstgpt", "mooncake"])
def test_a_file_that_is_not_a_trace_is_described_not_echoed(tmp_path, content, fmt):
    path = tmp_path / "key.txt"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        read_trace(path, format=fmt)
    message = str(info.value)
    assert str(path) in message and "expected" in message
    for secret in ("SECRET", "abc123", "hunter2", "xyz", "api_key"):
        assert secret not in message, message


def test_empty_traces_are_errors(tmp_path):
    with pytest.raises(TraceError, match="no requests"):
        read_mooncake(write(tmp_path, "empty.jsonl", ["", "  "]))
    with pytest.raises(TraceError, match="no requests"):
        read_azure(write(tmp_path, "empty.csv", [AZURE_HEADER_LINE]))
    with pytest.raises(TraceError, match="line 1: a first line of 1 comma-separated field, none of them"):
        read_azure(write(tmp_path, "blank.csv", [""]))



# --- BurstGPT ------------------------------------------------------------------------------------
# No BurstGPT file is bundled (the public repository stores its data as Git LFS objects); these tests use
# hand-made files in the published layout.

BURSTGPT_HEADER_LINE = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def test_burstgpt_small_file_drops_failed_requests(tmp_path):
    path = write(
        tmp_path,
        "b.csv",
        [
            BURSTGPT_HEADER_LINE,
            "12,ChatGPT,472,18,490,Conversation log",
            "",
            "10.5,GPT-4,300,0,300,API log",  # failed: dropped, and the clock starts at the first kept request
            "30,ChatGPT,0,0,0,Conversation log",  # failed
            "20,GPT-4,1087,230,1317,API log",
            "25,ChatGPT,0,7,7,API log",  # kept; an empty prompt counts as one token
        ],
    )
    trace = read_burstgpt(path)
    np.testing.assert_allclose(trace.arrival_s, [0.0, 8.0, 13.0])
    assert trace.prompt_tokens.tolist() == [472, 1087, 1]
    assert trace.output_tokens.tolist() == [18, 230, 7]
    assert trace.block_tokens is None and trace.block_hashes.size == 0
    np.testing.assert_array_equal(trace.block_ptr, 0)
    assert trace.source == (
        "b.csv (burstgpt); 2 failed requests (0 response tokens) dropped; 1 requests with 0 request tokens counted as 1"
    )


def test_burstgpt_keep_failed_counts_them_as_one_token(tmp_path):
    path = write(tmp_path, "b.csv", [BURSTGPT_HEADER_LINE, "5,ChatGPT,40,0,40,API log", "6,GPT-4,50,3,53,API log"])
    trace = read_burstgpt(path, failed="keep")
    assert trace.output_tokens.tolist() == [1, 3]
    np.testing.assert_allclose(trace.arrival_s, [0.0, 1.0])
    assert "1 requests with 0 output tokens counted as 1" in trace.source
    with pytest.raises(ValueError, match="failed must be 'drop' or 'keep'"):
        read_burstgpt(path, failed="ignore")


def test_burstgpt_columns_found_by_name(tmp_path):
    # The later release inserts Session ID and Elapsed time after Timestamp; a positional reader would read
    # the session id as the model and the elapsed time as the request length.
    path = write(
        tmp_path,
        "b3.csv",
        [
            "\ufeffTimestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type",
            "100,abc,2.5,ChatGPT,80,20,100,Conversation log",
            "101,,,GPT-4,90,10,100,API log",
        ],
    )
    trace = read_burstgpt(path)
    assert trace.prompt_tokens.tolist() == [80, 90]
    assert trace.output_tokens.tolist() == [20, 10]


def test_burstgpt_stats_match_a_plain_csv_reading(tmp_path):
    # A few hundred rows in the published layout (heavy-tailed lengths, ~3 % failures, bursty arrivals),
    # read by the NumPy reader and by the csv module row by row.
    import csv

    rng = np.random.default_rng(11)
    n = 400
    seconds = np.cumsum(rng.gamma(0.25, 8.0, n)).round(0).astype(int)
    requests = rng.lognormal(6.0, 1.0, n).astype(int)
    responses = np.where(rng.random(n) < 0.03, 0, rng.lognormal(5.0, 0.8, n).astype(int) + 1)
    models = rng.choice(["ChatGPT", "GPT-4"], n)
    kinds = rng.choice(["Conversation log", "API log"], n)
    rows = [f"{t},{m},{q},{r},{q + r},{k}" for t, m, q, r, k in zip(seconds, models, requests, responses, kinds)]
    path = write(tmp_path, "sample.csv", [BURSTGPT_HEADER_LINE, *rows])

    kept = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if int(row["Response tokens"]) > 0:
                kept.append((float(row["Timestamp"]), max(int(row["Request tokens"]), 1), int(row["Response tokens"])))
    kept.sort(key=lambda item: item[0])
    trace = read_trace(path)  # the header tells BurstGPT from Azure
    assert trace.source.startswith("sample.csv (burstgpt)")
    assert len(trace) == len(kept)
    assert f"{n - len(kept)} failed requests" in trace.source
    assert trace.prompt_tokens.sum() == sum(item[1] for item in kept)
    assert trace.output_tokens.sum() == sum(item[2] for item in kept)
    assert trace.arrival_s[-1] == pytest.approx(kept[-1][0] - kept[0][0])
    assert float(trace.prompt_tokens.mean()) == pytest.approx(np.mean([item[1] for item in kept]), rel=1e-12)


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("40,ChatGPT,10,3,13", "5 fields; expected 6"),
        ("40,ChatGPT,10,3,13,API log,x", "7 fields; expected 6"),
        ("noon,ChatGPT,10,3,13,API log", "Timestamp is a text of 4 characters; expected a non-negative number of seconds"),
        ("-1,ChatGPT,10,3,13,API log", "Timestamp is the number -1"),
        ("nan,ChatGPT,10,3,13,API log", "Timestamp is the number nan"),
        ("inf,ChatGPT,10,3,13,API log", "Timestamp is the number inf"),
        ("40,ChatGPT,ten,3,13,API log", "Request tokens is a text of 3 characters; expected a non-negative integer"),
        ("40,ChatGPT,10.5,3,13,API log", "Request tokens is the number 10.5"),
        ("40,ChatGPT,10,-3,7,API log", "Response tokens is the number -3; expected a non-negative integer"),
        ("40,ChatGPT,10,,10,API log", "Response tokens is an empty text"),
    ],
)
def test_burstgpt_errors_name_the_line(tmp_path, bad_line, message):
    path = write(
        tmp_path, "bad.csv", [BURSTGPT_HEADER_LINE, "5,ChatGPT,10,3,13,API log", "", "6,GPT-4,11,4,15,API log", bad_line]
    )
    with pytest.raises(TraceError, match=rf"bad\.csv:line 5: .*{message}"):
        read_burstgpt(path)


def test_burstgpt_header_and_empty_files(tmp_path):
    path = write(tmp_path, "bad.csv", ["Timestamp,Model,Request tokens,Total tokens,Log Type", "5,ChatGPT,10,13,x"])
    with pytest.raises(TraceError, match=r"bad\.csv:line 1: a first line of 5 comma-separated fields, of which 5 are columns of the "
                                         r"format, without 'Response tokens'; expected columns"):
        read_burstgpt(path)
    with pytest.raises(TraceError, match="no requests"):
        read_burstgpt(write(tmp_path, "empty.csv", [BURSTGPT_HEADER_LINE]))
    with pytest.raises(TraceError, match=r"all 2 requests failed"):
        read_burstgpt(write(tmp_path, "failed.csv", [BURSTGPT_HEADER_LINE, "1,a,5,0,5,b", "2,a,6,0,6,b"]))
    # An Azure file is still read as Azure when the format is inferred.
    azure = write(tmp_path, "a.csv", [AZURE_HEADER_LINE, "2023-11-16 18:17:04,10,3"])
    assert read_trace(azure).source == "a.csv (azure)"
    assert read_trace(write(tmp_path, "b.txt", [BURSTGPT_HEADER_LINE, "5,a,1,2,3,b"]), format="burstgpt").n_requests == 1


def test_a_trace_without_any_input_tokens_is_refused(tmp_path):
    path = tmp_path / "zero.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    + "".join(f"2023-11-16 18:17:0{i}.0000000,0,10\n" for i in range(5)))
    with pytest.raises(TraceError, match="every request has 0 input tokens"):
        read_trace(path)
    some = tmp_path / "some.csv"
    some.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:01.0000000,0,10\n"
                    "2023-11-16 18:17:02.0000000,12,10\n")
    assert read_trace(some).prompt_tokens.tolist() == [0, 12]
