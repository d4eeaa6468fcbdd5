"""``relay ... --help`` without Python type names.

Typer 0.29 prints each parameter's annotation in help (``--limit <int>``,
``NAME <str>``, even ``--help <bool>``). An operator reads ``--limit N``, not a
Python type. Every command is tidied once, when it is built: the root group
(``RelayGroup``) tidies what it holds, and a lazy group (``lazy.py``) each command
it loads (``tidy_tree``):

- gives every option that takes a value a metavar (its own, else its name in
  capitals: ``--ref REF``), which typer prints instead of the type;
- makes every argument show only its name (typer has no setting for that, so the
  argument's class becomes a subclass that shows no type);
- leaves flags alone: with plain (non-rich) help, a flag shows no type at all.

``tidy_tree`` also gives plain ``str``/``int`` values typer's coercion without
pydantic (``plain_values``): it is the one walk over every command built.

``tests/unit/test_cli_help.py`` walks the same tree and fails on a type name.
"""

from __future__ import annotations

from typing import Any

from typer._click import Context
from typer.core import TyperArgument, TyperGroup, TyperOption

from relay.entrypoints.cli.plain_values import use_plain_values


class _NamedArgument(TyperArgument):
    """An argument whose help shows its metavar (``NAME``) and no ``<str>``."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


class RelayGroup(TyperGroup):
    """The root ``relay`` group: see the module docstring."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        tidy_tree(self)


def tidy_tree(command: Any) -> None:
    """Tidy ``command``'s parameters and those of every subcommand already built."""
    for param in command.params:
        _tidy(param)
        use_plain_values(param)
    # click builds --help on first use and caches it: build it now, on the plain path
    # too (its value is None unless given, which typer would hand to pydantic)
    help_option = command.get_help_option(Context(command, **command.context_settings))
    if help_option is not None:
        use_plain_values(help_option)
    # typer vendors its own click: its groups are TyperGroup, not click.Group
    if isinstance(command, TyperGroup):
        loaded = getattr(command.commands, "loaded", command.commands)
        for sub in list(loaded.values()):
            tidy_tree(sub)


def _tidy(param: Any) -> None:
    if isinstance(param, TyperArgument):
        if param.metavar is None and param.name:
            param.metavar = param.name.upper()
        if type(param) is TyperArgument:
            # typer builds its own parameter objects; the subclass only changes help
            param.__class__ = _NamedArgument
    elif isinstance(param, TyperOption) and not param.is_flag and param.metavar is None:
        param.metavar = (param.name or "value").upper()
