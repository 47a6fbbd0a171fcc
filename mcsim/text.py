"""Text that came from inputs, made safe for where it goes: a terminal line, Markdown, a file name.

Scenario names, model names and server replies are data, not markup: a newline must not start a new heading,
``<script>`` or ``![](http://...)`` must not become HTML or a remote image, an ANSI escape must not move the cursor,
``../x`` must not leave the output folder.

Examples
--------
>>> markdown_text("a\\n# b <script>")
'a \\\\# b &lt;script&gt;'
>>> safe_filename("../x")
'x'
>>> one_line("red\\x1b[31m")
'red\\\\x1b[31m'
"""

from __future__ import annotations

import math
import re

#: Longest line printed for one error, characters.
MAX_LINE = 2000
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|~])")


def one_line(text, limit: int = MAX_LINE) -> str:
    """``text`` as one printable line: control characters escaped (``\\n``, ``\\x1b``), cut to ``limit``."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
    return out if len(out) <= limit else out[:limit] + f"... ({len(out) - limit} more characters)"


def markdown_text(text) -> str:
    """``text`` shown literally in Markdown: one line, HTML characters as entities, Markdown markup escaped."""
    flat = one_line(" ".join(str(text).split()))  # newlines and tabs become spaces, other controls are escaped
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", flat)


def safe_filename(name, default: str = "scenario", limit: int = 100) -> str:
    """A file name made of ``name``'s letters, digits, ``.``, ``-`` and ``_`` (runs of others become ``_``), without
    leading dots or separators, at most ``limit`` characters; ``default`` when nothing is left."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", str(name)).strip("._-")[:limit].rstrip("._-")
    return cleaned or default


def strict_json(obj):
    """``obj`` for strict JSON: every non-finite float (an infinite payback, an empty band) becomes None, in nested
    dicts and lists too."""
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def si(value: float) -> str:
    """``64.1 M``, ``2.4 G``, ``950 k``, ``12.5``."""
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            scaled = value / factor
            return f"{scaled:.3g} {prefix}" if scaled < 100 else f"{scaled:.0f} {prefix}"
    return f"{value:.3g}"
