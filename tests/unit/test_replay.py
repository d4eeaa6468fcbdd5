"""ReplayDeadLetter on the bus: exactly the recorded handler, deleted only on success."""

from __future__ import annotations

import msgspec
import pytest

from relay.application.bus import MessageBus
from relay.application.concurrency import Slots
from relay.application.registry import ActiveFunction, FunctionRegistry
from relay.application.replay import DeadLetterReplayer, NotReplayable, ReplayFailed
from relay.domain import schedule
from relay.domain.commands import ReplayDeadLetter
from relay.domain.dead_letters import StoredDeadLetter
from relay.domain.errors import RelayError
from relay.domain.execution import InvocationResult
from relay.domain.outcome import DeadLetterEntry
from relay.domain.template import parse_template
from tests.fakes import InMemoryContainerRuntime, InMemorySecretStore

pytestmark = pytest.mark.anyio

TEMPLATE = parse_template(
    {
        "runtime": "python3.14",
        "events": [
            {"handler": "events.created.handler", "pattern": {"event_name": ["INSERT"]}},
            {"handler": "events.slow.handler", "pattern": {"x": ["y"]}, "timeout": "20s"},
        ],
        "schedules": [{"handler": "jobs.nightly.handler", "cron": "0 3 * * *"}],
        "env": {"API_URL": "https://api.example.com"},
        "secrets": {"TOKEN": "api-token"},
    }
)


class NoSuchEntry(RelayError):
    pass


class InMemoryDeadLetters:
    """The read side of the DLQ stream: ``entries`` maps id to entry."""

    def __init__(self, entries: dict[str, DeadLetterEntry]) -> None:
        self.entries = dict(entries)

    async def get(self, entry_id: str) -> StoredDeadLetter:
        if entry_id not in self.entries:
            raise NoSuchEntry(f"no dead-letter entry {entry_id}")
        return StoredDeadLetter(entry_id, self.entries[entry_id])

    async def discard(self, entry_id: str) -> bool:
        return self.entries.pop(entry_id, None) is not None


def entry(function: str = "users", handler: str = "events.slow.handler") -> DeadLetterEntry:
    return DeadLetterEntry(
        original_stream="events",
        original_id="1-0",
        group="relay",
        consumer="w1",
        event='{"event_name": "MODIFY", "id": 7}',
        reason="handler failed",
        function=function,
        handler=handler,
        deliveries=6,
        handler_attempts=5,
        timestamp="2026-01-01T00:00:00.000Z",
    )


def setup(
    entries: dict[str, DeadLetterEntry], *, image: str | None = "relay-fn-users:abc"
) -> tuple[MessageBus, InMemoryContainerRuntime, InMemoryDeadLetters]:
    registry = FunctionRegistry()
    registry.put(
        ActiveFunction(
            name="users",
            directory="/functions/users",
            template=TEMPLATE,
            runtime="python3.14",
            image=image,
            fingerprint="f" * 64,
            prepared_at=1.0,
            last_error=None,
        )
    )
    runtime = InMemoryContainerRuntime()
    runtime.activate("users", "relay-fn-users:abc", "python3.14", 2)
    dead_letters = InMemoryDeadLetters(entries)
    bus = MessageBus({})
    replayer = DeadLetterReplayer(
        dead_letters=dead_letters,
        registry=registry,
        runtime=runtime,
        slots=Slots(4),
        secrets=InMemorySecretStore({"api-token": "s3cret"}),
        emit=bus.emit,
    )
    bus.register(ReplayDeadLetter, replayer)
    return bus, runtime, dead_letters


async def test_success_runs_exactly_the_recorded_handler_then_deletes_the_entry() -> None:
    bus, runtime, dlq = setup({"5-0": entry(), "6-0": entry(handler="events.created.handler")})
    summary = await bus.send(ReplayDeadLetter(entry_id="5-0"))
    assert (summary.entry_id, summary.function, summary.handler) == (
        "5-0",
        "users",
        "events.slow.handler",
    )
    [request] = runtime.requests
    assert (request.function, request.handler) == ("users", "events.slow.handler")
    assert request.event == b'{"event_name": "MODIFY", "id": 7}'  # the original bytes
    assert request.timeout_ns == 20_000_000_000  # the recorded rule's timeout
    assert request.env == {"API_URL": "https://api.example.com", "TOKEN": "s3cret"}
    assert list(dlq.entries) == ["6-0"]


async def test_a_failing_replay_keeps_the_entry() -> None:
    bus, runtime, dlq = setup({"5-0": entry()})
    runtime.script["users/events.slow.handler"] = InvocationResult(
        ok=False, error='function "users" handler "events.slow.handler": boom'
    )
    with pytest.raises(ReplayFailed, match="boom"):
        await bus.send(ReplayDeadLetter(entry_id="5-0"))
    assert list(dlq.entries) == ["5-0"]


async def test_a_schedule_handler_is_replayable() -> None:
    bus, runtime, dlq = setup({"5-0": entry(handler="jobs.nightly.handler")})
    await bus.send(ReplayDeadLetter(entry_id="5-0"))
    assert [r.handler for r in runtime.requests] == ["jobs.nightly.handler"]
    assert dlq.entries == {}


async def test_an_occurrence_replays_with_the_payload_its_run_received() -> None:
    envelope = schedule.encode(schedule.envelope("users", "jobs.nightly.handler", 1_780_282_800))
    stored = msgspec.structs.replace(
        entry(handler="jobs.nightly.handler"), event=envelope.decode()
    )
    bus, runtime, dlq = setup({"5-0": stored})
    await bus.send(ReplayDeadLetter(entry_id="5-0"))
    [request] = runtime.requests
    assert request.event == b'{"source":"relay.schedule","scheduled_at":"2026-06-01T03:00:00Z"}'
    assert dlq.entries == {}


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (entry(function="-", handler="-"), "malformed message"),
        (entry(function="gone"), 'function "gone" no longer exists'),
        (entry(handler="events.removed.handler"), 'no handler "events.removed.handler"'),
    ],
)
async def test_what_cannot_be_replayed_is_refused_and_kept(
    stored: DeadLetterEntry, message: str
) -> None:
    bus, runtime, dlq = setup({"5-0": stored})
    with pytest.raises(NotReplayable, match=message):
        await bus.send(ReplayDeadLetter(entry_id="5-0"))
    assert runtime.requests == []
    assert list(dlq.entries) == ["5-0"]


async def test_a_function_without_an_image_is_refused() -> None:
    bus, runtime, _ = setup({"5-0": entry()}, image=None)
    with pytest.raises(NotReplayable, match="not available"):
        await bus.send(ReplayDeadLetter(entry_id="5-0"))
    assert runtime.requests == []


async def test_an_unknown_id_is_the_source_error() -> None:
    bus, _, _ = setup({})
    with pytest.raises(NoSuchEntry):
        await bus.send(ReplayDeadLetter(entry_id="9-9"))
