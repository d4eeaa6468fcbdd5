"""The circuit breaker's state machine on a frozen clock (``relay.domain.breaker``)."""

from __future__ import annotations

import pytest

from relay.domain.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerPolicy,
    BreakerState,
    admit,
    force,
    record,
)
from relay.domain.durations import MINUTE, SECOND

POLICY = BreakerPolicy(
    failures=3, window_ns=MINUTE, cooldown_ns=10 * SECOND, max_cooldown_ns=25 * SECOND
)


def fail_times(state: BreakerState, *times: float) -> BreakerState:
    for i, t in enumerate(times):
        state, _ = record(state, POLICY, t, f"m{i}", ok=False)
    return state


def test_n_consecutive_failures_within_the_window_open_the_breaker() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0)
    assert state.state == CLOSED
    state, change = record(state, POLICY, 2.0, "m3", ok=False)
    assert state.state == OPEN
    assert change is not None
    assert (change.state, change.cause, change.failures, change.cooldown_s) == (
        OPEN, "failures", 3, 10.0,
    )  # fmt: skip


def test_a_success_resets_the_count() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0)
    state, change = record(state, POLICY, 2.0, "ok", ok=True)
    assert (state, change) == (BreakerState(), None)
    state = fail_times(state, 3.0, 4.0)
    assert state.state == CLOSED


def test_failures_older_than_the_window_do_not_count() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0, 61.5)
    assert state.state == CLOSED
    assert state.failures == (61.5,)


def test_results_that_do_not_count_leave_the_state_alone() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0)
    assert record(state, POLICY, 2.0, "released", ok=None) == (state, None)


def test_open_holds_until_the_cooldown_then_lets_exactly_one_probe_through() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0, 2.0)
    decision, state, change = admit(state, POLICY, 11.9, "a")
    assert (decision, state.state, change) == ("hold", OPEN, None)
    decision, state, change = admit(state, POLICY, 12.0, "probe")
    assert (decision, state.state) == ("probe", HALF_OPEN)
    assert change is not None
    assert change.state == HALF_OPEN
    # while the probe runs, everything else is held; the probe itself may be asked again
    assert admit(state, POLICY, 13.0, "b")[0] == "hold"
    assert admit(state, POLICY, 13.0, "probe")[0] == "probe"


def test_a_successful_probe_closes_the_breaker() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0, 2.0)
    _, state, _ = admit(state, POLICY, 12.0, "probe")
    state, change = record(state, POLICY, 13.0, "probe", ok=True)
    assert state == BreakerState()
    assert change is not None
    assert (change.state, change.cause) == (CLOSED, "probe_succeeded")
    assert admit(state, POLICY, 13.0, "any")[0] == "run"


def test_a_failed_probe_reopens_with_the_cooldown_doubled_up_to_the_cap() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0, 2.0)
    now, cooldowns = 2.0, []
    for i in range(3):
        now += state.cooldown_s
        _, state, _ = admit(state, POLICY, now, f"p{i}")
        state, change = record(state, POLICY, now, f"p{i}", ok=False)
        assert change is not None
        assert (change.state, change.cause) == (OPEN, "probe_failed")
        cooldowns.append(state.cooldown_s)
    assert cooldowns == [20.0, 25.0, 25.0]
    assert admit(state, POLICY, now + 24.9, "x")[0] == "hold"


def test_a_probe_without_a_result_hands_its_turn_to_the_next_invocation() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0, 2.0)
    _, state, _ = admit(state, POLICY, 12.0, "probe")
    state, change = record(state, POLICY, 12.5, "probe", ok=None)
    assert (state.state, change) == (HALF_OPEN, None)
    assert admit(state, POLICY, 12.6, "next")[0] == "probe"


def test_only_the_probe_decides_while_half_open() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0, 2.0)
    _, state, _ = admit(state, POLICY, 12.0, "probe")
    # an invocation admitted before the breaker opened finishes late: ignored
    assert record(state, POLICY, 12.1, "old", ok=True) == (state, None)
    assert record(state, POLICY, 12.1, "old", ok=False) == (state, None)


def test_forced_open_holds_without_probes_until_forced_closed() -> None:
    state, change = force(BreakerState(), POLICY, 0.0, open_=True)
    assert change is not None
    assert (state.state, state.forced, change.cause) == (OPEN, True, "forced")
    assert admit(state, POLICY, 10_000.0, "a")[0] == "hold"
    assert record(state, POLICY, 1.0, "a", ok=True) == (state, None)
    state, change = force(state, POLICY, 1.0, open_=False)
    assert state == BreakerState()
    assert change is not None
    assert (change.state, change.cause) == (CLOSED, "forced")


def test_forcing_works_on_a_function_without_a_breaker_policy() -> None:
    state, _ = force(BreakerState(), None, 0.0, open_=True)
    assert admit(state, None, 1.0, "a")[0] == "hold"


def test_forcing_the_current_state_again_is_no_transition() -> None:
    opened, _ = force(BreakerState(), POLICY, 0.0, open_=True)
    assert force(opened, POLICY, 1.0, open_=True) == (opened, None)
    assert force(BreakerState(), POLICY, 1.0, open_=False) == (BreakerState(), None)


def test_a_breaker_removed_from_the_template_closes() -> None:
    state = fail_times(BreakerState(), 0.0, 1.0, 2.0)
    decision, state, change = admit(state, None, 3.0, "a")
    assert (decision, state) == ("run", BreakerState())
    assert change is not None
    assert (change.state, change.cause) == (CLOSED, "disabled")


@pytest.mark.parametrize("failures", [1, 2])
def test_the_threshold_is_the_policy_s(failures: int) -> None:
    policy = BreakerPolicy(failures=failures)
    state = BreakerState()
    for i in range(failures):
        state, _ = record(state, policy, float(i), str(i), ok=False)
    assert state.state == OPEN
