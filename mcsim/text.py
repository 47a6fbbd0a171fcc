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


def shape_of(value, csv_field: bool = False) -> str:
    """What a value read from a user's file is, by its type and size, never its content (an error message must
    not echo a file that was not a trace, a key file, say): ``'a text of 12 characters'``, ``'a list of 3
    items'``. A number is shown, since a number in a numeric field is what the user needs to find and fix; with
    ``csv_field`` a text that reads as a number (a CSV field is always text) is shown as that number.

    >>> shape_of("SECRET-TOKEN"), shape_of([1, 2]), shape_of(-5)
    ('a text of 12 characters', 'a list of 2 items', '-5')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return one_line(repr(value), 40)
    if isinstance(value, str):
        if not value.strip():
            return "an empty text" if not value else "a text of spaces"
        if csv_field:
            try:
                return f"the number {one_line(value.strip(), 40)}" if math.isfinite(float(value)) else \
                    f"the number {float(value)!r}"  # a field that parses: a negative, a fraction, nan, inf
            except ValueError:
                pass
        return f"a text of {len(value)} character{'' if len(value) == 1 else 's'}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return f"an object of {len(value)} field{'' if len(value) == 1 else 's'}"
    return f"a {type(value).__name__}"


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
