"""The Ollama client against a loopback server that answers as Ollama's /api/generate does."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mcsim.optrace.ollama import OllamaError, OllamaUnavailable, measure_ollama

# Numbers in the shape of a real non-streaming /api/generate answer (docs.ollama.com/api/usage).
SUCCESS = {
    "model": "llama3.2:1b",
    "created_at": "2025-10-17T23:14:07.414671Z",
    "response": "The keeper climbed the stairs...",
    "done": True,
    "done_reason": "length",
    "total_duration": 1_912_345_678,
    "load_duration": 101_397_084,
    "prompt_eval_count": 31,
    "prompt_eval_duration": 62_000_000,    # 31 tokens in 0.062 s -> 500 tok/s
    "eval_count": 64,
    "eval_duration": 1_600_000_000,        # 64 tokens in 1.6 s -> 40 tok/s
}
#: What a hostile server answers: colour, a bell, a newline, a carriage return, a terminal title, a NUL.
HOSTILE = "\x1b[31mRED\x1b[0m\x07bell\nnext line\r\x1b]0;title\x07\x00\x9b2J"
SLOW_HANDLER_SLEEP_S = 1.0
CLIENT_TIMEOUT_S = 0.2


class FakeOllama(BaseHTTPRequestHandler):
    """Behaviour is chosen by the requested model name, so one server covers every case."""

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json"):
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass

    def do_POST(self):
        if self.path != "/api/generate":
            self._send(404, b"404 page not found", "text/plain")
            return
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append(request)
        model = request["model"]
        if model == "missing-model":
            self._send(404, json.dumps({"error": "model 'missing-model' not found, try pulling it first"}).encode())
        elif model == "malformed":
            self._send(200, b'{"model": "malformed", "eval_count": 64, "eval_dur')
        elif model == "no-eval-duration":
            body = {k: v for k, v in SUCCESS.items() if k != "eval_duration"}
            self._send(200, json.dumps(body).encode())
        elif model == "cached-prompt":  # Ollama omits zero metrics: a fully cached prompt has no prompt_eval_*
            body = {k: v for k, v in SUCCESS.items() if not k.startswith("prompt_eval") and k != "load_duration"}
            self._send(200, json.dumps(body).encode())
        elif model == "zero-tokens":
            self._send(200, json.dumps({**SUCCESS, "eval_count": 0}).encode())
        elif model == "server-error":
            self._send(500, b"<html>internal error</html>", "text/html")
        elif model == "slow":
            time.sleep(SLOW_HANDLER_SLEEP_S)  # bounded, so the server thread ends by itself
            self._send(200, json.dumps(SUCCESS).encode())
        elif model == "varying":
            # Run i generates 32 * (i + 1) tokens in 0.5 s: totals differ from a mean of per-run speeds.
            i = len(self.server.requests) - 1
            self._send(200, json.dumps({**SUCCESS, "eval_count": 32 * (i + 1), "eval_duration": 500_000_000,
                                        "prompt_eval_count": 31 if i == 0 else 1,
                                        "prompt_eval_duration": 62_000_000 if i == 0 else 2_000_000}).encode())
        elif model == "huge":  # a 5 MB body
            self._send(200, b"{" + b" " * 5_000_000 + b"}")
        elif model == "endless":  # a chunked body that never ends (bounded here so the thread stops)
            self._stream(lambda i: b"x" * 65536, chunks=400)
        elif model == "drip":  # one byte every 0.05 s: each read is quick, the whole answer is not
            self._stream(lambda i: b" ", chunks=60, pause=0.05)
        elif model == "redirect":
            self.send_response(307)
            self.send_header("Location", "ftp://127.0.0.1:1/x")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif model == "ansi":
            self._send(500, json.dumps({"error": "\x1b[31mred\x1b[0m " + "x" * 100_000}).encode())
        elif model.startswith("hostile-"):  # control characters wherever a server's text can reach a message
            where = model.removeprefix("hostile-")
            body, status = {"error-500": (json.dumps({"error": HOSTILE}).encode(), 500),
                            "error-200": (json.dumps({"error": HOSTILE}).encode(), 200),
                            "not-json": (HOSTILE.encode() * 50, 200),
                            "html": (HOSTILE.encode(), 502),
                            "keys": (json.dumps({HOSTILE * 50: 1}).encode(), 200),
                            "value": (json.dumps({**SUCCESS, "eval_count": HOSTILE * 50}).encode(), 200)}[where]
            self._send(status, body)
        else:
            self._send(200, json.dumps({**SUCCESS, "model": model}).encode())

    def _stream(self, chunk, chunks, pause=0.0):
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(chunks):
                data = chunk(i)
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
                if pause:
                    time.sleep(pause)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass


@pytest.fixture
def ollama_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOllama)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        host, port = server.server_address
        yield f"http://{host}:{port}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def closed_port():
    """A loopback port that refuses connections: bound (so nobody else takes it) but not listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def test_success_speeds_from_server_counts(ollama_url):
    url, server = ollama_url
    m = measure_ollama(url, "llama3.2:1b", prompt="hello", num_predict=64)
    assert m["measured"] is True
    assert m["url"] == url and m["model"] == "llama3.2:1b" and m["runs"] == 1
    assert m["decode_tok_s"] == pytest.approx(64 / 1.6)          # 40 tok/s
    assert m["prefill_tok_s"] == pytest.approx(31 / 0.062)       # 500 tok/s
    assert m["eval_count"] == 64 and m["eval_duration_ns"] == 1_600_000_000
    assert m["prompt_eval_count"] == 31 and m["prompt_eval_duration_ns"] == 62_000_000
    assert m["total_duration_ns"] == 1_912_345_678 and m["load_duration_ns"] == 101_397_084
    assert m["decode_tok_s_per_run"] == [pytest.approx(40.0)]
    # What went over the wire is what Ollama's API expects.
    assert server.requests == [{"model": "llama3.2:1b", "prompt": "hello", "stream": False,
                                "options": {"num_predict": 64}}]


def test_several_runs_are_token_weighted(ollama_url):
    url, server = ollama_url
    m = measure_ollama(url, "varying", runs=3)
    assert len(server.requests) == 3
    # 32 + 64 + 96 = 192 tokens in 1.5 s; the per-run speeds are 64, 128, 192 tok/s.
    assert m["decode_tok_s"] == pytest.approx(192 / 1.5)
    assert m["decode_tok_s_per_run"] == [pytest.approx(64.0), pytest.approx(128.0), pytest.approx(192.0)]
    # 31 + 1 + 1 prompt tokens in 0.062 + 0.002 + 0.002 s.
    assert m["prefill_tok_s"] == pytest.approx(33 / 0.066)


def test_cached_prompt_has_no_prefill_speed(ollama_url):
    url, _ = ollama_url
    m = measure_ollama(url, "cached-prompt")
    assert m["decode_tok_s"] == pytest.approx(40.0)
    assert m["prefill_tok_s"] is None
    assert m["prompt_eval_count"] == 0 and m["load_duration_ns"] == 0


def test_url_without_scheme_and_with_trailing_slash(ollama_url):
    url, _ = ollama_url
    m = measure_ollama(url.removeprefix("http://") + "/", "llama3.2:1b")
    assert m["url"] == url
    assert m["decode_tok_s"] == pytest.approx(40.0)


def test_proxy_variables_are_ignored(ollama_url, closed_port, monkeypatch):
    url, _ = ollama_url
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed_port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert measure_ollama(url, "llama3.2:1b")["decode_tok_s"] == pytest.approx(40.0)


def test_model_not_found_carries_ollama_message(ollama_url):
    url, _ = ollama_url
    with pytest.raises(OllamaError) as info:
        measure_ollama(url, "missing-model")
    message = str(info.value)
    assert "404" in message
    assert "model 'missing-model' not found, try pulling it first" in message
    assert url in message


def test_http_error_without_json_body(ollama_url):
    url, _ = ollama_url
    with pytest.raises(OllamaError, match=r"HTTP 500.*internal error"):
        measure_ollama(url, "server-error")


def test_malformed_json(ollama_url):
    url, _ = ollama_url
    with pytest.raises(OllamaError, match="not valid JSON") as info:
        measure_ollama(url, "malformed")
    assert url in str(info.value)


def test_missing_eval_duration(ollama_url):
    url, _ = ollama_url
    with pytest.raises(OllamaError, match="'eval_duration'"):
        measure_ollama(url, "no-eval-duration")


def test_zero_generated_tokens(ollama_url):
    url, _ = ollama_url
    with pytest.raises(OllamaError, match="eval_count=0"):
        measure_ollama(url, "zero-tokens")


def test_timeout_is_unavailable_and_bounded(ollama_url):
    url, server = ollama_url
    start = time.perf_counter()
    with pytest.raises(OllamaUnavailable) as info:
        measure_ollama(url, "slow", timeout_s=CLIENT_TIMEOUT_S, runs=3)
    elapsed = time.perf_counter() - start
    message = str(info.value)
    assert url in message and "skipped" in message and "0.2 s" in message
    # Given up after the first run's timeout, without retrying and without waiting for the server.
    assert elapsed < SLOW_HANDLER_SLEEP_S
    assert len(server.requests) == 1


def test_connection_refused(closed_port):
    url = f"http://127.0.0.1:{closed_port}"
    start = time.perf_counter()
    with pytest.raises(OllamaUnavailable) as info:
        measure_ollama(url, "llama3.2:1b", timeout_s=5.0)
    assert time.perf_counter() - start < 5.0
    message = str(info.value)
    assert url in message and "skipped" in message


@pytest.mark.parametrize("kwargs, match", [
    ({"url": "ftp://127.0.0.1:1"}, "http"),
    ({"runs": 0}, "runs"),
    ({"num_predict": 0}, "num_predict"),
    ({"timeout_s": 0.0}, "timeout_s"),
    ({"model": ""}, "model"),
])
def test_bad_arguments(kwargs, match):
    args = {"url": "http://127.0.0.1:1", "model": "llama3.2:1b", **kwargs}
    with pytest.raises((ValueError, OllamaError), match=match):
        measure_ollama(**args)


def test_a_huge_body_is_refused_unread(ollama_url):
    url, _ = ollama_url
    with pytest.raises(OllamaError, match="at most"):
        measure_ollama(url, "huge")


def test_an_endless_body_is_cut_at_the_size_cap(ollama_url):
    url, _ = ollama_url
    start = time.perf_counter()
    with pytest.raises(OllamaError, match="more than"):
        measure_ollama(url, "endless", timeout_s=10.0)
    assert time.perf_counter() - start < 5.0


def test_a_dripping_server_is_cut_off_at_the_deadline(ollama_url):
    url, _ = ollama_url
    start = time.perf_counter()
    with pytest.raises(OllamaUnavailable, match="within 0.5 s"):
        measure_ollama(url, "drip", timeout_s=0.5)
    assert time.perf_counter() - start < 1.5  # the drip would take 3 s


def test_redirects_are_not_followed(ollama_url):
    url, server = ollama_url
    with pytest.raises(OllamaError, match="redirects are not followed"):
        measure_ollama(url, "redirect")
    assert len(server.requests) == 1


def test_server_text_is_cut_short(ollama_url):
    url, _ = ollama_url
    with pytest.raises(OllamaError) as info:
        measure_ollama(url, "ansi")
    assert len(str(info.value)) < 500


@pytest.mark.parametrize("where", ["error-500", "error-200", "not-json", "html", "keys", "value"])
def test_a_hostile_servers_text_reaches_no_terminal_raw(ollama_url, where):
    # the message itself is safe, so a notebook printing it is as safe as the command line's one-line boundary
    url, _ = ollama_url
    with pytest.raises(OllamaError) as info:
        measure_ollama(url, f"hostile-{where}")
    message = str(info.value)
    assert message.isprintable() and len(message) < 500, message  # no ESC, BEL, CR, LF, NUL or CSI, and cut
    assert "RED" in message or where == "value" or where == "keys"  # the text is shown, escaped
