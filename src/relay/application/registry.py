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
from relay.domain.template import EventRule, Template


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
    pending, and the rule index over all of them.

    ``unavailable`` names functions whose directory is there but whose template
    is not valid: they are not loaded, yet their recorded invocations wait for
    them (a broken template is not a removal). ``complete`` is false until the
    functions directory has been scanned once: before that, a function that is
    not loaded may simply not be loaded *yet*.
    """

    functions: Mapping[str, ActiveFunction]
    index: RuleIndex
    unavailable: frozenset[str] = frozenset()
    complete: bool = False

    @classmethod
    def of(
        cls,
        functions: Mapping[str, ActiveFunction],
        *,
        unavailable: frozenset[str] = frozenset(),
        complete: bool = False,
    ) -> Catalog:
        frozen = MappingProxyType(dict(functions))
        index = RuleIndex.build((name, f.template) for name, f in frozen.items())
        return cls(functions=frozen, index=index, unavailable=unavailable, complete=complete)

    def with_status(self, *, unavailable: frozenset[str], complete: bool) -> Catalog:
        """The same functions (and index) with another availability record."""
        return Catalog(
            functions=self.functions, index=self.index, unavailable=unavailable, complete=complete
        )

    def rule(self, function: str, handler: str) -> EventRule | None:
        """The event rule of ``function`` named ``handler``, if loaded."""
        fn = self.functions.get(function)
        if fn is None:
            return None
        return next((r for r in fn.template.events if r.handler == handler), None)


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
        current = self._catalog
        self._catalog = Catalog.of(
            functions,
            unavailable=current.unavailable - {function.name},
            complete=current.complete,
        )
        return self._catalog

    def drop(self, name: str) -> Catalog:
        """Remove one function (no-op when absent); returns the new catalog."""
        current = self._catalog
        if name in current.functions:
            functions = dict(current.functions)
            del functions[name]
            self._catalog = Catalog.of(
                functions, unavailable=current.unavailable, complete=current.complete
            )
        self._set(unavailable=self._catalog.unavailable - {name})
        return self._catalog

    def mark_unavailable(self, name: str) -> None:
        """``name``'s directory holds no valid template: not loaded, not removed."""
        if name not in self._catalog.functions:
            self._set(unavailable=self._catalog.unavailable | {name})

    def mark_complete(self) -> None:
        """The functions directory was scanned once: what is not loaded now is gone."""
        self._set(complete=True)

    def _set(
        self, *, unavailable: frozenset[str] | None = None, complete: bool | None = None
    ) -> None:
        current = self._catalog
        self._catalog = current.with_status(
            unavailable=current.unavailable if unavailable is None else unavailable,
            complete=current.complete if complete is None else complete,
        )
