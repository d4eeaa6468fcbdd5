"""The ``SyncGit`` handler and the coalescing scheduler behind the webhook that
sends it, on a gated fake sync."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.subscribers import subscribe
from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain.commands import SyncGit
from relay.domain.git import GitError, SyncSummary
from relay.domain.messages import DomainEvent
from tests.fakes_compose import sync_loop

pytestmark = pytest.mark.anyio


class GatedSync:
    """A sync that waits for ``release`` each time; counts starts and finishes."""

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.running = 0
        self.peak = 0
        self.release = anyio.Event()
        self.fail_next = False

    async def __call__(self) -> SyncSummary:
        self.started += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        self.release = anyio.Event()
        self.finished += 1
        if self.fail_next:
            self.fail_next = False
            raise GitError("cannot reach example.invalid: Connection refused")
        return SyncSummary(commit=f"c{self.finished}", functions=1)


async def wait_for(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 - polling a fake's plain attribute
            await anyio.sleep(0.001)


async def settle(predicate: Callable[[], bool]) -> None:
    """Assert ``predicate`` holds over a sustained window of event-loop turns."""
    for _ in range(200):
        assert predicate()
        await anyio.lowlevel.checkpoint()


async def test_twenty_pushes_during_a_sync_give_exactly_one_follow_up() -> None:
    gated = GatedSync()
    events: list[DomainEvent] = []
    scheduler = sync_loop(gated, events.append)
    async with anyio.create_task_group() as tg:
        await tg.start(scheduler.run)
        scheduler.request()
        await wait_for(lambda: gated.started == 1)
        for _ in range(20):
            scheduler.request()  # returns at once: the caller never runs a sync
        gated.release.set()
        await wait_for(lambda: gated.started == 2)
        gated.release.set()
        await wait_for(lambda: gated.finished == 2)
        await settle(lambda: gated.started == 2)  # no third sync, ever
        tg.cancel_scope.cancel()
    assert gated.peak == 1  # never two at once
    assert scheduler.requests == 21
    assert [e for e in events if isinstance(e, ev.GitSyncFinished)] == [
        ev.GitSyncFinished(ok=True, commit="c1"),
        ev.GitSyncFinished(ok=True, commit="c2"),
    ]


async def test_a_failed_sync_is_logged_and_counted_and_the_next_request_still_runs() -> None:
    gated = GatedSync()
    bus = MessageBus({})
    metrics = Metrics()
    subscribe(bus, metrics)
    scheduler = sync_loop(gated, lambda _e: None, bus)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(scheduler.run)
            gated.fail_next = True
            scheduler.request()
            await wait_for(lambda: gated.started == 1)
            gated.release.set()
            await wait_for(lambda: gated.finished == 1)
            scheduler.request()
            await wait_for(lambda: gated.started == 2)
            gated.release.set()
            await wait_for(lambda: gated.finished == 2)
            tg.cancel_scope.cancel()
    failed = [line for line in logs if line["event"] == "git_sync_failed"]
    assert failed == [{"event": "git_sync_failed", "log_level": "warning",
                       "error": "cannot reach example.invalid: Connection refused"}]
    sample = metrics.registry.get_sample_value
    assert sample("git_syncs_total", {"outcome": "failure"}) == 1
    assert sample("git_syncs_total", {"outcome": "success"}) == 1


async def test_nothing_runs_without_a_request() -> None:
    gated = GatedSync()
    scheduler = sync_loop(gated, lambda _e: None)
    async with anyio.create_task_group() as tg:
        await tg.start(scheduler.run)
        await settle(lambda: gated.started == 0)
        tg.cancel_scope.cancel()


async def test_an_unexpected_exception_from_one_sync_is_one_line_and_the_loop_goes_on() -> None:
    calls: list[int] = []
    events: list[DomainEvent] = []

    async def sync() -> SyncSummary:
        calls.append(1)
        if len(calls) == 1:
            raise UnicodeEncodeError("utf-8", "caf\udce9", 3, 4, "surrogates not allowed")
        return SyncSummary(commit="c2", functions=1)

    scheduler = sync_loop(sync, events.append)
    with capture_logs() as logs:
        async with anyio.create_task_group() as tg:
            await tg.start(scheduler.run)
            scheduler.request()
            await wait_for(lambda: len(events) == 1)
            scheduler.request()
            await wait_for(lambda: len(events) == 2)
            tg.cancel_scope.cancel()
    first, second = events
    assert isinstance(first, ev.GitSyncFinished)
    assert not first.ok
    assert first.error is not None
    assert first.error.startswith("UnicodeEncodeError: 'utf-8' codec can't encode")
    assert isinstance(second, ev.GitSyncFinished)
    assert second.ok
    (failed,) = [e for e in logs if e["event"] == "git_sync_failed"]
    assert failed["log_level"] == "error"


async def test_a_sync_sent_by_the_cli_answers_what_it_did_and_counts_like_the_webhooks() -> None:
    events: list[DomainEvent] = []
    bus = MessageBus({})
    sync_loop(lambda: _summary("c9"), events.append, bus)
    result = await bus.send(SyncGit(trigger="cli", directory="/functions/"))
    assert result.commit == "c9"
    assert result.directory == "/functions"
    assert events == [ev.GitSyncFinished(ok=True, commit="c9")]


async def test_a_sync_of_another_directory_than_the_workers_is_refused(tmp_path: Path) -> None:
    events: list[DomainEvent] = []
    bus = MessageBus({})
    sync_loop(lambda: _summary("c1"), events.append, bus)
    with pytest.raises(GitError) as info:
        await bus.send(SyncGit(directory=str(tmp_path)))
    assert str(info.value) == (
        f"the running worker serves /functions, not {tmp_path}: "
        "run `relay git sync` without --functions, or stop the worker first"
    )
    assert events == []  # nothing ran: nothing to count


async def test_a_failed_sync_reaches_its_sender_as_one_line() -> None:
    async def broken() -> SyncSummary:
        raise GitError("cannot reach example.invalid: Connection refused")

    bus = MessageBus({})
    sync_loop(broken, lambda _e: None, bus)
    with pytest.raises(GitError) as info:
        await bus.send(SyncGit())
    assert str(info.value) == "cannot reach example.invalid: Connection refused"


async def _summary(commit: str) -> SyncSummary:
    return SyncSummary(commit=commit, functions=1)
