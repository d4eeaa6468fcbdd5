"""The bulk DLQ selection and its pacing: pure parsing and matching, and the
replay loop driven by an in-memory clock and worker."""

from __future__ import annotations

import io
import itertools

import pytest

from relay.adapters.control.client import ControlRequestError, WorkerUnavailable
from relay.domain.dead_letters import StoredDeadLetter
from relay.domain.dlq_selection import (
    InvalidSelection,
    RateLimit,
    Selection,
    parse_limit,
    parse_rate,
    parse_time_bound,
)
from relay.domain.outcome import DeadLetterEntry
from relay.entrypoints.cli.dlq_bulk_replay import Progress, replay_all

NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1h", NOW_MS - 3_600_000),
        ("90s", NOW_MS - 90_000),
        ("7d", NOW_MS - 7 * 86_400_000),
        ("0s", NOW_MS),
        ("2026-01-01T00:00:00Z", NOW_MS),
        ("2026-01-01T01:00:00+01:00", NOW_MS),
        ("2026-01-01", NOW_MS),
    ],
)
def test_time_bounds_are_a_duration_back_from_now_or_an_rfc3339_time(
    text: str, expected: int
) -> None:
    assert parse_time_bound("--since", text, now_ms=NOW_MS) == expected


@pytest.mark.parametrize("text", ["bogus", "1y", "-1h", "2026-01-01T00:00:00", "2026-13-01", ""])
def test_a_bad_time_bound_is_one_line_naming_the_flag(text: str) -> None:
    with pytest.raises(InvalidSelection) as caught:
        parse_time_bound("--until", text, now_ms=NOW_MS)
    message = str(caught.value)
    assert message.startswith("--until ")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("text", "per_s"), [("5/s", 5.0), ("5", 5.0), ("120/m", 2.0), ("3600/h", 1.0), ("0.5/s", 0.5)]
)
def test_rates(text: str, per_s: float) -> None:
    assert parse_rate(text).per_s == per_s


@pytest.mark.parametrize("text", ["0/s", "0", "-1/s", "fast", "5/d", "1001/s", ""])
def test_a_bad_rate_is_refused(text: str) -> None:
    with pytest.raises(InvalidSelection, match="--rate"):
        parse_rate(text)


@pytest.mark.parametrize("text", ["0", "-3", "ten", "1.5", ""])
def test_a_limit_is_a_positive_whole_number(text: str) -> None:
    with pytest.raises(InvalidSelection, match="--limit"):
        parse_limit(text)
    assert parse_limit("25") == 25
    assert parse_limit("0", zero_means_all=True) is None  # ls --limit 0: all


def test_ls_says_that_zero_means_all_when_refusing_a_limit() -> None:
    with pytest.raises(InvalidSelection, match="or 0 for all"):
        parse_limit("-1", zero_means_all=True)


def test_selection_matches_every_given_condition_and_nothing_else() -> None:
    chosen = Selection(
        function="fn", handler="h", since_ms=100, until_ms=200, reason="TIMEOUT", limit=None
    )

    def hit(**changes: object) -> bool:
        fields: dict[str, object] = {
            "function": "fn",
            "handler": "h",
            "reason": "handler timed out (timeout 6s)",
            "written_ms": 150,
        }
        fields.update(changes)
        return chosen.matches(**fields)  # type: ignore[arg-type]

    assert hit()
    assert hit(written_ms=100)
    assert hit(written_ms=200)
    assert not hit(written_ms=99)
    assert not hit(written_ms=201)
    assert not hit(function="other")
    assert not hit(handler="other")
    assert not hit(reason="exit status 1")
    assert Selection().matches(function="a", handler="b", reason="", written_ms=0)
    assert not Selection().narrows
    assert Selection(until_ms=5).narrows


def test_the_limit_spaces_starts_so_n_replays_take_at_least_n_minus_one_intervals() -> None:
    pace = RateLimit(4.0)
    assert [pace.start_offset_s(i) for i in range(3)] == [0.0, 0.25, 0.5]
    assert pace.wait_s(2, elapsed_s=0.1) == pytest.approx(0.4)
    assert pace.wait_s(2, elapsed_s=0.9) == 0.0


class SteppingClock:
    """Monotonic seconds that move only when the code sleeps (or a send takes time)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def stored(n: int, handler: str = "h", function: str = "fn") -> StoredDeadLetter:
    entry = DeadLetterEntry(
        original_stream="events",
        original_id=f"{n}-0",
        group="g",
        consumer="c",
        event="{}",
        reason="exhausted",
        function=function,
        handler=handler,
        deliveries=1,
        handler_attempts=1,
        timestamp="",
    )
    return StoredDeadLetter(f"{1000 + n}-0", entry)


class FakeWorker:
    """Answers ``dlq_replay`` like the worker: per entry id, ok or an error."""

    def __init__(self, clock: SteppingClock, errors: dict[str, BaseException]) -> None:
        self.clock = clock
        self.errors = errors
        self.sent: list[tuple[str, float]] = []

    def __call__(self, entry_id: str) -> None:
        self.sent.append((entry_id, self.clock.now))
        self.clock.now += 0.001  # each replay takes a little time
        error = self.errors.get(entry_id)
        if error is not None:
            raise error


def test_replays_are_paced_and_sorted_into_replayed_failed_and_skipped() -> None:
    clock = SteppingClock()
    entries = [stored(9, handler="-", function="-")] + [stored(i) for i in range(5)]
    worker = FakeWorker(
        clock,
        {
            "1001-0": ControlRequestError("this handler always fails", "ReplayFailed"),
            "1003-0": ControlRequestError("no dead-letter entry 1003-0", "DeadLetterNotFound"),
        },
    )
    result = replay_all(
        entries,
        rate=RateLimit(10.0),
        send=worker,
        progress=Progress(io.StringIO(), len(entries)),
        clock=clock,
        sleep=clock.sleep,
    )
    starts = [at for _id, at in worker.sent]
    assert [entry_id for entry_id, _at in worker.sent] == [e.id for e in entries[1:]]
    assert starts[0] == 0.0  # the skipped entry cost no pacing slot
    assert starts[-1] >= 0.4 - 1e-9  # 5 requests at 10/s: at least 4 intervals
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(starts))
    assert result.replayed == ["1000-0", "1002-0", "1004-0"]
    assert result.failed == ["1001-0"]
    assert result.skipped == ["1009-0", "1003-0"]  # malformed (never sent); already gone
    assert not result.interrupted
    assert result.summary().startswith("Replayed 3, failed again 1, skipped 2 of 6 selected")


def test_ctrl_c_during_a_replay_stops_the_run_and_names_the_entry_in_flight() -> None:
    clock = SteppingClock()
    worker = FakeWorker(clock, {"1002-0": KeyboardInterrupt()})
    entries = [stored(i) for i in range(5)]
    result = replay_all(
        entries,
        rate=RateLimit(100.0),
        send=worker,
        progress=Progress(io.StringIO(), len(entries)),
        clock=clock,
        sleep=clock.sleep,
    )
    assert result.interrupted
    assert result.replayed == ["1000-0", "1001-0"]
    assert result.in_flight == "1002-0"
    assert len(worker.sent) == 3  # nothing sent after Ctrl-C
    summary = result.summary()
    assert "interrupted, 3 not attempted" in summary
    assert "1002-0 was in flight" in summary


def test_a_worker_that_goes_away_stops_the_run_and_keeps_the_rest() -> None:
    clock = SteppingClock()
    worker = FakeWorker(clock, {"1001-0": WorkerUnavailable("no relay worker is running")})
    entries = [stored(i) for i in range(4)]
    result = replay_all(
        entries,
        rate=RateLimit(100.0),
        send=worker,
        progress=Progress(io.StringIO(), len(entries)),
        clock=clock,
        sleep=clock.sleep,
    )
    assert result.replayed == ["1000-0"]
    assert result.failed == []
    assert len(worker.sent) == 2
    assert result.stopped_by is not None
    assert "3 not attempted" in result.summary()


def test_progress_is_plain_lines_when_not_a_terminal() -> None:
    clock = SteppingClock()
    stream = io.StringIO()
    entries = [stored(0), stored(1)]
    replay_all(
        entries,
        rate=RateLimit(100.0),
        send=FakeWorker(clock, {}),
        progress=Progress(stream, 2),
        clock=clock,
        sleep=clock.sleep,
    )
    assert stream.getvalue().splitlines() == [
        "[1/2] replayed 1000-0 (fn/h)",
        "[2/2] replayed 1001-0 (fn/h)",
    ]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_is_one_bar_redrawn_in_place() -> None:
    clock = SteppingClock()
    stream = Terminal()
    entries = [stored(0), stored(1)]
    worker = FakeWorker(clock, {"1001-0": ControlRequestError("boom", "ReplayFailed")})
    replay_all(
        entries,
        rate=RateLimit(100.0),
        send=worker,
        progress=Progress(stream, 2),
        clock=clock,
        sleep=clock.sleep,
    )
    text = stream.getvalue()
    assert text.count("\n") == 1  # the bar's line ends once, after the run
    frames = text.rstrip("\n").split("\r")[1:]
    assert frames[-1] == f"[{'#' * 30}] 2/2  replayed 1  failed 1  skipped 0"
    assert frames[0].startswith(f"[{'#' * 15}{'-' * 15}] 1/2")
