"""Resolved parameters as a read-only, hashable mapping: what a stage hands a part of itself that must read only
its declared keys."""

from __future__ import annotations

from collections.abc import Mapping


class Params(Mapping):
    """Resolved parameters, read-only and hashable: the declared inputs a stage hands a part of itself (the step
    model, the batching simulator). A key it does not hold is a ``KeyError`` that names ``declared_by``, where
    the keys are declared (``.get`` returns its default, as a dict's does).

    Examples
    --------
    >>> p = Params([("deployment.tp", 8)], declared_by="mcsim.perf.factor.step_reads")
    >>> p["deployment.tp"], p.get("deployment.pp", 1)
    (8, 1)
    >>> p["moe.nodes"]
    Traceback (most recent call last):
    ...
    KeyError: "'moe.nodes' is not among the declared inputs (mcsim.perf.factor.step_reads)"
    """

    __slots__ = ("_items", "_values", "_declared_by")

    def __init__(self, items, declared_by: str = "mcsim.perf.fleet.SIMULATOR_KEYS"):
        self._items = tuple(items)
        self._values = dict(self._items)
        self._declared_by = declared_by

    def __getitem__(self, key):
        try:
            return self._values[key]
        except KeyError:
            raise KeyError(f"{key!r} is not among the declared inputs ({self._declared_by})") from None

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other) -> bool:
        return isinstance(other, Params) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"Params({self._values!r})"
