"""``relay function ...``. Each group of subcommands lives in its own module,
imported only when one of its commands runs (``lazy.py``): ``relay function ls``
does not import what ``match`` needs (redis, the broker)."""

from __future__ import annotations

import typer

from relay.entrypoints.cli.lazy import Lazy, lazy_group

_FN = "relay.entrypoints.cli.fn_"

# the order is the help's; the one-line help is each command's own (checked by a test)
COMMANDS = {
    "ls": Lazy(f"{_FN}catalog:register", "List loaded functions."),
    "inspect": Lazy(
        f"{_FN}catalog:register", "Show one function's state, handlers, stats and runtime pool."
    ),
    "invoke": Lazy(
        f"{_FN}invoke:register", "Run a function's matching handlers on the live worker."
    ),
    "run": Lazy(
        f"{_FN}run:register",
        "Run one handler once in its container, without a worker (exit 1 if it fails).",
    ),
    "validate": Lazy(
        f"{_FN}authoring:register",
        "Validate function directories without Docker or Redis (exit 1 if any is invalid).",
    ),
    "match": Lazy(
        f"{_FN}authoring:register",
        "Explain which rules match an event, and why the others do not; with --from-stream or"
        " --from-dlq, count what they match in real traffic (a dry run, nothing consumed).",
    ),
    "breaker": Lazy(
        f"{_FN}breaker:register", "Force a function's circuit breaker on the live worker."
    ),
}

app = typer.Typer(
    help="Inspect, validate and exercise functions.", no_args_is_help=True,
    cls=lazy_group(COMMANDS),
)
