"""Command groups that import a subcommand's module only when it runs.

Importing every command module up front cost ``relay --help`` most of a second:
``dlq`` alone pulls in ``redis.asyncio`` and the SQLite broker. A lazy group knows
each subcommand's name and one-line help from a table (``Lazy`` entries) and
imports the module behind a name only when that command is resolved: to run it,
to print its own ``--help``, or to complete its arguments. Listing commands
(``relay --help``) and completing a command name read the table alone.

A target is ``"module:attr"``: a ``typer.Typer`` (a subgroup, as ``add_typer``
would add it) or a ``register(app)`` function adding commands to a Typer (the
command of that name is taken). ``tests/unit/test_cli_startup.py`` checks that each
table's help is the loaded command's own, so the table cannot drift from it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
from typer import _click
from typer._click.shell_completion import CompletionItem
from typer._click.utils import make_default_short_help
from typer.core import TyperGroup
from typer.main import get_group_from_info
from typer.models import TyperInfo

from relay.entrypoints.cli.help_format import tidy_tree
from relay.entrypoints.cli.plain_values import use_plain_values

ROOT = "relay"  # the root group's name (cli/__init__.py)


@dataclass(frozen=True)
class Lazy:
    """Where a subcommand lives, and the one line its parent's help shows."""

    target: str
    help: str


def lazy_group(commands: Mapping[str, Lazy], base: type[TyperGroup] = TyperGroup) -> type[Any]:
    """A ``TyperGroup`` class (for ``typer.Typer(cls=...)``) serving ``commands`` lazily."""
    return type("LazyGroup", (LazyGroup, base), {"lazy": dict(commands)})


class _Commands(MutableMapping[str, _click.Command]):
    """A group's ``commands``: the eager ones, then the table's, loaded on lookup."""

    def __init__(
        self, eager: MutableMapping[str, _click.Command], lazy: Mapping[str, Lazy],
        load: Callable[[str, Lazy], _click.Command],
    ) -> None:
        self._loaded = dict(eager)
        self._lazy = {name: entry for name, entry in lazy.items() if name not in eager}
        self._load = load

    def __getitem__(self, name: str) -> _click.Command:
        if name not in self._loaded:
            entry = self._lazy[name]  # KeyError for an unknown name, as a dict
            self._loaded[name] = self._load(name, entry)
        return self._loaded[name]

    def __setitem__(self, name: str, command: _click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._loaded.pop(name, None)
        self._lazy.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        # the table's order whatever was loaded first: help lists commands in it
        yield from (name for name in self._loaded if name not in self._lazy)
        yield from self._lazy

    def __len__(self) -> int:
        return len(set(self._loaded) | set(self._lazy))

    @property
    def loaded(self) -> dict[str, _click.Command]:
        """The commands built so far (``help_format.tidy_tree`` walks only these)."""
        return dict(self._loaded)

    def short_help(self, name: str, limit: int) -> str:
        """The one-line help, from the table unless the command is loaded anyway."""
        if name in self._loaded:
            return self._loaded[name].get_short_help_str(limit)
        return make_default_short_help(self._lazy[name].help, limit)


class LazyGroup(TyperGroup):
    """See the module docstring; made per table by :func:`lazy_group`."""

    lazy: ClassVar[dict[str, Lazy]] = {}

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands(self.commands, self.lazy, self._load)

    def _load(self, name: str, entry: Lazy) -> _click.Command:
        module_name, _, attr = entry.target.partition(":")
        target = getattr(importlib.import_module(module_name), attr)
        info = TyperInfo(target, name=name) if isinstance(target, typer.Typer) else None
        if info is None:
            holder = typer.Typer()
            target(holder)
            info = TyperInfo(holder)
        group = get_group_from_info(
            info, pretty_exceptions_short=True, suggest_commands=self.suggest_commands,
            rich_markup_mode=self.rich_markup_mode,
        )
        command = group if isinstance(target, typer.Typer) else group.commands[name]
        tidy_tree(command)
        from relay.entrypoints.cli.completion import add_completions  # a command loads anyway

        # the root's commands are at (name,); a nested lazy group's (`function`) under it
        add_completions(command, (name,) if self.name == ROOT else (str(self.name), name))
        return command

    def parse_args(self, ctx: _click.Context, args: list[str]) -> list[str]:
        # typer adds --install-completion/--show-completion after the group is built
        for param in self.params:
            use_plain_values(param)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(self.commands)  # names only: TyperGroup's .items() would load each

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        # TyperGroup's own loads every command for its short help; the table has it
        commands = self._lazy_commands()
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, commands.short_help(name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def shell_complete(self, ctx: _click.Context, incomplete: str) -> list[CompletionItem]:
        # command names and their help from the table: completing `relay d<TAB>`
        # imports nothing; options as click completes them
        commands = self._lazy_commands()
        results = [
            CompletionItem(name, help=commands.short_help(name, 45))
            for name in self.list_commands(ctx)
            if name.startswith(incomplete)
        ]
        results.extend(_click.Command.shell_complete(self, ctx, incomplete))
        return results

    def _lazy_commands(self) -> _Commands:
        assert isinstance(self.commands, _Commands)  # set in __init__, never replaced
        return self.commands
