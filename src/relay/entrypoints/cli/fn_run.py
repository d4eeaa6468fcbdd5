"""``relay function run DIR HANDLER``: one handler, once, on this machine, with no
broker and no worker.

The function's image is built (or reused) by the builder ``relay start`` uses, so
the tag is the same and a worker started later reuses it; the handler then runs
once in one execution container made as the worker makes them (same hardening,
``NETWORKS``, the template's ``env`` and its ``secrets:`` resolved from the local
secret store, the rule's timeout), which is removed afterwards. What the handler
printed, its return value or its error, the duration and the image are printed
(``--json``: one ``relay.function.run/1`` document). Exit 0 when the handler
succeeded, 1 when it failed or could not run, 2 for a bad command line or event.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
import msgspec
import typer

from relay.domain.errors import BuildError, EventError, RelayError
from relay.domain.template import EventRule, HandlerRule, Template
from relay.entrypoints.cli.common import EXIT_INTERRUPTED, EXIT_USAGE, fail
from relay.entrypoints.cli.event_input import EventOption, read_event_argument
from relay.entrypoints.cli.fn_run_report import print_report, report_json
from relay.entrypoints.cli.json_output import JsonFlag, emit_json

RUN_CONTEXT = "run"  # RELAY_MESSAGE_ID is run-<random>: never a stream id's shape

FileOrStdin = Annotated[
    Path | None,
    typer.Option("--file", help="Read the event from this JSON file ('-': standard input)."),
]


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def run(
    directory: Annotated[Path, typer.Argument(help="The function's directory.")],
    handler: Annotated[str, typer.Argument(help="The handler to run (module.function).")],
    event: EventOption = None,
    file: FileOrStdin = None,
    as_json: JsonFlag = False,
) -> None:
    """Run one handler once in its container, without a worker (exit 1 if it fails)."""
    if file is not None and str(file) == "-" and event is None:
        file = None  # stdin, as when neither is given
    try:
        payload = read_event_argument(event, file, sys.stdin)
    except EventError as exc:
        fail(str(exc), EXIT_USAGE)
    name, path, template = _load(directory)
    rule = _rule(name, template, handler)
    if isinstance(rule, EventRule) and not rule.pattern.matches(payload, time.time()):
        typer.echo(
            f"relay: note: the event does not match the pattern of {handler}; running it anyway",
            err=True,
        )
    _quiet_logs()
    try:
        result = anyio.run(_execute, name, path, template, rule, payload)
    except BuildError as exc:
        if exc.output:  # the (capped) build log says why; the last line says what
            typer.echo(exc.output.rstrip(), err=True)
        fail(str(exc))
    except RelayError as exc:
        fail(str(exc))
    except KeyboardInterrupt:  # the runtime removed the container on the way out
        fail("interrupted; the handler's container was removed", EXIT_INTERRUPTED)
    from relay.application.invoke import HandlerRun

    shown: dict[str, Any] = msgspec.to_builtins(HandlerRun.of(handler, result))
    if as_json:
        emit_json("function.run", {"function": name, **report_json(shown)})
    else:
        print_report(shown)
    if not result.ok:
        raise typer.Exit(1)


def _load(directory: Path) -> tuple[str, Path, Template]:
    from relay.adapters.fs.templates import TEMPLATE_FILE
    from relay.entrypoints.cli.fn_loading import load

    if directory.is_file() and directory.name == TEMPLATE_FILE:
        directory = directory.parent
    if not directory.is_dir():
        fail(f"{directory}: no such directory")
    if not (directory / TEMPLATE_FILE).is_file():
        fail(f"{directory}: not a function directory (no {TEMPLATE_FILE} in it)")
    name = directory.resolve().name
    loaded = load(name, directory)
    template = loaded.template
    if template is None:
        fail(f"{directory}: invalid function: {'; '.join(loaded.problems)}")
    if template.runtime is None:
        fail(f'function "{name}" has no runtime: it has no handler to run')
    return name, directory, template


def _rule(name: str, template: Template, handler: str) -> HandlerRule:
    rules: list[HandlerRule] = [*template.events, *template.schedules]
    for rule in rules:
        if rule.handler == handler:
            return rule
    known = ", ".join(sorted({rule.handler for rule in rules})) or "none"
    fail(f'function "{name}" has no handler "{handler}" (its handlers: {known})')


def _quiet_logs() -> None:
    # the builder and the runtime log as the worker's do: warnings only, on stderr,
    # so stdout is the report (or the one JSON document)
    from relay.entrypoints.logging import configure_logging

    configure_logging("WARN", sys.stderr)


async def _execute(
    name: str, directory: Path, template: Template, rule: HandlerRule, event: dict[str, Any]
) -> Any:
    from relay.adapters.docker.connection import connect_docker, engine_is_local
    from relay.adapters.docker.images import DockerImageBuilder
    from relay.adapters.docker.networks import verify_networks
    from relay.adapters.docker.runtime import DockerContainerRuntime
    from relay.adapters.fs.secrets import FileSecretStore
    from relay.application.environment import resolve_environment
    from relay.domain.execution import InvocationRequest, clamp_timeout_ns
    from relay.domain.handler_context import HandlerContext
    from relay.entrypoints.config import load_paths, parse_list

    env = resolve_environment(
        template.env, template.secrets, FileSecretStore(load_paths(os.environ).secrets_dir)
    )
    networks = parse_list(os.environ.get("NETWORKS", ""))
    request = InvocationRequest(
        function=name, handler=rule.handler, event=msgspec.json.encode(event), env=env,
        timeout_ns=clamp_timeout_ns(rule.timeout_ns), context=RUN_CONTEXT,
        handler_context=HandlerContext(message_id=f"{RUN_CONTEXT}-{os.urandom(8).hex()}"),
        capture_output=True,
    )
    docker = await connect_docker()
    try:
        await verify_networks(docker, networks)
        image = await DockerImageBuilder(docker).prepare(name, directory, template)
        with tempfile.TemporaryDirectory(prefix="relay-run-") as sockets:
            runtime = DockerContainerRuntime(
                docker, hostname=_hostname(), networks=networks, output=_ignore,
                direct_dir=Path(sockets) if engine_is_local(docker) else None,
            )
            async with runtime:
                runtime.activate(name, image.image, image.runtime, 1)
                return await runtime.invoke(request)
    finally:
        await docker.close()


def _hostname() -> str:
    # the containers' owner label: never the worker's own, so a worker starting
    # on this machine meanwhile does not sweep this run's container as its orphan
    base = os.environ.get("RELAY_HOSTNAME") or socket.gethostname()
    return f"{base}/run-{os.getpid()}"


def _ignore(_line: str) -> None:
    return None  # the lines are captured in the result and printed with it
