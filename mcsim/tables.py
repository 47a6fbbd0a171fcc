"""Plain-text tables that fit a terminal.

A table wider than the terminal is cut into blocks of columns, printed one under the other, each repeating the
leading ``keep`` columns (the row labels) so that every block reads on its own; a column that is too wide even
alone with the labels is wrapped inside its cells. With ``wrap=True`` the columns are wrapped instead of split
(for lists whose rows should stay whole). No cell is ever cut short: wrapping only moves words to further lines.

Examples
--------
>>> print("\\n".join(table([["metric", "a", "b"], ["x", "1", "2"]], width=80)))
metric  a  b
------  -  -
x       1  2
>>> for line in table([["k", "long value", "other value"], ["x", "1", "2"]], width=16):
...     print(line)
k  long value
-  ----------
x  1
<BLANKLINE>
k  other value
-  -----------
x  2
"""

from __future__ import annotations

import shutil
import textwrap

#: Narrowest width a table is laid out for, characters (a narrower terminal gets lines this long).
MIN_WIDTH = 20
#: Spaces between two columns.
GAP = 2
#: Columns are shrunk by wrapping down to this width before any column that the caller asked to keep whole.
MIN_COLUMN = 6


def terminal_width() -> int:
    """Columns of the terminal (``$COLUMNS`` first, as :func:`shutil.get_terminal_size` reads it), 80 when unknown."""
    return max(MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)


def table(rows, *, header: int = 1, width: int | None = None, keep: int = 1, wrap: bool = False) -> list[str]:
    """Lines of a left-aligned table at most ``width`` characters wide.

    Parameters
    ----------
    rows : sequence of sequences
        The header row(s) first, then the body; cells are converted with ``str``. Every row has as many cells.
    header : int
        How many of the leading rows are headers (a dashed line follows them).
    width : int, optional
        Largest line length (default: :func:`terminal_width`).
    keep : int
        Leading columns repeated in every block of a table split by columns.
    wrap : bool
        Wrap cells to fit instead of splitting the table into blocks of columns.

    Returns
    -------
    list of str
        The lines, without trailing spaces.
    """
    width = max(MIN_WIDTH, width or terminal_width())
    rows = [["" if c is None else str(c) for c in row] for row in rows]
    if not rows:
        return []
    n = len(rows[0])
    natural = [max(len(row[i]) for row in rows) for i in range(n)]
    words = [max((len(w) for row in rows for w in row[i].split()), default=0) for i in range(n)]
    if _span(natural) <= width or n == 1:
        return _render(rows, header, list(range(n)), _shrink(natural, width, keep, words))
    keep = min(keep, n - 1)
    if wrap:
        widths = _shrink(natural, width, keep, words)
        if _span(widths) <= width:
            return _render(rows, header, list(range(n)), widths)
        # too many columns to wrap into the width even one character wide: split them after all
    labels = list(range(keep))
    blocks, current = [], []
    for i in range(keep, n):
        if current and _span([natural[j] for j in labels + current + [i]]) > width:
            blocks.append(current)
            current = []
        current.append(i)
    blocks.append(current)
    lines: list[str] = []
    for block in blocks:
        columns = labels + block
        if lines:
            lines.append("")
        lines += _render(rows, header, columns, _shrink([natural[j] for j in columns], width, keep,
                                                        [words[j] for j in columns]))
    return lines


def _span(widths) -> int:
    return sum(widths) + GAP * max(0, len(widths) - 1)


def _shrink(widths: list[int], width: int, keep: int, words: list[int] | None = None) -> list[int]:
    """Column widths that fit ``width``. The widest column loses a character at a time: first down to its longest
    word (so that cells wrap between words), the first ``keep`` columns last; then words are broken, down to
    :data:`MIN_COLUMN` characters, and at last down to one character."""
    widths = list(widths)
    words = words or [1] * len(widths)
    floors = [[min(w, max(words[i], 1)) for i, w in enumerate(widths)],
              [min(w, max(words[i], 1)) if i < keep else min(w, MIN_COLUMN) for i, w in enumerate(widths)],
              [min(w, MIN_COLUMN) for w in widths], [1] * len(widths)]
    order = [range(keep, len(widths)), range(len(widths)), range(len(widths)), range(len(widths))]
    for floor, columns in zip(floors, order):
        while _span(widths) > width:
            candidates = [i for i in columns if widths[i] > floor[i]]
            if not candidates:
                break
            widths[max(candidates, key=lambda i: widths[i])] -= 1
    return widths


def _cell_lines(text: str, width: int) -> list[str]:
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def _render(rows, header: int, columns: list[int], widths: list[int]) -> list[str]:
    lines = []
    for r, row in enumerate(rows):
        cells = [_cell_lines(row[c], w) for c, w in zip(columns, widths)]
        for k in range(max(len(c) for c in cells)):
            parts = [(c[k] if k < len(c) else "").ljust(w) for c, w in zip(cells, widths)]
            lines.append((" " * GAP).join(parts).rstrip())
        if r == header - 1:
            lines.append((" " * GAP).join("-" * w for w in widths))
    return lines


def paragraph(text: str, width: int | None = None) -> list[str]:
    """A line of prose wrapped to ``width`` (default: :func:`terminal_width`)."""
    return textwrap.wrap(text, max(MIN_WIDTH, width or terminal_width()), break_on_hyphens=False) or [""]
