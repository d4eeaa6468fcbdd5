"""No two modules of ``relay`` import each other, directly or around a circle.

An import circle (``trace`` -> ``trace_json`` -> ``trace``) means two modules are
one module in two files: neither can be read, tested or loaded alone, and the
order they are first imported in decides whether a name exists yet. The graph is
grimp's (import-linter's own), with the imports under ``TYPE_CHECKING`` counted:
a type shared both ways is still a circle, and moving the type down breaks it.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import grimp


def strongly_connected(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def relay_graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("relay", cache_dir=None)
    return {
        module: {m for m in graph.find_modules_directly_imported_by(module) if m in graph.modules}
        for module in graph.modules
    }


def test_src_relay_has_no_import_cycles() -> None:
    assert strongly_connected(relay_graph()) == []


def test_the_finder_finds_a_circle() -> None:
    """The check above can fail: a three-module circle and a two-module one are found."""
    graph = {
        "a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(),
        "x": {"y"}, "y": {"x"}, "z": {"z2"}, "z2": set(),
    }
    assert strongly_connected(graph) == [["a", "b", "c"], ["x", "y"]]
