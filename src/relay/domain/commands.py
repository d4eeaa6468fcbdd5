"""Commands: everything that changes Relay's state is one of these.

Each area adds its commands here; ``relay.application.composition.compose`` maps each to
exactly one handler, and a unit test checks the table is complete. The control
commands travel over the control socket as they are (see
``relay.adapters.control.protocol``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relay.domain.messages import Command
from relay.domain.outcome import StreamMessage

__all__ = ["Command"]


# --- control plane: sent by the control socket (and so by the CLI) -----------------
class GetPoolState(Command, frozen=True, kw_only=True):
    """Return the live warm-pool snapshot of ``function`` (``None`` if it has no pool)."""

    function: str


class ResetStats(Command, frozen=True, kw_only=True):
    """Zero the persisted cumulative statistics from now on (a worker-owned baseline)."""


class InvokeFunction(Command, frozen=True, kw_only=True):
    """Run every event rule of ``function`` that matches ``event`` on the live
    runtime, outside the delivery lifecycle (no stream, ledger, DLQ or event
    counters)."""

    function: str
    event: dict[str, Any]


class ReplayDeadLetter(Command, frozen=True, kw_only=True):
    """Re-run one DLQ entry's exact handler; delete the entry only on success."""

    entry_id: str


class GetHealth(Command, frozen=True, kw_only=True):
    """Report whether this worker is ready (started, Redis and Docker answering)."""


# --- function lifecycle: discovery, images, reload ---------------------------------
class ReconcileFunction(Command, frozen=True, kw_only=True):
    """Look at ``name``'s directory and converge: prepare it, keep the previous
    version (template temporarily missing), or remove it (directory gone).

    This is THE command for "function prepared" and "function removed": which of
    the two happens is decided by looking at the directory, which only the
    handler does, so there is no separate prepare or remove command to send."""

    name: str


class ReconcileAll(Command, frozen=True, kw_only=True):
    """Re-scan the functions directory and reconcile every function (the startup
    pass and the periodic backstop)."""


class ConvergeServices(Command, frozen=True, kw_only=True):
    """Bring ``function``'s service containers to its serving version's declared
    replicas (sent by the reconciler after each reconcile of a serving function).
    ``fresh``: a new version was just swapped in; ``healing``: the new version
    failed to build and the serving one only heals its crashed replicas. The
    result is whether a service problem remains."""

    function: str
    fresh: bool = False
    healing: bool = False


# --- schedules -------------------------------------------------------------------------
class PublishOccurrence(Command, frozen=True, kw_only=True):
    """Offer the occurrence of ``function``/``handler``'s schedule at ``at`` (unix
    seconds) to the fleet's publish-if-new (sent by the scheduler loop, which
    decides the firings). The result is the stream entry id, or ``None`` when
    another worker had published it or every bounded attempt failed."""

    function: str
    handler: str
    at: int
    caught_up: bool = False


# --- git source ----------------------------------------------------------------------
class SyncGit(Command, frozen=True, kw_only=True):
    """Bring the worker's functions directory to the configured git source (the
    webhook's sync loop, and ``relay git sync`` while a worker runs). ``directory``,
    when given, must be the worker's functions directory (the CLI's ``--functions``);
    ``trigger`` names who asked, for the log."""

    trigger: str = "cli"
    directory: str | None = None


# --- delivery: one stream message through the ledger -------------------------------
class DispatchMessage(Command, frozen=True, kw_only=True):
    """Classify one delivered message, run its eligible invocations one at a time,
    then acknowledge it, dead-letter it first, or leave it pending."""

    message: StreamMessage


class DispatchBatch(Command, frozen=True, kw_only=True):
    """:class:`DispatchMessage` for every message of one read (distinct messages):
    planned together, claimed in one ledger call, attempted concurrently, settled
    in groups. ``done`` is told each message's id as its dispatch ends (its
    buffer place is free again); the result lists one report per message."""

    messages: tuple[StreamMessage, ...]
    done: Callable[[str], None] | None = None


# --- circuit breaker (control socket) ------------------------------------------------
class GetBreaker(Command, frozen=True, kw_only=True):
    """Return ``function``'s breaker on this worker (``relay function inspect``)."""

    function: str


class ForceBreaker(Command, frozen=True, kw_only=True):
    """``relay function breaker open|close``: force ``function``'s breaker ``state``
    (``open`` or ``closed``) on the live worker."""

    function: str
    state: str
