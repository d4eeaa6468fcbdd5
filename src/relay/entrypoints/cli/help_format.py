"""``relay ... --help`` without Python type names.

Typer 0.29 prints each parameter's annotation in help (``--limit <int>``,
``NAME <str>``, even ``--help <bool>``). An operator reads ``--limit N``, not a
Python type. The root group (``RelayGroup``, the ``cls`` of the root app) walks the
whole command tree once when it is built and:

- gives every option that takes a value a metavar (its own, else its name in
  capitals: ``--ref REF``), which typer prints instead of the type;
- makes every argument show only its name (typer has no setting for that, so the
  argument's class becomes a subclass that shows no type);
- leaves flags alone: with plain (non-rich) help, a flag shows no type at all.

``tests/unit/test_cli_help.py`` walks the same tree and fails on a type name.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperGroup, TyperOption


class _NamedArgument(TyperArgument):
    """An argument whose help shows its metavar (``NAME``) and no ``<str>``."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


class RelayGroup(TyperGroup):
    """The root ``relay`` group: see the module docstring."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in _walk(self):
            for param in command.params:
                _tidy(param)


def _walk(group: TyperGroup) -> list[Any]:
    # typer vendors its own click: its groups are TyperGroup, not click.Group
    found: list[Any] = [group]
    for command in group.commands.values():
        if isinstance(command, TyperGroup):
            found += _walk(command)
        else:
            found.append(command)
    return found


def _tidy(param: Any) -> None:
    if isinstance(param, TyperArgument):
        if param.metavar is None and param.name:
            param.metavar = param.name.upper()
        if type(param) is TyperArgument:
            # typer builds its own parameter objects; the subclass only changes help
            param.__class__ = _NamedArgument
    elif isinstance(param, TyperOption) and not param.is_flag and param.metavar is None:
        param.metavar = (param.name or "value").upper()
