"""The function registry: which functions exist and which version of each serves.

The dispatcher reads :meth:`FunctionRegistry.current` once per event: a frozen
:class:`Catalog` (the functions plus a rule index compiled over all of them). A
reconcile never mutates a catalog; it builds a new one and swaps the reference,
so a reader always sees one consistent version and an in-flight invocation keeps
the snapshot it started with.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import msgspec

from relay.domain.rule_index import RuleIndex
from relay.domain.template import Template


class ActiveFunction(msgspec.Struct, frozen=True, kw_only=True):
    """One function as the dispatcher sees it.

    ``image`` is ``None`` while the function is pending (its first image is still
    being prepared, or that preparation failed): its matched events stay pending
    rather than being acknowledged as unmatched. ``last_error`` is the failure of
    that first preparation, if any (the function is then *unavailable*).
    """

    name: str
    directory: str
    template: Template
    runtime: str | None
    image: str | None
    fingerprint: str | None
    prepared_at: float | None
    last_error: str | None = None

    @property
    def ready(self) -> bool:
        return self.image is not None


class Catalog(msgspec.Struct, frozen=True, kw_only=True):
    """An immutable snapshot: every function with a valid template, ready or
    pending, and the rule index over all of them."""

    functions: Mapping[str, ActiveFunction]
    index: RuleIndex

    @classmethod
    def of(cls, functions: Mapping[str, ActiveFunction]) -> Catalog:
        frozen = MappingProxyType(dict(functions))
        index = RuleIndex.build((name, f.template) for name, f in frozen.items())
        return cls(functions=frozen, index=index)


class FunctionRegistry:
    """Holds the current :class:`Catalog`; only the reconciler changes it.

    Readers never lock: :meth:`current` returns a reference swapped atomically
    (one assignment) by :meth:`put` and :meth:`drop`, which the reconciler calls
    from one event loop.
    """

    def __init__(self) -> None:
        self._catalog = Catalog.of({})

    def current(self) -> Catalog:
        return self._catalog

    def get(self, name: str) -> ActiveFunction | None:
        return self._catalog.functions.get(name)

    def put(self, function: ActiveFunction) -> Catalog:
        """Add or replace one function; returns the new catalog."""
        functions = dict(self._catalog.functions)
        functions[function.name] = function
        self._catalog = Catalog.of(functions)
        return self._catalog

    def drop(self, name: str) -> Catalog:
        """Remove one function (no-op when absent); returns the new catalog."""
        if name in self._catalog.functions:
            functions = dict(self._catalog.functions)
            del functions[name]
            self._catalog = Catalog.of(functions)
        return self._catalog
