"""Resolved parameters as a read-only, hashable mapping: what a stage hands a part of itself that must read only
its declared keys."""

from __future__ import annotations

from collections.abc import Mapping


class Params(Mapping):
    """Resolved parameters, read-only and hashable: what stage 5 hands the batching simulator. A key it does not
    hold is a ``KeyError`` that says so (``.get`` returns its default, as a dict's does)."""

    __slots__ = ("_items", "_values")

    def __init__(self, items):
        self._items = tuple(items)
        self._values = dict(self._items)

    def __getitem__(self, key):
        try:
            return self._values[key]
        except KeyError:
            raise KeyError(f"{key!r} is not among the parameters stage 5 hands the batching simulator "
                           "(mcsim.perf.fleet.SIMULATOR_KEYS)") from None

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
