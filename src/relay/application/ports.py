"""Ports: the roles Relay's use cases need from the outside world.

Each is a ``typing.Protocol`` named for its role. Adapters are named technology +
role (``RedisEventStream``); in-memory fakes for unit tests live in
``tests/fakes.py`` as ``InMemory...``. Each area owns its section below.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from relay.domain.dead_letters import StoredDeadLetter
from relay.domain.execution import InvocationRequest, InvocationResult, PoolSnapshot
from relay.domain.functions import BuildTemplate, FunctionImage
from relay.domain.git import GitSyncResult
from relay.domain.message_facts import MessageFacts
from relay.domain.outcome import (
    BeginRequest,
    BeginResult,
    FinishRequest,
    MalformedRequest,
    Reclaimed,
    RenewRequest,
    Settlement,
    StreamMessage,
)
from relay.domain.publication import Publication
from relay.domain.schedule import Envelope
from relay.domain.services import DesiredService, ObservedReplica, ResolvedImage
from relay.domain.stats import StatsSnapshot
from relay.domain.template import ServiceSpec, Template

if TYPE_CHECKING:
    from relay.application.dry_run import SampledEntry

# --- time and randomness ---------------------------------------------------------
# Awaited by the runtime right before a handler starts (see ContainerRuntime.invoke).
StartGuard = Callable[[], Awaitable[None]]


class Clock(Protocol):
    """Wall-clock and monotonic time, injected so decisions are testable."""

    def now(self) -> float:
        """Seconds since the epoch (UTC)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic clock, for timeouts and ages."""
        ...


class TokenSource(Protocol):
    """Random fencing tokens and ids."""

    def token(self) -> str: ...


# --- event stream and invocation ledger (delivery) --------------------------------
class EventStream(Protocol):
    """One consumer of one consumer group on the event stream.

    Implemented by ``relay.adapters.redis.stream.RedisEventStream``.
    """

    @property
    def stream(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def consumer(self) -> str: ...

    async def ensure_group(self) -> None:
        """Create the group at ``0`` with MKSTREAM unless it exists (a new group
        over an existing stream replays its backlog)."""
        ...

    async def read(
        self, count: int, block_ms: int, patience_s: float = 10.0
    ) -> Sequence[StreamMessage]:
        """Up to ``count`` new messages for this consumer, waiting at most ``block_ms``.

        A broker that has not answered ``patience_s`` after the block time is over
        (frozen, partitioned) fails the read with :class:`DependencyUnavailable`.
        The bound is the adapter's to keep because it is on every read: a cancel
        scope around each one was about 5% of the worker's CPU at a steady rate."""
        ...

    async def reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        """Take over up to ``count`` messages pending longer than ``min_idle_ms``
        (one scan step; ``Reclaimed.deleted`` lists entries whose body is gone)."""
        ...

    async def drop(self, ids: Sequence[str]) -> None:
        """Remove dangling ids (deleted or trimmed bodies) from the pending list;
        their ledger hashes expire after ``LEDGER_RETENTION``, as an acknowledged
        message's do."""
        ...


class EventPublisher(Protocol):
    """Appends events to the broker the worker or CLI runs on (every producer's
    one way in: ``relay publish``, the DLQ republish, HTTP ingest)."""

    async def append(self, publications: Sequence[Publication]) -> list[str]:
        """Append in order; the message ids, returned only once every one is
        durable. Invalid delivery options raise before anything is written
        (:class:`relay.domain.publication.InvalidPublication`: a delay beyond the
        bound, a bad idempotency key; ``InvalidPriority`` on the embedded broker).
        A publication whose key was appended within the window answers with that
        first id and adds nothing; a delayed one on Redis answers with a delayed
        id (``delayed-<due ms>-<n>``, docs/producing.md), the stream id coming
        when it is moved into the stream."""
        ...


class InvocationLedger(Protocol):
    """The fenced per-message invocation state, the message's classification,
    its dead-letter entries and its acknowledgment, each call one atomic step.

    Implemented by ``relay.adapters.redis.ledger.RedisInvocationLedger``.
    A call, once made, runs to its end (or its own bounded timeout) even when
    the calling task is cancelled meanwhile: the result of a handler that ran
    is not dropped on the way to the ledger by a shutdown.
    """

    async def begin(self, request: BeginRequest) -> BeginResult:
        """Classify once, claim every eligible invocation of ``request.claims``
        with ``request.token``; when nothing was claimed, also settle the message
        (dead-letter entries first, then ACK) if every gate is terminal."""
        ...

    async def finish(self, request: FinishRequest) -> Settlement:
        """Apply each fenced attempt report, then settle the message as ``begin``."""
        ...

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        """Write the message's one placeholder DLQ entry (once), then ACK."""
        ...

    async def begin_many(self, requests: Sequence[BeginRequest]) -> list[BeginResult]:
        """``begin`` for every request of a batch (distinct messages), in one atomic
        call (one script on Redis; one transaction on SQLite); answers in order.
        Raises ``DependencyUnavailable`` when the call failed (then nothing was
        claimed; every request is safe to repeat with its token)."""
        ...

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[Settlement]:
        """``finish`` for every request of a group (distinct messages), in one
        atomic call; answers in order. Raises ``DependencyUnavailable``."""
        ...

    async def renew(self, request: RenewRequest) -> int:
        """Extend a claim still held by ``request.token`` to at least ``lease_ms``
        from now; its new deadline, or 0 when the claim is no longer ours."""
        ...


# --- container runtime (execution) ------------------------------------------------
class ContainerRuntime(Protocol):
    """Warm, hardened execution containers, one pool per function and image version.

    Implemented by ``relay.adapters.docker.runtime.DockerContainerRuntime``.
    """

    def activate(self, function: str, image: str, runtime: str, capacity: int) -> None:
        """Make ``image`` the function's current version (an image change drains
        the old one) and set its pool capacity (resized live)."""
        ...

    def remove(self, function: str) -> None:
        """The function is gone: idle containers go now, busy ones on release."""
        ...

    async def invoke(
        self, request: InvocationRequest, *, guard: StartGuard | None = None
    ) -> InvocationResult:
        """Lease a warm container (created lazily up to capacity), run one
        request in it, then release or discard it. A handler failure is a
        result, not an exception; raises ``RuntimeUnavailable`` only when no
        container could serve the request (the handler never ran).

        ``guard`` is awaited once the container is ready, right before the
        request is sent: what it raises (``LeaseLost``) propagates, with the
        container returned to the pool and the handler never started."""
        ...

    def snapshot(self, function: str) -> PoolSnapshot | None:
        """Live gauges and cumulative counters; ``None`` for an unknown function."""
        ...

    async def aclose(self) -> None:
        """Discard every container (reason ``shutdown``)."""
        ...


# --- images and functions (lifecycle) ---------------------------------------------
class ImageBuilder(Protocol):
    """Builds, reuses and retires function images (``relay-fn-*``) and their
    shared dependency images (``relay-dep-*``).

    Implemented by ``relay.adapters.docker.images.DockerImageBuilder``.
    """

    async def prepare(
        self, function: str, directory: Path, template: BuildTemplate
    ) -> FunctionImage:
        """The image for the function's current source: reused without a build
        when its tag exists, else built (dependency image first). Raises
        ``BuildError`` (one line; ``output`` holds the capped build log)."""
        ...

    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        """Remove the function's images not in ``keep`` and not referenced by any
        container's ``relay.image`` label; then collect unreferenced dependency
        images. Returns the removed function image tags (or ids)."""
        ...

    async def collect_dependency_images(self) -> list[str]:
        """Remove ``relay-dep-*`` images no function image is built from."""
        ...


class DiscoveredFunction(NamedTuple):
    """A direct subdirectory of the functions directory (a candidate function)."""

    name: str
    directory: str
    has_template: bool


class FunctionSource(Protocol):
    """The functions directory, read only. Blocking: callers use worker threads.

    Implemented by ``relay.adapters.fs.discovery.FsFunctionSource``.
    """

    def scan(self) -> list[DiscoveredFunction]:
        """Every candidate function directory, sorted by name. Raises ``OSError``
        when the functions directory itself cannot be read."""
        ...

    def directory_of(self, name: str) -> str:
        """Where function ``name`` lives (whether or not it exists)."""
        ...

    def load_template(self, directory: str) -> Template | None:
        """The directory's validated template; ``None`` when ``template.yaml`` is
        absent (or the directory is gone). Raises ``TemplateError``."""
        ...


# --- persistent services (lifecycle) ------------------------------------------------
class ServiceImages(Protocol):
    """Resolves a service's desired image before any container action.

    Implemented by ``relay.adapters.docker.services.DockerServiceImages``.
    """

    async def resolve(
        self,
        function: str,
        directory: Path,
        service: ServiceSpec,
        *,
        runtime: str | None,
        function_image: str | None,
    ) -> ResolvedImage:
        """The image the service's replicas run: the function image with the
        runtime's command (``entrypoint``), a built image (``build``) or the
        external reference, inspected and pulled when due (``image``). Raises a
        ``RelayError`` with one line naming the service when it cannot."""
        ...

    async def source_version(self, function: str, directory: Path) -> FunctionImage:
        """A version for a template without a runtime (only ``build``/``image``
        services): the source fingerprint, no function image (``image`` empty)."""
        ...


class ServiceContainers(Protocol):
    """This worker's service containers (scoped by ``relay.hostname``).

    Implemented by ``relay.adapters.docker.services.DockerServiceContainers``.
    """

    async def observe(self, function: str | None = None) -> list[ObservedReplica]:
        """Every service container of this worker (of ``function`` when given), any state."""
        ...

    async def start(self, desired: DesiredService, slot: int) -> str:
        """Create and start one hardened replica; returns its id once running.
        Raises ``RelayError`` when it could not start (nothing is left behind)."""
        ...

    async def remove(self, container_id: str) -> None:
        """Stop and delete a replica; an already gone one is fine."""
        ...

    async def network_exists(self, name: str) -> bool:
        """Whether the Docker network exists (Relay never creates one)."""
        ...


# --- state view, stats and secrets -------------------------------------------------
class SecretStore(Protocol):
    """Named secret values. ``get`` raises ``SecretNotFound``."""

    def get(self, name: str) -> str: ...

    def names(self) -> list[str]: ...

    def set(self, name: str, value: str) -> None: ...

    def remove(self, name: str) -> None: ...


# --- git source ------------------------------------------------------------------------
class GitSyncer(Protocol):
    """Brings the functions directory to the configured git source
    (``relay.adapters.git.sync.GitSyncService``); raises ``GitError`` in one line."""

    functions_dir: Path

    async def sync_functions(self) -> GitSyncResult: ...


class StatsSource(Protocol):
    """The live cumulative counters (the worker's metrics registry)."""

    def snapshot(self) -> StatsSnapshot:
        """The counters and backlog gauges now."""
        ...

    def restore(self, persisted: StatsSnapshot) -> None:
        """Start the counters from persisted totals (once, at startup)."""
        ...


class StatsStore(Protocol):
    """The persisted ``stats`` and ``function_stats`` snapshots.

    Implemented by ``relay.adapters.sqlite.stats_store.SqliteStatsStore``.
    """

    async def load(self) -> StatsSnapshot:
        """The latest persisted snapshot; empty (zeros, ``updated_at`` None) if none."""
        ...

    async def save(self, snapshot: StatsSnapshot, at: float) -> None:
        """Replace the global row and every listed function's row, atomically."""
        ...

    async def reset(self, at: float) -> None:
        """Zero every cumulative counter in place (rows kept; backlog gauges kept)."""
        ...


# --- what the use cases that run handlers need (dispatch, invoke, replay) ----------
class CatalogSource(Protocol):
    """The serving functions: ``relay.application.registry.FunctionRegistry``."""

    def current(self) -> Any: ...


class SlotPool(Protocol):
    """Concurrency slots: ``relay.application.concurrency.Slots``."""

    def acquire(self, function: str) -> AbstractAsyncContextManager[None]: ...


class Invoker(Protocol):
    """The part of ``ContainerRuntime`` that runs one request."""

    async def invoke(
        self, request: InvocationRequest, *, guard: StartGuard | None = None
    ) -> InvocationResult: ...


# --- schedules ----------------------------------------------------------------------
class OccurrencePublisher(Protocol):
    """Publish-if-new of schedule occurrences into the event stream.

    Implemented by ``relay.adapters.redis.schedules.RedisOccurrencePublisher`` and
    ``relay.adapters.sqlite.broker.schedules.SqliteOccurrencePublisher``.
    """

    async def publish(self, occurrence: Envelope) -> str | None:
        """In one atomic step: unless the occurrence's dedup key exists, set it
        (7-day TTL) and append the entry whose one field ``event`` is the encoded
        envelope. The new entry's id, or ``None`` when it was published already.
        Raises ``DependencyUnavailable``; then neither the key nor the entry exists."""
        ...


class OccurrenceHistory(Protocol):
    """What the dispatcher asks the broker about a delivered occurrence: whether it
    is the entry publish-if-new appended, and the overlap policy (``overlap: skip``).

    Implemented by ``relay.adapters.redis.schedules.RedisOccurrenceHistory`` and
    ``relay.adapters.sqlite.broker.schedules.SqliteOccurrenceHistory``.
    """

    async def unfinished_before(self, prefix: str, message_id: str) -> bool:
        """Whether an entry older than ``message_id`` is still pending in the group
        (not terminal) and is an occurrence whose id starts with ``prefix``.
        Raises ``DependencyUnavailable``."""
        ...

    async def published_as(self, occurrence_id: str) -> str | None:
        """The message id publish-if-new appended for ``occurrence_id`` on this
        stream: ``""`` for a live record of the previous layout (it names none),
        ``None`` when no live record exists. Raises ``DependencyUnavailable``."""
        ...


# --- dry runs -----------------------------------------------------------------------
class StreamSample(Protocol):
    """Recent entries of one stream, read without consuming anything (no group read,
    no claim, no acknowledgement), for ``relay function match --from-stream``.

    Implemented by ``relay.adapters.redis.stream_sample.RedisStreamSample`` and
    ``relay.adapters.sqlite.broker.sample.SqliteStreamSample``.
    """

    async def check(self) -> None:
        """Raise ``StreamNotFound`` when the stream does not exist (one line)."""
        ...

    async def server_ms(self) -> int:
        """Now, in ms, on the clock that stamps the entry ids."""
        ...

    def newest(self, *, since_ms: int | None, limit: int) -> AsyncIterator[SampledEntry]:
        """Up to ``limit`` entries, newest first, none older than ``since_ms``."""
        ...


# --- read sides: what the CLI (and the console) read through ------------------------
# Both brokers implement each; ``relay.adapters.admin.open_admin_broker`` is the one
# place the configured broker is chosen. Contract suites: tests/contract/
# test_dead_letter_reader_contract.py, test_message_facts_contract.py.
class DeadLetterTrim(Protocol):
    """The part of :class:`DeadLetterStore` that ``DLQ_RETENTION`` uses."""

    @property
    def key(self) -> str:
        """Where the entries live, for messages (the DLQ stream key; the file)."""
        ...

    async def trim_before(self, cutoff_ms: int) -> int:
        """Delete every entry written before ``cutoff_ms``; how many went."""
        ...


class DeadLetterSource(Protocol):
    """The part of :class:`DeadLetterStore` that ``relay dlq replay`` uses."""

    async def get(self, entry_id: str) -> StoredDeadLetter:
        """The entry with exactly this id; raises ``DeadLetterNotFound`` (or
        ``InvalidEntryId`` for a text that is no entry id)."""
        ...

    async def discard(self, entry_id: str) -> bool:
        """Delete the entry if it is still there; ``True`` when this call removed it."""
        ...


class DeadLetterStore(DeadLetterTrim, DeadLetterSource, Protocol):
    """The dead-letter entries of one stream: read, select (page through) and remove.

    Implemented by ``relay.adapters.redis.dlq_reader.RedisDeadLetterReader`` and
    ``relay.adapters.sqlite.broker.dlq.SqliteDeadLetterReader``; entry ids are
    ``<ms>-<seq>`` on both. Raises ``DependencyUnavailable`` when the broker fails.
    """

    async def count(self) -> int: ...

    async def page(
        self, *, newest_first: bool = True, count: int = 100, after: str | None = None
    ) -> list[StoredDeadLetter]:
        """Up to ``count`` entries in the chosen order, starting past ``after``."""
        ...

    def entries(
        self, *, newest_first: bool = True, page_size: int = 100
    ) -> AsyncIterator[StoredDeadLetter]:
        """Every entry, read ``page_size`` at a time."""
        ...

    async def delete(self, entry_id: str) -> None:
        """Delete exactly this entry; raises ``DeadLetterNotFound`` if absent."""
        ...


class MessageFactsReader(Protocol):
    """What the broker knows about one message: its ledger, body, pending state and
    dead-letter entries, read-only (``relay trace``; the domain gives the verdict).

    Implemented by ``relay.adapters.redis.message_facts.RedisMessageFacts`` and
    ``relay.adapters.sqlite.broker.message_facts.SqliteMessageFacts``.
    """

    async def facts(self, message_id: str) -> MessageFacts:
        """The facts at the broker's clock. Raises ``ConfigError`` (one line naming
        the variable) when the configured stream or group does not exist, and
        ``DependencyUnavailable`` when the broker fails."""
        ...


class AdminBroker(Protocol):
    """The admin side of the configured broker (``open_admin_broker``)."""

    @property
    def kind(self) -> str:
        """``redis`` or ``sqlite`` (``RELAY_BROKER``), for output that names it."""
        ...

    @property
    def dead_letters(self) -> DeadLetterStore: ...

    @property
    def facts(self) -> MessageFactsReader: ...

    @property
    def sample(self) -> StreamSample: ...

    async def target_problem(self, *, group: bool) -> str | None:
        """Why the configured stream (and, with ``group``, its consumer group)
        cannot be read, as one line; ``None`` when it can."""
        ...

    async def append(self, payload: bytes) -> str:
        """Append one event to the stream (no priority); its message id."""
        ...

    async def latest_published(self, prefixes: Collection[str]) -> dict[str, str]:
        """Each schedule prefix's latest occurrence id still remembered."""
        ...

    @property
    def priorities(self) -> bool:
        """Whether events carry a priority class (the embedded broker only)."""
        ...

    @property
    def events(self) -> EventPublisher:
        """The broker's one way in for new events (what the worker's ingest uses)."""
        ...

    async def publish(
        self,
        batches: Iterable[Sequence[Publication]],
        done: Callable[[list[str]], None],
    ) -> None:
        """Append each batch in order through :attr:`events`, one ``append`` per
        batch, calling ``done`` with its new ids; raises ``DependencyUnavailable``
        naming how many were appended before the failure (Redis)."""
        ...

    async def unread_note(self, group: str) -> str | None:
        """One line when no consumer group (``group``, or any when empty) reads the
        stream yet; the events wait there for the worker that creates it."""
        ...


# --- structural roles of single use cases ----------------------------------------
class FunctionSlots(Protocol):
    """The per-function concurrency limits (``relay.application.concurrency.Slots``)."""

    def effective(self, capacity: int) -> int: ...

    def resize(self, function: str, capacity: int) -> None: ...

    def forget(self, function: str) -> None: ...


class FunctionBreakers(Protocol):
    """The per-function circuit breakers (``relay.application.breakers.BreakerBoard``)."""

    def forget(self, function: str) -> None: ...


class Intake(Protocol):
    """A loop that takes messages (the consumer and recovery loops)."""

    def stop_reading(self) -> None: ...


class PoolReader(Protocol):
    """The part of ``ContainerRuntime`` that reports a pool."""

    def snapshot(self, function: str) -> PoolSnapshot | None: ...


class StatsResetter(Protocol):
    """``relay.application.stats.StatsRecorder``."""

    async def reset(self) -> None: ...
