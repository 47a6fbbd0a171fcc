"""Measured decode and prefill speed of a local model served by Ollama.

One non-streaming ``POST {url}/api/generate`` per run; Ollama reports how many tokens it evaluated and how long
that took, so the speeds come from the server's own clocks, not from HTTP round trips. Standard library only.

The client does not trust the server: only ``http`` and ``https`` URLs; no proxies; no redirects (a 3xx answer is
an error, never followed); at most :data:`MAX_BODY_BYTES` of body (a larger or endless one is an error, never read
whole); and one deadline for the whole call, connection to last byte (a server that drips its answer is cut off
at ``timeout_s``, not waited on per byte). Server text in messages is cut to a short excerpt.

Fields read from the response (Ollama API, "Usage": https://docs.ollama.com/api/usage; all durations are in
nanoseconds): ``eval_count``, ``eval_duration`` (generated tokens), ``prompt_eval_count``,
``prompt_eval_duration`` (prompt tokens), ``total_duration``, ``load_duration``. Errors come back as HTTP status
codes with a JSON body ``{"error": "..."}`` ("Errors": https://docs.ollama.com/api/errors). Request options
such as ``num_predict`` are described at https://docs.ollama.com/api/generate.

Ollama omits a metric that is zero (its Go structs mark them ``omitempty``): a prompt served entirely from its
cache has no ``prompt_eval_*`` fields. Only ``eval_count`` and ``eval_duration`` are therefore required; the
prefill speed is ``None`` when no prompt tokens were evaluated.

Example
-------
>>> from mcsim.optrace.ollama import measure_ollama, OllamaUnavailable
>>> try:                                                                # doctest: +SKIP
...     m = measure_ollama("http://127.0.0.1:11434", "llama3.2:1b", runs=3)
...     print(f"{m['decode_tok_s']:.1f} tok/s decode")
... except OllamaUnavailable as err:
...     print(err)
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from http.client import HTTPException

from mcsim.errors import McsimError
from mcsim.text import one_line

DEFAULT_PROMPT = ("Explain, in a few plain paragraphs, how a lighthouse keeper in the nineteenth century kept the "
                  "lamp burning through a winter storm.")

# The metrics Ollama returns with a finished generation, by their API names; the first two are required.
REQUIRED_FIELDS = ("eval_count", "eval_duration")
OPTIONAL_FIELDS = ("prompt_eval_count", "prompt_eval_duration", "total_duration", "load_duration")

_BODY_EXCERPT_CHARS = 200
#: Largest response body read, bytes (a generate answer is a few kB).
MAX_BODY_BYTES = 1 << 20


class OllamaUnavailable(McsimError):
    """No Ollama server answered at the URL (connection refused, unknown host, timeout); nothing was measured."""


class OllamaError(McsimError):
    """Ollama answered, but not with a usable measurement (HTTP error, malformed JSON, missing or bad fields)."""


def _base_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        # OLLAMA_HOST is commonly written as host:port; the API is plain HTTP by default.
        url = "http://" + url
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("http", "https"):
        raise OllamaError(f"Ollama URL {url!r}: expected an http:// or https:// address")
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port
    except ValueError:
        raise OllamaError(f"Ollama URL {url!r}: the port is not a number in 0-65535") from None
    if not parts.hostname:
        raise OllamaError(f"Ollama URL {url!r}: no host")
    return url


def _excerpt(raw: bytes) -> str:
    """A server's text as it may be printed: one line, control characters escaped, at most
    ``_BODY_EXCERPT_CHARS`` characters (a hostile server's ANSI escapes, bells and newlines never reach a
    terminal, whether the message is printed by the command line or by a notebook)."""
    return _server_text(raw.decode("utf-8", errors="replace").strip())


def _server_text(text) -> str:
    return one_line(text, _BODY_EXCERPT_CHARS)


def _error_message(status: int, raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return _server_text(body["error"])
    return _excerpt(raw) or http.client.responses.get(status, "no message")


def _read_body(response, base: str) -> bytes:
    """At most MAX_BODY_BYTES of the body; an error if the server sends more."""
    declared = response.getheader("Content-Length")
    counted = declared is not None and declared.strip().isascii() and declared.strip().isdigit()
    if counted and int(declared) > MAX_BODY_BYTES:
        raise OllamaError(f"Ollama at {base} announced a {int(declared):,}-byte answer; at most "
                          f"{MAX_BODY_BYTES:,} bytes are read")
    raw = response.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise OllamaError(f"Ollama at {base} sent more than {MAX_BODY_BYTES:,} bytes; the answer was not read")
    return raw


def _generate_once(base: str, model: str, prompt: str, num_predict: int, timeout_s: float) -> dict:
    payload = json.dumps({"model": model, "prompt": prompt, "stream": False,
                          "options": {"num_predict": num_predict}}).encode("utf-8")
    parts = urllib.parse.urlsplit(base)
    kind = http.client.HTTPSConnection if parts.scheme.lower() == "https" else http.client.HTTPConnection
    path = (parts.path.rstrip("/") or "") + "/api/generate"
    skipped = "; the Ollama measurement was skipped"
    late = f"Ollama at {base} did not answer within {timeout_s:g} s{skipped}"
    conn = kind(parts.hostname, parts.port, timeout=timeout_s)
    expired = threading.Event()
    held = {}  # the socket, kept: the connection lets go of it once a closing response starts

    def cut_off():  # one deadline for the whole call: a server that drips bytes is not waited on per byte
        expired.set()
        sock = held.get("sock")
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    watchdog = threading.Timer(timeout_s, cut_off)
    watchdog.daemon = True
    started = time.monotonic()
    watchdog.start()
    try:
        conn.connect()
        held["sock"] = conn.sock
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        status = response.status
        if 300 <= status < 400:
            raise OllamaError(f"Ollama at {base} answered HTTP {status} (a redirect to "
                              f"'{_excerpt((response.getheader('Location') or '').encode())}'); redirects are "
                              "not followed")
        raw = _read_body(response, base)
        if expired.is_set() or time.monotonic() - started > timeout_s:
            raise OllamaUnavailable(late)
        if status >= 400:
            raise OllamaError(f"Ollama at {base} answered HTTP {status} for model {model!r}: "
                              f"{_error_message(status, raw)}")
    except (OllamaError, OllamaUnavailable):
        raise
    except (TimeoutError, socket.timeout):
        raise OllamaUnavailable(late) from None
    except (HTTPException, OSError) as err:
        if expired.is_set():
            raise OllamaUnavailable(late) from None
        if isinstance(err, HTTPException):
            raise OllamaError(f"Ollama at {base} sent a malformed HTTP response ({type(err).__name__})") from None
        reason = err.strerror or type(err).__name__
        raise OllamaUnavailable(f"Ollama at {base} is not reachable ({reason}){skipped}") from None
    finally:
        watchdog.cancel()
        conn.close()

    try:
        body = json.loads(raw)
    except ValueError as err:
        raise OllamaError(f"Ollama at {base} returned a response that is not valid JSON ({err}): "
                          f"'{_excerpt(raw)}'") from None
    except RecursionError:
        raise OllamaError(f"Ollama at {base} returned JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise OllamaError(f"Ollama at {base} returned JSON that is not an object: '{_excerpt(raw)}'")
    if "error" in body:
        raise OllamaError(f"Ollama at {base} reported an error for model {model!r}: "
                          f"{_error_message(200, json.dumps({'error': str(body['error'])}).encode())}")
    return body


def _count(body: dict, name: str, base: str, required: bool) -> int:
    if name not in body:
        if required:
            keys = _server_text(", ".join(sorted(body)))
            raise OllamaError(f"Ollama at {base} returned no {name!r} (got keys: {keys}); "
                              f"cannot compute tokens/s")
        return 0
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise OllamaError(f"Ollama at {base} returned {name}={_server_text(repr(value))}; expected a non-negative "
                          "number")
    return int(value)


def measure_ollama(url: str, model: str, prompt: str = DEFAULT_PROMPT, num_predict: int = 64,
                   timeout_s: float = 30.0, runs: int = 1) -> dict:
    """Measure decode and prefill tokens/s of a model served by Ollama.

    Parameters
    ----------
    url : str
        Base URL of the Ollama server, e.g. ``"http://127.0.0.1:11434"`` (``host:port`` is read as http).
        Environment proxies are ignored: the server is expected to be local.
    model : str
        Model name as Ollama knows it (``ollama list``), e.g. ``"llama3.2:1b"``.
    prompt : str
        Prompt sent on every run.
    num_predict : int
        Largest number of tokens to generate per run (Ollama option ``num_predict``).
    timeout_s : float
        Seconds to wait for each run's answer. Each run is tried once; nothing is retried.
    runs : int
        Number of generate calls. Totals are summed over runs, so the speeds are token-weighted means.
        Later runs usually find the prompt in Ollama's cache, which lowers their prompt token counts.

    Returns
    -------
    dict
        ``measured`` (True), ``source`` ("ollama"), ``url``, ``model`` (as the server named it), ``runs``,
        ``num_predict``; ``decode_tok_s`` = eval_count / (eval_duration / 1e9), tokens/s;
        ``prefill_tok_s`` = prompt_eval_count / (prompt_eval_duration / 1e9), tokens/s, or None when no prompt
        tokens were evaluated; totals over runs: ``eval_count``, ``eval_duration_ns``, ``prompt_eval_count``,
        ``prompt_eval_duration_ns``, ``total_duration_ns``, ``load_duration_ns`` (a metric Ollama omitted counts
        as 0); ``decode_tok_s_per_run`` (list, tokens/s).

    Raises
    ------
    OllamaUnavailable
        Connection refused, unknown host or timeout: the message names the URL and says the measurement was
        skipped.
    OllamaError
        An HTTP error (with Ollama's ``error`` message, e.g. a model that is not pulled), a body that is not
        JSON, or a response without ``eval_count``/``eval_duration`` or with zero of either.
    OllamaError
        Also for a URL that is not http(s) or has no host, a redirect, or a body over MAX_BODY_BYTES.
    ValueError
        Bad arguments (``runs`` < 1, ``num_predict`` < 1, ``timeout_s`` <= 0).
    """
    base = _base_url(url)
    if not model:
        raise ValueError("Ollama model name is empty")
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if num_predict < 1:
        raise ValueError(f"num_predict must be at least 1, got {num_predict}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    # http.client connects directly: an http_proxy variable must not send a local measurement through a proxy.

    totals = dict.fromkeys(REQUIRED_FIELDS + OPTIONAL_FIELDS, 0)
    per_run = []
    served_model = model
    for _ in range(runs):
        body = _generate_once(base, model, prompt, num_predict, timeout_s)
        counts = {name: _count(body, name, base, name in REQUIRED_FIELDS) for name in totals}
        if counts["eval_count"] == 0 or counts["eval_duration"] == 0:
            raise OllamaError(f"Ollama at {base} returned eval_count={counts['eval_count']}, "
                              f"eval_duration={counts['eval_duration']} ns for model {model!r}; "
                              f"no generated tokens to time")
        per_run.append(counts["eval_count"] / (counts["eval_duration"] / 1e9))
        for name, value in counts.items():
            totals[name] += value
        if isinstance(body.get("model"), str) and body["model"]:
            served_model = body["model"]

    prefill = None
    if totals["prompt_eval_count"] > 0 and totals["prompt_eval_duration"] > 0:
        prefill = totals["prompt_eval_count"] / (totals["prompt_eval_duration"] / 1e9)
    return {
        "measured": True,
        "source": "ollama",
        "url": base,
        "model": served_model,
        "runs": runs,
        "num_predict": num_predict,
        "decode_tok_s": totals["eval_count"] / (totals["eval_duration"] / 1e9),
        "prefill_tok_s": prefill,
        "eval_count": totals["eval_count"],
        "eval_duration_ns": totals["eval_duration"],
        "prompt_eval_count": totals["prompt_eval_count"],
        "prompt_eval_duration_ns": totals["prompt_eval_duration"],
        "total_duration_ns": totals["total_duration"],
        "load_duration_ns": totals["load_duration"],
        "decode_tok_s_per_run": per_run,
    }
