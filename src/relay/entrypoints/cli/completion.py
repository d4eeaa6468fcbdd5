"""Shell completion of the values Relay knows: function names and DLQ entry ids.

``relay function inspect <TAB>`` offers the functions the worker loaded (the state
database, read only) and the function directories of ``/functions`` and
``./functions``; ``relay dlq inspect|rm|replay <TAB>`` the newest dead-letter ids
(the embedded broker's file, or Redis with a half-second timeout). A completion
that cannot answer offers nothing: it never prints, raises or waits.

Which argument completes what is one table here, by command path and parameter
name; the lazy group (``lazy.py``) attaches it to each command it loads, so no
command module changes for it. ``tests/unit/test_cli_completion.py`` checks the
table against the app.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# Every command's load imports this module (lazy.py), so what a completion needs
# is imported in the completion: running `relay publish` pays for none of it.

LIMIT = 100  # ids offered at most: the newest, as `relay dlq ls` lists them
_TIMEOUT_S = 0.5


def function_names() -> list[str]:
    from relay.entrypoints.config import DEFAULT_FUNCTIONS_DIR, load_paths

    names = set(_sqlite(load_paths(os.environ).database, "SELECT name FROM functions"))
    for root in (DEFAULT_FUNCTIONS_DIR, Path("functions")):
        with contextlib.suppress(OSError):
            names.update(d.name for d in root.iterdir() if (d / "template.yaml").is_file())
    return sorted(names)


def dlq_ids() -> list[str]:
    from relay.adapters.admin import recent_dead_letter_ids
    from relay.entrypoints.config import load_broker_settings

    try:
        broker, redis = load_broker_settings(os.environ, need_group=False)
    except Exception:  # noqa: BLE001 - no settings: nothing to offer
        return []
    return recent_dead_letter_ids(broker, redis, limit=LIMIT, timeout_s=_TIMEOUT_S)


def _sqlite(path: Path, sql: str) -> list[str]:
    from relay.adapters.admin import read_only_column

    return read_only_column(path, sql, _TIMEOUT_S)


# (command path, parameter name) -> the values it completes to
COMPLETIONS: dict[tuple[tuple[str, ...], str], Callable[[], list[str]]] = {
    (("function", "inspect"), "name"): function_names,
    (("function", "invoke"), "name"): function_names,
    (("function", "breaker", "open"), "name"): function_names,
    (("function", "breaker", "close"), "name"): function_names,
    (("dlq", "inspect"), "entry_id"): dlq_ids,
    (("dlq", "rm"), "entry_id"): dlq_ids,
    (("dlq", "replay"), "entry_id"): dlq_ids,
}


def add_completions(command: Any, path: tuple[str, ...]) -> None:
    """Attach the table's completions to ``command`` (at ``path``) and its subcommands."""
    for param in getattr(command, "params", ()):
        values = COMPLETIONS.get((path, param.name))
        if values is not None:
            param._custom_shell_complete = _completer(values)
    # a lazy group's commands as built so far (the rest get theirs when it loads them)
    commands = getattr(command, "commands", {})
    for name, sub in getattr(commands, "loaded", commands).items():
        add_completions(sub, (*path, name))


def _completer(values: Callable[[], list[str]]) -> Callable[[Any, Any, str], list[str]]:
    def complete(_ctx: Any, _param: Any, incomplete: str) -> list[str]:
        try:
            return _matching(values(), incomplete)
        except Exception:  # noqa: BLE001 - a completion never fails the shell
            return []

    return complete


def _matching(values: Iterable[str], incomplete: str) -> list[str]:
    return [value for value in values if value.startswith(incomplete)]
