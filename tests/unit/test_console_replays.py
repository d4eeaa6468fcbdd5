"""The console's replay queue: bounded, deduplicated, paced, outcomes kept."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from relay.application.replay import ReplayFailed, ReplaySummary
from relay.domain.commands import ReplayDeadLetter
from relay.entrypoints.console import replays
from relay.entrypoints.console.replays import ReplayQueue

pytestmark = pytest.mark.anyio


async def test_a_replay_that_fails_again_is_kept_and_said_and_the_queue_goes_on() -> None:
    sent: list[tuple[str, float]] = []
    all_sent = anyio.Event()

    async def send(command: Any) -> ReplaySummary:
        assert isinstance(command, ReplayDeadLetter)
        sent.append((command.entry_id, time.monotonic()))
        if len(sent) == 3:
            all_sent.set()
        if command.entry_id == "1-0":
            raise ReplayFailed('function "f" handler "h": RuntimeError: still failing')
        return ReplaySummary(entry_id=command.entry_id, function="f", handler="h",
                             duration_s=0.01)

    queue = ReplayQueue(send, rate="20/s")
    assert queue.add(["1-0", "2-0", "2-0", "3-0"]) == 3  # a duplicate is queued once
    async with anyio.create_task_group() as tg:
        await tg.start(queue.run)
        with anyio.fail_after(5):
            await all_sent.wait()
        await anyio.wait_all_tasks_blocked()  # the last outcome is recorded
        tg.cancel_scope.cancel()
    assert [o.entry_id for o in queue.outcomes] == ["3-0", "2-0", "1-0"]
    failed = queue.outcomes[-1]
    assert not failed.ok
    assert "still failing" in failed.detail
    assert [o.ok for o in queue.outcomes][:2] == [True, True]
    # paced: the third starts no earlier than 2/20 s after the first
    assert sent[2][1] - sent[0][1] >= 0.1 - 0.01


def test_the_queue_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replays, "QUEUE_LIMIT", 2)

    async def send(_command: Any) -> None:
        return None

    queue = ReplayQueue(send)
    assert queue.add(["1-0", "2-0", "3-0"]) == 2
    assert queue.waiting == 2


async def test_a_replay_that_crashes_is_said_and_the_queue_goes_on() -> None:
    done = anyio.Event()

    async def send(command: Any) -> ReplaySummary:
        if command.entry_id == "1-0":
            raise KeyError("a bug")
        done.set()
        return ReplaySummary(entry_id=command.entry_id, function="f", handler="h",
                             duration_s=0.01)

    queue = ReplayQueue(send, rate="100/s")
    queue.add(["1-0", "2-0"])
    async with anyio.create_task_group() as tg:
        await tg.start(queue.run)
        with anyio.fail_after(5):
            await done.wait()
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert [(o.entry_id, o.ok) for o in queue.outcomes] == [("2-0", True), ("1-0", False)]
    assert queue.outcomes[1].detail == "KeyError (see the worker log)"
