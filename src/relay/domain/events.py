"""Domain events: facts observed by the state view, metrics, logs and the CLI."""

from __future__ import annotations

import msgspec

from relay.domain.messages import DomainEvent

__all__ = ["DomainEvent"]


# --- execution: warm container pool (observed by metrics and stats) ---------------
class ContainerAcquired(DomainEvent, frozen=True, kw_only=True):
    """A container was leased: ``outcome`` is ``warm`` (an idle one was reused,
    possibly after a wait) or ``cold`` (a fresh one was started). ``wait_s`` is
    the end-to-end acquire time, including any wait and the cold start."""

    function: str
    outcome: str
    wait_s: float


class ContainerDiscarded(DomainEvent, frozen=True, kw_only=True):
    """A container was torn down instead of pooled; ``reason`` is one of
    ``relay.domain.execution.DISCARD_REASONS`` (removal-time discards are not
    reported)."""

    function: str
    reason: str


class ContainerWaited(DomainEvent, frozen=True, kw_only=True):
    """An acquire blocked at the pool bound (``runtime_container_waits_total``)."""

    function: str


# --- function lifecycle (observed by the state view and logs) ----------------------
class HandlerSummary(msgspec.Struct, frozen=True, kw_only=True):
    """An event rule as the state view shows it."""

    handler: str
    timeout_ns: int
    retries: int


class ScheduleSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A schedule as the state view shows it."""

    handler: str
    cron: str
    timezone: str
    timeout_ns: int
    retries: int
    catchup_ns: int = 0
    overlap: str = "allow"


class ServiceSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A service as the state view shows it: its one source plus routing and size."""

    entrypoint: str | None = None
    build: str | None = None
    image: str | None = None
    host: str | None = None
    path: str | None = None
    port: int = 80
    replicas: int = 1


class FunctionSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What the state view records of a template: env values and secret
    REFERENCES (names in the secret store), never secret values."""

    runtime: str | None
    concurrency: int
    handlers: tuple[HandlerSummary, ...] = ()
    schedules: tuple[ScheduleSummary, ...] = ()
    services: tuple[ServiceSummary, ...] = ()
    env: dict[str, str] = {}
    secrets: dict[str, str] = {}


class FunctionDiscovered(DomainEvent, frozen=True, kw_only=True):
    """A function with a valid template and no serving version yet: it is
    ``pending`` (its matched events stay pending) while its first image builds."""

    name: str
    directory: str
    summary: FunctionSummary
    at: float


class FunctionSkipped(DomainEvent, frozen=True, kw_only=True):
    """A directory that is not a function (invalid name); logged once, not served."""

    name: str
    reason: str
    at: float


class FunctionPrepared(DomainEvent, frozen=True, kw_only=True):
    """A version of ``name`` is ready and now serving (``built`` is False when an
    existing image for the fingerprint was reused). ``fingerprint`` is the full
    64-hex SHA-256 of the selected source. ``at`` is when this reconcile
    succeeded; it differs from ``prepared_at`` when a version that was already
    serving is confirmed again after a failure (None: the same as ``prepared_at``)."""

    name: str
    directory: str
    runtime: str | None
    image: str
    fingerprint: str
    dependency_image: str | None
    built: bool
    prepared_at: float
    summary: FunctionSummary
    at: float | None = None


class FunctionReconcileFailed(DomainEvent, frozen=True, kw_only=True):
    """A reconcile of ``name`` failed (invalid template or failed build). The
    previous version, if any, keeps serving: ``image``/``fingerprint``/
    ``prepared_at``/``summary`` describe it (``image`` None: never built, and
    ``summary`` is then the new template's when it was valid)."""

    name: str
    error: str
    at: float
    runtime: str | None = None
    image: str | None = None
    fingerprint: str | None = None
    prepared_at: float | None = None
    summary: FunctionSummary | None = None


class ReplicaState(msgspec.Struct, frozen=True, kw_only=True):
    """One replica slot of a service: ``running``, ``missing`` (nothing runs in
    the slot, e.g. after a crash or a failed start) or ``replacing`` (a stale
    replica still serves while its replacement could not start)."""

    slot: int
    state: str


class ServiceState(msgspec.Struct, frozen=True, kw_only=True):
    """A service after one convergence pass; ``rule`` is the effective Traefik
    router rule of a routed service; ``error`` why the pass could not converge."""

    identity: str
    display: str
    replicas: tuple[ReplicaState, ...] = ()
    rule: str | None = None
    error: str | None = None


class ServicesConverged(DomainEvent, frozen=True, kw_only=True):
    """The services of ``name`` after a pass that changed what the state view
    shows (published only on a change, not on every periodic pass)."""

    name: str
    services: tuple[ServiceState, ...]
    at: float


class FunctionRemoved(DomainEvent, frozen=True, kw_only=True):
    """``name`` no longer matches events; its in-flight work drains, its images go."""

    name: str
    at: float


# --- delivery: classification, invocations, dead letters (metrics, stats, logs) ----
# ``message_id`` is the stream entry id; it is never a metric label.
class EventClassified(DomainEvent, frozen=True, kw_only=True):
    """The first classification of a logical event (never repeated on a redelivery):
    ``events_received_total`` and ``events_matched_total``/``events_unmatched_total``;
    ``functions`` (deduplicated, in match order) feeds ``function_events_matched_total``."""

    message_id: str
    matched: bool
    functions: tuple[str, ...] = ()


class InvocationStarted(DomainEvent, frozen=True, kw_only=True):
    """Attempt ``attempt`` (1-based, counted at claim) of ``function/handler`` began."""

    function: str
    handler: str
    message_id: str
    attempt: int


class InvocationSucceeded(DomainEvent, frozen=True, kw_only=True):
    """``handler_success_total``, ``handler_invocations_total{outcome="success"}``."""

    function: str
    handler: str
    message_id: str
    attempt: int
    duration_s: float


class InvocationFailed(DomainEvent, frozen=True, kw_only=True):
    """A failed attempt with attempts left; the next waits ``retry_in_s``
    (``handler_failure_total``, ``retries_total``)."""

    function: str
    handler: str
    message_id: str
    attempt: int
    duration_s: float
    error: str
    exit_code: int | None = None
    retry_in_s: float = 0.0


class InvocationExhausted(DomainEvent, frozen=True, kw_only=True):
    """The last attempt failed (or its worker died before a result): terminal.
    ``duration_s`` is 0 when no result was recorded."""

    function: str
    handler: str
    message_id: str
    attempt: int
    duration_s: float
    error: str
    exit_code: int | None = None


class InvocationDeferred(DomainEvent, frozen=True, kw_only=True):
    """A claimed invocation was released without running (``reason``:
    ``slot_unavailable``, ``shutdown``, ``lease_lost``, ``lease_unrenewable`` or
    ``breaker_open``); no attempt charged."""

    function: str
    handler: str
    message_id: str
    reason: str


class InvocationFenced(DomainEvent, frozen=True, kw_only=True):
    """A result arrived after this worker's claim was taken over by a newer
    attempt; the ledger refused it (the newer attempt's state stands)."""

    function: str
    handler: str
    message_id: str
    attempt: int


class LeaseRenewed(DomainEvent, frozen=True, kw_only=True):
    """Right before the handler started, its claim had ``remaining_ms`` left, too
    little for its timeout (a slow container start): it was renewed to
    ``lease_ms`` from then."""

    function: str
    handler: str
    message_id: str
    attempt: int
    remaining_ms: int
    lease_ms: int


class InvocationCrashed(DomainEvent, frozen=True, kw_only=True):
    """An adapter raised an unexpected exception while serving an invocation (a
    bug): the attempt fails with only the exception's type as its error; the
    traceback goes to the worker log, never to the ledger or the DLQ."""

    function: str
    handler: str
    message_id: str
    exc: BaseException


class EventMalformed(DomainEvent, frozen=True, kw_only=True):
    """The event cannot be decoded or classified (``reason``); it is dead-lettered
    at once under ``-`` placeholders."""

    message_id: str
    reason: str


class LedgerUnavailable(DomainEvent, frozen=True, kw_only=True):
    """A ledger call (``begin``, ``finish``, ``malformed``) failed: what it would
    have recorded is not known to be recorded; the message stays pending."""

    message_id: str
    call: str
    error: str


class MessageDeadLettered(DomainEvent, frozen=True, kw_only=True):
    """One DLQ entry was written (``dlq_entries_total``). ``function``/``handler``
    are ``-`` for a malformed or oversized message (``handler_attempts`` 0)."""

    function: str
    handler: str
    message_id: str
    entry_id: str
    handler_attempts: int
    reason: str


class DeadLetterWriteFailed(DomainEvent, frozen=True, kw_only=True):
    """The DLQ write failed; the message stays pending and is routed on a later
    delivery without re-running anything."""

    message_id: str
    error: str


class MessageAcknowledged(DomainEvent, frozen=True, kw_only=True):
    """The message left the pending list. ``outcome``: ``completed``,
    ``dead_lettered``, ``unmatched`` or ``malformed``."""

    message_id: str
    outcome: str


class DeliveryLost(DomainEvent, frozen=True, kw_only=True):
    """The broker no longer holds this delivery for this consumer (another consumer
    took the message first): nothing was claimed or settled, nothing more is done."""

    message_id: str


class MessageKeptPending(DomainEvent, frozen=True, kw_only=True):
    """The message stays pending (``reason``: ``retrying``, ``in_progress``,
    ``building``, ``function_unavailable``, ``deferred``, ``dlq_failed`` or
    ``claim_failed``)."""

    message_id: str
    reason: str


class PendingEntryDropped(DomainEvent, frozen=True, kw_only=True):
    """A pending entry whose body was deleted or trimmed was removed from the
    pending list without running anything."""

    message_id: str


# --- control plane: manual invocation (metrics) -------------------------------------
class HandlerInvoked(DomainEvent, frozen=True, kw_only=True):
    """A handler ran for ``relay function invoke`` (outside delivery: no message,
    no attempt, no retry). Feeds ``handler_invocations_total`` and
    ``handler_duration_seconds`` only; never the event or delivery counters."""

    function: str
    handler: str
    ok: bool
    duration_s: float
    error: str = ""


# --- git sync (metrics and logs) ------------------------------------------------------
class GitSyncFinished(DomainEvent, frozen=True, kw_only=True):
    """A sync the worker ran (``SyncGit``: from the webhook, or ``relay git sync``
    while the worker runs) ended: ``ok`` with the commit now served, or not with
    a one-line ``error``. Feeds ``git_syncs_total{outcome}``."""

    ok: bool
    commit: str = ""
    error: str = ""


class GitWebhookDelivered(DomainEvent, frozen=True, kw_only=True):
    """A webhook delivery was answered; ``outcome`` is one of
    ``relay.domain.git.DeliveryOutcome``. Feeds ``git_webhook_deliveries_total``."""

    outcome: str


# --- HTTP ingest (metrics) ------------------------------------------------------------
class IngestAnswered(DomainEvent, frozen=True, kw_only=True):
    """A ``POST /v1/events`` was answered with ``status`` (one of
    ``relay.domain.ingest.STATUSES``); ``events`` appended by it (0 unless 202).
    Feeds ``ingest_requests_total{status}`` and ``ingest_events_total``."""

    status: int
    events: int = 0


# --- schedules: publication (scheduler loop) and delivery of occurrences ------------
class OccurrencePublished(DomainEvent, frozen=True, kw_only=True):
    """This worker's publish-if-new wrote the occurrence's stream entry
    (``schedule_occurrences_published_total``; ``caught_up`` also feeds
    ``schedule_occurrences_caught_up_total``: it was missed and published at start)."""

    function: str
    handler: str
    occurrence_id: str
    entry_id: str
    caught_up: bool = False


class OccurrenceDuplicate(DomainEvent, frozen=True, kw_only=True):
    """Another worker had published the occurrence already: a clean no-op
    (``schedule_occurrences_duplicate_total``)."""

    function: str
    handler: str
    occurrence_id: str


class OccurrencePublishFailed(DomainEvent, frozen=True, kw_only=True):
    """Every bounded attempt to publish failed (``schedule_publish_failures_total``);
    this worker's tick is lost, the other workers still publish it. ``first`` is
    true for the first failure after a success (an outage logs one warning, not
    one per schedule per second)."""

    function: str
    handler: str
    occurrence_id: str
    attempts: int
    error: str
    first: bool = True


class OccurrencePublishRecovered(DomainEvent, frozen=True, kw_only=True):
    """A publish succeeded again after ``failed`` failed ones."""

    failed: int


class OccurrenceObsolete(DomainEvent, frozen=True, kw_only=True):
    """A delivered occurrence whose function or schedule was removed: acknowledged
    without a run or a DLQ entry (``schedule_occurrences_obsolete_total``)."""

    function: str
    handler: str
    message_id: str
    occurrence_id: str


class OccurrenceForged(DomainEvent, frozen=True, kw_only=True):
    """A delivered occurrence that is not the entry publish-if-new appended for it (a
    copy published by hand, or re-published): acknowledged without a run or a DLQ
    entry; the WARN line carries :data:`relay.domain.schedule.FORGED_REASON`."""

    function: str
    handler: str
    message_id: str
    occurrence_id: str


class OccurrenceSkipped(DomainEvent, frozen=True, kw_only=True):
    """``overlap: skip``: an earlier occurrence of the schedule was not terminal, so
    this one was acknowledged without a run (``schedule_occurrences_skipped_total``)."""

    function: str
    handler: str
    message_id: str
    occurrence_id: str


# --- circuit breaker (observed by metrics and logs) ---------------------------------
class BreakerOpened(DomainEvent, frozen=True, kw_only=True):
    """``function``'s breaker opened on this worker: its invocations are held (not
    run, not charged) for ``cooldown_s`` (``cause``: ``failures``, ``probe_failed``
    or ``forced``, the last held until forced closed)."""

    function: str
    cause: str
    failures: int
    cooldown_s: float


class BreakerHalfOpened(DomainEvent, frozen=True, kw_only=True):
    """The cooldown passed: one probe invocation of ``function`` runs, others wait."""

    function: str
    message_id: str


class BreakerClosed(DomainEvent, frozen=True, kw_only=True):
    """``function``'s breaker closed (``cause``: ``probe_succeeded``, ``forced`` or
    ``disabled``, the template no longer has one): everything runs again."""

    function: str
    cause: str
