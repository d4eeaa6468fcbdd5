"""``relay start --processes N``: what each child is given, and how ``relay stats``
adds the processes' stats up."""

from __future__ import annotations

import os
from pathlib import Path

from relay.domain.stats import StatsSnapshot, combined
from relay.entrypoints.config import load_settings
from relay.entrypoints.supervisor import SUPERVISOR_PID, child_env

ENV = {
    "REDIS_URI": "redis://127.0.0.1:6379",
    "REDIS_STREAM": "events",
    "REDIS_GROUP": "relay",
    "RELAY_HOSTNAME": "box",
    "RELAY_RUN_DIR": "/tmp/relay-run",
    "METRICS_ADDR": "127.0.0.1:9100",
    "GIT_WEBHOOK_ADDR": "0.0.0.0:9000",
}


def test_each_child_has_its_run_directory_consumer_name_and_ports() -> None:
    settings = load_settings(ENV)
    first, second = child_env(ENV, settings, 0), child_env(ENV, settings, 1)
    assert (first["RELAY_HOSTNAME"], second["RELAY_HOSTNAME"]) == ("box", "box-1")
    assert first["RELAY_RUN_DIR"] == str(Path("/tmp/relay-run/0"))
    assert second["RELAY_RUN_DIR"] == str(Path("/tmp/relay-run/1"))
    assert (first["RELAY_PROCESS_INDEX"], second["RELAY_PROCESS_INDEX"]) == ("0", "1")
    assert first[SUPERVISOR_PID] == second[SUPERVISOR_PID] == str(os.getpid())
    # one webhook per host (process 0); metrics on the next port
    assert first["GIT_WEBHOOK_ADDR"] == "0.0.0.0:9000"
    assert "GIT_WEBHOOK_ADDR" not in second
    assert (first["METRICS_ADDR"], second["METRICS_ADDR"]) == ("127.0.0.1:9100", "127.0.0.1:9101")
    assert load_settings(second).process == 1
    assert "RELAY_DIRECT_DIR" not in second  # the run directory's, per process already


def test_a_shared_socket_directory_is_split_per_process() -> None:
    """Each process empties its socket directory at start: sharing one, a process
    would delete the sockets of the others' containers."""
    env = {**ENV, "RELAY_DIRECT_DIR": "/run/relay-sockets/box/containers"}
    settings = load_settings(env)
    assert [child_env(env, settings, i)["RELAY_DIRECT_DIR"] for i in (0, 1)] == [
        "/run/relay-sockets/box/containers/0",
        "/run/relay-sockets/box/containers/1",
    ]


def test_stats_of_several_processes_add_up_but_the_backlog_is_sampled() -> None:
    a = StatsSnapshot(
        totals={"events_received": 3, "pending_entries": 9},
        functions={"f": {"events_matched": 2}},
        updated_at=10.0,
        timestamps={"f": {"last_success_at": 5.0}},
    )
    b = StatsSnapshot(
        totals={"events_received": 4, "pending_entries": 7},
        functions={"f": {"events_matched": 1}, "g": {"events_matched": 4}},
        updated_at=20.0,
        timestamps={"f": {"last_success_at": 8.0}},
    )
    both = combined([a, b])
    assert both.total("events_received") == 7
    assert both.total("pending_entries") == 7  # the latest sample, not 16
    assert both.function("f")["events_matched"] == 3
    assert both.function("g")["events_matched"] == 4
    assert both.last("f") == {"last_success_at": 8.0}
    assert both.updated_at == 20.0
    assert combined([a]) is a
