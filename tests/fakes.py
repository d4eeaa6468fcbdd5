"""In-memory fakes of the ports, for unit tests. Fakes record what happened as
plain attributes; they are never mocks of Relay's own modules."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import msgspec

from relay.adapters.docker.runtimes import APP_DIR, RUNTIMES
from relay.adapters.fs.source import read_sources, select_sources
from relay.adapters.fs.templates import TEMPLATE_FILE, load_template_text
from relay.application.dead_letter_pages import PagedEntries
from relay.application.ports import DiscoveredFunction, StartGuard
from relay.domain import ledger_rules, schedule
from relay.domain.dead_letters import DeadLetterNotFound, StoredDeadLetter, parse_entry_id
from relay.domain.errors import BuildError, DependencyUnavailable, RelayError
from relay.domain.execution import (
    InvocationRequest,
    InvocationResult,
    PoolSnapshot,
    RuntimeUnavailable,
    SecretNotFound,
)
from relay.domain.functions import BuildTemplate, FunctionImage
from relay.domain.ledger_rules import DeadLetterWriteError
from relay.domain.names import validate_secret_name
from relay.domain.outcome import (
    BeginRequest,
    BeginResult,
    DeadLetterEntry,
    FinishRequest,
    MalformedRequest,
    MessageContext,
    Reclaimed,
    RenewRequest,
    Settlement,
    StreamMessage,
    split_field,
)
from relay.domain.retention import StreamId
from relay.domain.schedule import Envelope
from relay.domain.services import DesiredService, ObservedReplica, ResolvedImage
from relay.domain.source import fingerprint, image_tag
from relay.domain.stats import GLOBAL_KEYS, StatsSnapshot, zeroed
from relay.domain.template import ServiceSpec, Template


class ClosingTransport:
    """The closing half of a fake asyncio transport: ``close`` (or ``abort``)
    tells the protocol ``connection_lost`` once, on the next loop iteration, as
    a real transport does. Subclasses add ``write``."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        self.protocol = protocol
        self.loop = asyncio.get_running_loop()
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon(self.protocol.connection_lost, None)


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self._now = now
        self._mono = 1000.0

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += seconds
        self._mono += seconds


class SequentialTokens:
    """Predictable fencing tokens: t1, t2, ..."""

    def __init__(self) -> None:
        self._n = itertools.count(1)

    def token(self) -> str:
        return f"t{next(self._n)}"


# --- execution: secrets and the container runtime ------------------------------------
class InMemorySecretStore:
    """``SecretStore`` in a dict; ``reads`` records every name looked up. Names are
    judged by the domain's rule, as the filesystem store does."""

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.values: dict[str, str] = dict(values or {})
        self.reads: list[str] = []

    def get(self, name: str) -> str:
        validate_secret_name(name)
        self.reads.append(name)
        try:
            return self.values[name]
        except KeyError:
            raise SecretNotFound(f'secret "{name}" is not set') from None

    def names(self) -> list[str]:
        return sorted(self.values)

    def set(self, name: str, value: str) -> None:
        validate_secret_name(name)
        self.values[name] = value

    def remove(self, name: str) -> None:
        validate_secret_name(name)
        if self.values.pop(name, None) is None:
            raise SecretNotFound(f'secret "{name}" is not set')


ScriptedOutcome = (
    InvocationResult
    | Callable[[InvocationRequest], InvocationResult | Awaitable[InvocationResult]]
)


class _FakePool:
    """One function's warm pool as the Docker runtime keeps it, without containers:
    ``idle`` holds the image of each idle container."""

    def __init__(self, image: str, capacity: int) -> None:
        self.image = image
        self.capacity = max(1, capacity)
        self.idle: list[str] = []
        self.busy = 0
        self.warm_acquires = 0
        self.cold_starts = 0
        self.discarded = 0

    def lease(self) -> str:
        if self.idle:
            self.warm_acquires += 1
            self.idle.pop()
        else:
            self.cold_starts += 1
        self.busy += 1
        return self.image

    def release(self, image: str, discard: bool) -> None:
        self.busy -= 1
        at_capacity = len(self.idle) + self.busy >= self.capacity
        if discard or image != self.image or at_capacity:
            self.discarded += 1
        else:
            self.idle.append(image)

    def drop_idle(self, keep: int = 0) -> None:
        gone = max(0, len(self.idle) - keep)
        self.discarded += gone
        self.idle = self.idle[gone:]


class InMemoryContainerRuntime:
    """``ContainerRuntime`` without containers.

    ``script`` maps ``"function/handler"`` to a ready ``InvocationResult`` or a
    callable ``(request) -> result`` (sync or async); unscripted handlers succeed.
    ``requests`` records every invocation that started, ``active`` the (image,
    runtime, capacity) per function, ``running``/``max_running`` concurrent
    invocations. ``start_delay_s[function]`` advances ``clock`` before the
    start guard runs, as a slow container start would; ``during_start[function]``
    (once) runs then too, for what another worker does meanwhile. ``snapshot``
    counts as the Docker runtime's pool does (proven by
    ``tests/contract/test_container_runtime_contract.py``): a container per lease
    when none is idle, kept after a run unless the result was ``discarded``.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock
        self.start_delay_s: dict[str, float] = {}
        self.during_start: dict[str, Callable[[], Awaitable[None]]] = {}
        self.script: dict[str, ScriptedOutcome] = {}
        self.requests: list[InvocationRequest] = []
        self.active: dict[str, tuple[str, str, int]] = {}
        self.removed: list[str] = []
        self.running = 0
        self.max_running = 0
        self.closed = False
        self._pools: dict[str, _FakePool] = {}

    def activate(self, function: str, image: str, runtime: str, capacity: int) -> None:
        self.active[function] = (image, runtime, capacity)
        pool = self._pools.get(function)
        if pool is None:
            self._pools[function] = _FakePool(image, capacity)
            return
        if image != pool.image:
            pool.image = image
            pool.drop_idle()
        pool.capacity = max(1, capacity)
        pool.drop_idle(keep=pool.capacity - pool.busy)

    def remove(self, function: str) -> None:
        self.active.pop(function, None)
        self.removed.append(function)
        pool = self._pools.pop(function, None)
        if pool is not None:
            pool.drop_idle()

    async def invoke(
        self, request: InvocationRequest, *, guard: StartGuard | None = None
    ) -> InvocationResult:
        pool = self._pools.get(request.function)
        if pool is None or self.closed:
            raise RuntimeUnavailable(f'function "{request.function}" is not active')
        image = pool.lease()
        try:
            await self._start(request, guard)
        except BaseException:
            pool.release(image, discard=self.closed)
            raise
        result: InvocationResult | None = None
        try:
            result = await self._run(request)
            return result
        finally:
            gone = result is None or result.discarded is not None or self.closed
            pool.release(image, discard=gone or self._pools.get(request.function) is not pool)

    async def _start(self, request: InvocationRequest, guard: StartGuard | None) -> None:
        start = self.start_delay_s.get(request.function, 0.0)
        if start and self.clock is not None:
            self.clock.advance(start)  # a slow container start, on the world's clock
        meanwhile = self.during_start.pop(request.function, None)
        if meanwhile is not None:
            await meanwhile()
        if guard is not None:
            await guard()

    async def _run(self, request: InvocationRequest) -> InvocationResult:
        self.requests.append(request)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        try:
            await anyio.lowlevel.checkpoint()
            outcome = self.script.get(f"{request.function}/{request.handler}")
            if outcome is None:
                return InvocationResult(ok=True)
            if isinstance(outcome, InvocationResult):
                return outcome
            result = outcome(request)
            if isinstance(result, InvocationResult):
                return result
            return await result
        finally:
            self.running -= 1

    def snapshot(self, function: str) -> PoolSnapshot | None:
        pool = self._pools.get(function)
        if pool is None:
            return None
        return PoolSnapshot(
            capacity=pool.capacity,
            containers=len(pool.idle) + pool.busy,
            busy=pool.busy,
            idle=len(pool.idle),
            starting=0,
            warm_acquires=pool.warm_acquires,
            cold_starts=pool.cold_starts,
            discarded=pool.discarded,
        )

    async def aclose(self) -> None:
        self.closed = True
        for pool in self._pools.values():
            pool.drop_idle()


# --- lifecycle: images ----------------------------------------------------------------
class InMemoryImageBuilder:
    """``ImageBuilder`` without Docker.

    The fingerprint and the tag are the Docker builder's own (the ``.gitignore``
    selection of the directory, :func:`relay.domain.source.fingerprint`,
    ``relay-fn-<name>:<first 16 hex>``), and a template without a known runtime
    fails as it does there (proven by ``tests/contract/test_image_builder_contract.py``).
    ``images`` holds the existing images per function (an existing one is reused,
    ``built=False``). Set ``failures[name]`` to make that function's next prepares
    raise ``BuildError`` with that text; set ``gate`` to hold every prepare until
    the event is set. ``builds``, ``prepares``, ``retired`` (function, keep) and
    ``in_use`` (images a draining container still holds, never retired) record
    what happened. Two builders given one ``images`` and one ``recent`` (the
    images built within the grace) are two workers on one engine: ``retire``
    removes this builder's own superseded images, and another's only once it is
    no longer recent, as the Docker builder does.
    """

    def __init__(
        self, images: dict[str, set[str]] | None = None, recent: set[str] | None = None
    ) -> None:
        self.images: dict[str, set[str]] = {} if images is None else images
        self.recent: set[str] = set() if recent is None else recent
        self.prepared: set[str] = set()  # this builder's (it may retire them at once)
        self.failures: dict[str, str] = {}
        self.gate: anyio.Event | None = None
        self.builds: list[str] = []
        self.prepares: list[str] = []
        self.retired: list[tuple[str, tuple[str, ...]]] = []
        self.removed_images: list[str] = []
        self.in_use: set[str] = set()
        self.dependency_collections = 0

    async def prepare(
        self, function: str, directory: Path, template: BuildTemplate
    ) -> FunctionImage:
        self.prepares.append(function)
        if self.gate is not None:
            await self.gate.wait()
        if function in self.failures:
            raise BuildError(self.failures[function], output="step 3/5: exit status 1")
        runtime, fp, image = _planned(function, directory, template)
        existing = self.images.setdefault(function, set())
        built = image not in existing
        self.prepared.add(image)
        if built:
            self.builds.append(image)
            existing.add(image)
            self.recent.add(image)
        return FunctionImage(
            function=function,
            runtime=runtime,
            fingerprint=fp,
            image=image,
            dependency_image=f"relay-dep-{runtime}-0123456789abcdef",
            built=built,
        )

    async def retire(self, function: str, keep: Collection[str]) -> list[str]:
        self.retired.append((function, tuple(keep)))
        images = self.images.get(function, set())
        gone = sorted(
            i for i in images
            if i not in keep and i not in self.in_use
            and (i in self.prepared or i not in self.recent)  # another's fresh one stays
        )
        images.difference_update(gone)
        self.prepared.difference_update(gone)
        self.removed_images.extend(gone)
        return gone

    async def collect_dependency_images(self) -> list[str]:
        self.dependency_collections += 1
        return []


def _planned(function: str, directory: Path, template: BuildTemplate) -> tuple[str, str, str]:
    """(runtime, fingerprint, tag) as the Docker builder plans them, or its BuildError."""
    if template.runtime is None:
        detail = "the template declares no runtime; a handler needs one"
    elif template.runtime not in RUNTIMES:
        known = ", ".join(sorted(RUNTIMES))
        detail = f"unknown runtime {template.runtime!r} (supported: {known})"
    elif not directory.is_dir():
        detail = f"{directory} is not a directory"
    else:
        fp = fingerprint(read_sources(directory, select_sources(directory)))
        try:
            return template.runtime, fp, image_tag(function, fp)
        except ValueError as exc:
            detail = str(exc)
    raise BuildError(f'function "{function}": {detail}')


class InMemorySlots:
    """The reconciler's view of ``Slots``: records each function's requested limit."""

    def __init__(self, max_concurrency: int = 8) -> None:
        self.max_concurrency = max_concurrency
        self.limits: dict[str, int] = {}
        self.forgotten: list[str] = []

    def effective(self, capacity: int) -> int:
        return max(1, min(capacity, self.max_concurrency))

    def resize(self, function: str, capacity: int) -> None:
        self.limits[function] = self.effective(capacity)

    def forget(self, function: str) -> None:
        self.limits.pop(function, None)
        self.forgotten.append(function)


# --- delivery: event stream, invocation ledger, dead-letter queue -----------------------
class InMemoryDeadLetterQueue:
    """The DLQ stream: ``entries`` is a list of (id, entry); ``broken`` makes writes fail."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, DeadLetterEntry]] = []
        self.broken = False
        self._ids = itertools.count(1)

    def _append(self, entry: DeadLetterEntry) -> str:
        if self.broken:
            raise DependencyUnavailable("WRONGTYPE dead-letter key holds the wrong kind of value")
        entry_id = f"{next(self._ids)}-0"
        self.entries.append((entry_id, entry))
        return entry_id

    async def append(self, entry: DeadLetterEntry) -> str:
        return self._append(entry)


class _Pending:
    def __init__(self, consumer: str, at_ms: int) -> None:
        self.consumer = consumer
        self.at_ms = at_ms
        self.count = 1


class InMemoryEventStream:
    """``EventStream`` over an in-memory stream with one group (entries, pending list).

    ``add`` appends (payload ``None`` = no ``event`` field), ``delete`` removes a body
    (XDEL); ``fail_reads`` makes the next N reads/reclaims raise as an outage would.
    Idle times run on ``clock``. ``acked`` records every acknowledged id in order.
    """

    def __init__(
        self,
        clock: FakeClock,
        *,
        stream: str = "events",
        group: str = "relay",
        consumer: str = "worker-1",
    ) -> None:
        self._clock = clock
        self._names = (stream, group, consumer)
        self.entries: dict[str, bytes | None] = {}
        self.pending: dict[str, _Pending] = {}
        self.acked: list[str] = []
        self.dropped: list[str] = []
        self.groups_created = 0
        self.fail_reads = 0
        self.silent_reclaims = 0  # reclaims that never answer (a frozen broker)
        self.reads = 0
        self._delivered = 0
        self._order: list[str] = []
        self._seq = itertools.count(1)

    @property
    def stream(self) -> str:
        return self._names[0]

    @property
    def group(self) -> str:
        return self._names[1]

    @property
    def consumer(self) -> str:
        return self._names[2]

    def now_ms(self) -> int:
        return int(self._clock.now() * 1000)

    def add(self, payload: bytes | None) -> str:
        entry_id = f"{self.now_ms()}-{next(self._seq)}"
        self.entries[entry_id] = payload
        self._order.append(entry_id)
        return entry_id

    def delete(self, entry_id: str) -> None:
        self.entries.pop(entry_id, None)

    def ack(self, entry_id: str) -> None:
        if self.pending.pop(entry_id, None) is not None:
            self.acked.append(entry_id)

    async def ensure_group(self) -> None:
        self.groups_created += 1

    def _fail(self) -> None:
        if self.fail_reads > 0:
            self.fail_reads -= 1
            raise DependencyUnavailable("redis XREADGROUP failed: connection refused")

    async def read(
        self, count: int, block_ms: int, patience_s: float = 10.0
    ) -> list[StreamMessage]:
        self.reads += 1
        self._fail()
        batch = self._order[self._delivered : self._delivered + count]
        self._delivered += len(batch)
        ids = [i for i in batch if i in self.entries]
        if not ids:
            await anyio.sleep(min(block_ms / 1000, 0.005))
        for entry_id in ids:
            self.pending[entry_id] = _Pending(self.consumer, self.now_ms())
        return [StreamMessage(id=i, payload=self.entries[i]) for i in ids]

    async def reclaim(self, min_idle_ms: int, count: int) -> Reclaimed:
        self._fail()
        if self.silent_reclaims > 0:
            self.silent_reclaims -= 1
            await anyio.sleep_forever()
        now = self.now_ms()
        messages: list[StreamMessage] = []
        deleted: list[str] = []
        for entry_id, info in list(self.pending.items()):
            if len(messages) >= count:
                return Reclaimed(messages=tuple(messages), deleted=tuple(deleted), complete=False)
            if now - info.at_ms < min_idle_ms:
                continue
            if entry_id not in self.entries:
                deleted.append(entry_id)
                del self.pending[entry_id]
                continue
            info.count += 1
            info.at_ms = now
            info.consumer = self.consumer
            payload = self.entries[entry_id]
            messages.append(
                StreamMessage(id=entry_id, payload=payload, deliveries=info.count, reclaimed=True)
            )
        return Reclaimed(messages=tuple(messages), deleted=tuple(deleted))

    async def drop(self, ids: Sequence[str]) -> None:
        for entry_id in ids:
            self.pending.pop(entry_id, None)
            self.dropped.append(entry_id)


class _MemoryEffects:
    """The broker side of one in-memory ledger call: DLQ appends and the ACK."""

    def __init__(self, ledger: InMemoryLedger, ctx: MessageContext) -> None:
        self._ledger = ledger
        self._ctx = ctx

    def _append(self, entry: DeadLetterEntry) -> str:
        try:
            return self._ledger._dlq._append(entry)
        except DependencyUnavailable as exc:
            raise DeadLetterWriteError(str(exc)) from exc

    def dead_letter(self, field: str, attempt: int, reason: str) -> str:
        function, handler = split_field(field)
        raw = self._ledger._stream.entries.get(self._ctx.message_id) or b""
        event = raw.decode("utf-8", "replace")
        return self._append(self._ledger._entry(self._ctx, event, reason, function, handler,
                                                attempt))

    def dead_letter_malformed(self, reason: str, event: str) -> str:
        return self._append(self._ledger._entry(self._ctx, event, reason, "-", "-", 0))

    def acknowledge(self) -> None:
        self._ledger._stream.ack(self._ctx.message_id)
        self._ledger.ttl[self._ctx.message_id] = self._ledger.retention_s


class InMemoryLedger:
    """``InvocationLedger`` in memory: every call is the domain's own rule
    (:mod:`relay.domain.ledger_rules`) on a dict, so the unit tier tests the rules
    production runs (the Lua scripts are proven equal to them). ``hashes[id]`` is
    the message's ledger hash, ``ttl`` the TTL set at the ACK; ``fail_next`` names
    calls (``begin``/``finish``/``malformed``/``renew``) that raise as an outage
    would, once each; ``calls`` records every call."""

    def __init__(
        self, stream: InMemoryEventStream, dlq: InMemoryDeadLetterQueue, clock: FakeClock
    ) -> None:
        self._stream = stream
        self._dlq = dlq
        self._clock = clock
        self.hashes: dict[str, dict[str, str]] = {}
        self.ttl: dict[str, int] = {}
        self.retention_s = 48 * 3600
        self.fail_next: set[str] = set()
        self.calls: list[str] = []
        self.batches: list[tuple[str, int]] = []  # (begin_many | finish_many, size)
        self.lost: set[str] = set()

    def _call(self, name: str, message_id: str) -> dict[str, str]:
        self.calls.append(name)
        if name in self.fail_next:
            self.fail_next.discard(name)
            raise DependencyUnavailable(f"redis ledger script {name} failed: connection refused")
        return self.hashes.setdefault(message_id, {})

    def _now_ms(self) -> int:
        return int(self._clock.now() * 1000)

    async def begin(self, request: BeginRequest) -> BeginResult:
        h = self._call("begin", request.context.message_id)
        effects = _MemoryEffects(self, request.context)
        return ledger_rules.begin(h, request, self._now_ms(), effects)

    async def finish(self, request: FinishRequest) -> Settlement:
        h = self._call("finish", request.context.message_id)
        effects = _MemoryEffects(self, request.context)
        return ledger_rules.finish(h, request, self._now_ms(), effects)

    async def renew(self, request: RenewRequest) -> int:
        h = self._call("renew", request.context.message_id)
        return ledger_rules.renew(h, request, self._now_ms())

    async def dead_letter_malformed(self, request: MalformedRequest) -> Settlement:
        h = self._call("malformed", request.context.message_id)
        return ledger_rules.dead_letter_malformed(h, request, _MemoryEffects(self, request.context))

    async def begin_many(self, requests: Sequence[BeginRequest]) -> list[BeginResult]:
        """Each member by the domain's rules (as the scripts and the SQLite
        transaction do); one entry in ``batches``. A member whose message id is in
        ``lost`` answers ``lost`` (another consumer holds the delivery), untouched."""
        self.batches.append(("begin_many", len(requests)))
        results = []
        for request in requests:
            if request.context.message_id in self.lost:
                results.append(BeginResult(newly_classified=False, statuses=(), lost=True))
            else:
                results.append(await self.begin(request))
        return results

    async def finish_many(self, requests: Sequence[FinishRequest]) -> list[Settlement]:
        self.batches.append(("finish_many", len(requests)))
        return [await self.finish(request) for request in requests]

    def _entry(
        self,
        ctx: MessageContext,
        event: str,
        reason: str,
        function: str,
        handler: str,
        attempts: int,
    ) -> DeadLetterEntry:
        info = self._stream.pending.get(ctx.message_id)
        return DeadLetterEntry(
            original_stream=ctx.stream,
            original_id=ctx.message_id,
            group=ctx.group,
            consumer=ctx.consumer,
            event=event,
            reason=reason,
            function=function,
            handler=handler,
            deliveries=info.count if info else 1,
            handler_attempts=attempts,
            timestamp=ctx.timestamp,
        )


# --- stats (control plane) ------------------------------------------------------------
class InMemoryStatsStore:
    """``StatsStore`` in memory, with the SQLite store's row semantics (proven by
    ``tests/contract/test_stats_store_contract.py``): a save replaces the global row
    and the listed functions' rows only, times are kept to the second, and a load
    reads every known key. ``writes`` records every save/reset in order; ``gate``
    (when set) holds ``save`` open after ``saving`` is set, so a test can
    interleave a reset with an in-flight flush."""

    def __init__(self) -> None:
        self.persisted = StatsSnapshot()
        self.writes: list[tuple[str, StatsSnapshot]] = []
        self.gate: anyio.Event | None = None
        self.saving = anyio.Event()

    async def load(self) -> StatsSnapshot:
        return self.persisted

    async def save(self, snapshot: StatsSnapshot, at: float) -> None:
        self.saving.set()
        if self.gate is not None:
            await self.gate.wait()
        self._write(snapshot, at)
        self.writes.append(("save", self.persisted))

    async def reset(self, at: float) -> None:
        self._write(zeroed(self.persisted), at)
        self.writes.append(("reset", self.persisted))

    def _write(self, snapshot: StatsSnapshot, at: float) -> None:
        old = self.persisted
        functions = dict(old.functions)
        timestamps = dict(old.timestamps)
        for name in snapshot.function_names():
            functions[name] = {k: max(0, v) for k, v in snapshot.function(name).items()}
            timestamps.pop(name, None)
            if last := snapshot.last(name):
                timestamps[name] = {k: float(int(v)) for k, v in last.items()}
        self.persisted = StatsSnapshot(
            totals={key: max(0, snapshot.total(key)) for key in GLOBAL_KEYS},
            functions=functions,
            updated_at=float(int(at)),  # the row's RFC3339 stamp has second precision
            timestamps=timestamps,
        )


# --- schedules --------------------------------------------------------------------------
class InMemoryOccurrencePublisher:
    """``OccurrencePublisher`` over an :class:`InMemoryEventStream`: ``keys`` maps a
    dedup key to ``(entry id, expiry)``; ``fail_next`` makes that many publishes
    raise as an outage would (nothing written); ``calls`` counts every attempt."""

    def __init__(self, stream: InMemoryEventStream, clock: FakeClock) -> None:
        self._stream = stream
        self._clock = clock
        self.keys: dict[str, tuple[str, float]] = {}
        self.fail_next = 0
        self.calls = 0

    async def publish(self, occurrence: Envelope) -> str | None:
        self.calls += 1
        await anyio.lowlevel.checkpoint()
        if self.fail_next > 0:
            self.fail_next -= 1
            raise DependencyUnavailable("redis schedule publish failed: connection refused")
        key = schedule.dedup_key(self._stream.stream, occurrence.occurrence_id)
        now = self._clock.now()
        held = self.keys.get(key)
        if held is not None and held[1] > now:
            return None
        entry_id = self._stream.add(schedule.encode(occurrence))
        self.keys[key] = (entry_id, now + schedule.DEDUP_TTL_S)
        return entry_id

    def now(self) -> float:
        return self._clock.now()


class InMemoryOccurrenceHistory:
    """``OccurrenceHistory`` over the in-memory stream's pending list and ledger."""

    def __init__(
        self,
        stream: InMemoryEventStream,
        ledger: InMemoryLedger,
        publisher: InMemoryOccurrencePublisher,
    ) -> None:
        self._stream = stream
        self._ledger = ledger
        self._publisher = publisher
        self.fail_next = 0
        self.fail_published = 0  # that many published_as calls raise as an outage would

    async def published_as(self, occurrence_id: str) -> str | None:
        if self.fail_published > 0:
            self.fail_published -= 1
            raise DependencyUnavailable("redis GET failed: connection refused")
        key = schedule.dedup_key(self._stream.stream, occurrence_id)
        held = self._publisher.keys.get(key)
        if held is None or held[1] <= self._publisher.now():
            return None
        return held[0]

    async def unfinished_before(self, prefix: str, message_id: str) -> bool:
        if self.fail_next > 0:
            self.fail_next -= 1
            raise DependencyUnavailable("redis XPENDING failed: connection refused")
        mine = StreamId.parse(message_id)
        for entry_id in self._stream.pending:
            if StreamId.parse(entry_id) >= mine:
                continue
            stamp = self._ledger.hashes.get(entry_id, {}).get(ledger_rules.CLASS_FIELD)
            if stamp is not None:
                if (ledger_rules.parse_class_stamp(stamp)[0] or "").startswith(prefix):
                    return True
                continue
            payload = self._stream.entries.get(entry_id)
            if payload is not None and _is_occurrence_of(payload, prefix):
                return True
        return False


def _is_occurrence_of(payload: bytes, prefix: str) -> bool:
    try:
        event = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return False
    if not isinstance(event, dict) or not schedule.is_occurrence(event):
        return False
    parsed = schedule.parse_occurrence(event)
    return isinstance(parsed, Envelope) and parsed.occurrence_id.startswith(prefix)
# --- lifecycle: services ----------------------------------------------------------------
class InMemoryServiceImages:
    """``ServiceImages`` without Docker. ``images[(function, identity)]`` is what a
    service resolves to (default: ``<source>`` with id ``sha256:<source>``; an
    entrypoint service runs the function image with its runtime's command, as on
    Docker, whose checks it repeats: proven by
    ``tests/contract/test_service_ports_contract.py``); ``failures[(function,
    identity)]`` makes it raise ``RelayError`` with that text. An entrypoint's env
    is its runtime's plus ``PLAN=1``, a marker that lets a unit test see the
    image's env reach the replica."""

    def __init__(self) -> None:
        self.images: dict[tuple[str, str], ResolvedImage] = {}
        self.failures: dict[tuple[str, str], str] = {}
        self.resolved: list[tuple[str, str]] = []

    async def resolve(
        self,
        function: str,
        directory: Path,
        service: ServiceSpec,
        *,
        runtime: str | None,
        function_image: str | None,
    ) -> ResolvedImage:
        key = (function, service.identity)
        self.resolved.append(key)
        if key in self.failures:
            raise RelayError(f'service "{service.identity}": {self.failures[key]}')
        if key in self.images:
            return self.images[key]
        if service.kind == "entrypoint":
            try:
                return _entrypoint(directory, service, runtime, function_image)
            except RelayError as exc:
                raise RelayError(f'service "{service.identity}": {exc}') from None
        return ResolvedImage(image=service.source, image_id=f"sha256:{service.source}")

    async def source_version(self, function: str, directory: Path) -> FunctionImage:
        return FunctionImage(
            function=function,
            runtime="",
            fingerprint=_source_fingerprint(directory),
            image="",
            dependency_image=None,
            built=False,
        )


def _source_fingerprint(directory: Path) -> str:
    if not directory.is_dir():
        raise RelayError(f"{directory} is not a directory")
    return fingerprint(read_sources(directory, select_sources(directory)))


def _entrypoint(
    directory: Path, service: ServiceSpec, runtime: str | None, image: str | None
) -> ResolvedImage:
    """The Docker adapter's entrypoint rule, without inspecting the image."""
    known = RUNTIMES.get(runtime or "")
    if known is None:
        raise RelayError(f"an entrypoint needs a runtime (got {runtime!r})")
    if not image:
        raise RelayError("the function image is not built yet")
    if service.source.removeprefix("./") not in select_sources(directory).files:
        raise RelayError(
            f"entrypoint {service.source} is not in the function's source "
            "(missing, or ignored by .gitignore), so it is not in the image"
        )
    if known.name.startswith("python"):
        command: tuple[str, ...] = ("python", "-m", service.python_module)
    else:
        command = ("node", f"{APP_DIR}/{service.source}")
    return ResolvedImage(
        image=image,
        image_id=f"sha256:{image}",
        command=command,
        workdir=APP_DIR,
        env={**known.env, "PLAN": "1"},
    )


class InMemoryServiceContainers:
    """``ServiceContainers`` without Docker: ``containers`` by id; ``log`` records
    ``("start", id)`` / ``("remove", id)`` in order; ``crash(id)`` makes one not
    running; ``networks`` are the existing ones; ``start_failures`` holds identities
    whose starts fail; ``started`` keeps the DesiredService of every start."""

    def __init__(self, hostname: str = "worker-1") -> None:
        self.hostname = hostname
        self.containers: dict[str, ObservedReplica] = {}
        self.log: list[tuple[str, str]] = []
        self.networks: set[str] = set()
        self.start_failures: set[str] = set()
        self.started: dict[str, DesiredService] = {}
        self._ids = itertools.count(1)

    async def observe(self, function: str | None = None) -> list[ObservedReplica]:
        return [
            c
            for c in self.containers.values()
            if c.labels.get("relay.hostname") == self.hostname
            and (function is None or c.labels.get("relay.function") == function)
        ]

    async def start(self, desired: DesiredService, slot: int) -> str:
        if desired.spec.identity in self.start_failures:
            raise RelayError(f"replica {slot} exited at start (exit code 1)")
        container_id = f"c{next(self._ids)}"
        self.containers[container_id] = ObservedReplica(
            id=container_id, labels=desired.labels(slot), running=True
        )
        self.started[container_id] = desired
        self.log.append(("start", container_id))
        return container_id

    async def remove(self, container_id: str) -> None:
        self.containers.pop(container_id, None)
        self.log.append(("remove", container_id))

    async def network_exists(self, name: str) -> bool:
        return name in self.networks

    def crash(self, container_id: str) -> None:
        old = self.containers[container_id]
        self.containers[container_id] = ObservedReplica(id=old.id, labels=old.labels, running=False)

    def running(self, identity: str | None = None) -> list[ObservedReplica]:
        return [
            c
            for c in self.containers.values()
            if c.running and (identity is None or c.labels.get("relay.identity") == identity)
        ]


def one_by_one(
    dispatch: Callable[[StreamMessage], Awaitable[object]],
) -> Callable[[Sequence[StreamMessage], Callable[[str], None]], Awaitable[None]]:
    """A per-message dispatch as the loops' batch dispatch: each message of a batch
    in its own task, its end told as it happens (tests of the loops alone)."""

    async def batch(messages: Sequence[StreamMessage], done: Callable[[str], None]) -> None:
        async def one(message: StreamMessage) -> None:
            try:
                await dispatch(message)
            finally:
                done(message.id)

        async with anyio.create_task_group() as tg:
            for message in messages:
                tg.start_soon(one, message)

    return batch


# --- lifecycle: the functions directory -------------------------------------------------
class InMemoryFunctionSource:
    """``FunctionSource`` without a disk: ``functions[name]`` is the text of the
    function's ``template.yaml`` (``None``: a directory without one), validated by
    the same YAML reader as the filesystem's; a name starting with ``.`` is never a
    candidate. ``missing`` makes ``scan`` fail as an unreadable directory does."""

    def __init__(self, root: str = "/functions") -> None:
        self.root = root
        self.functions: dict[str, str | None] = {}
        self.missing = False

    def scan(self) -> list[DiscoveredFunction]:
        if self.missing:
            raise FileNotFoundError(2, "No such file or directory", self.root)
        return [
            DiscoveredFunction(name, self.directory_of(name), text is not None)
            for name, text in sorted(self.functions.items())
            if not name.startswith(".")
        ]

    def directory_of(self, name: str) -> str:
        return f"{self.root}/{name}"

    def load_template(self, directory: str) -> Template | None:
        parent, _, name = directory.rpartition("/")
        text = self.functions.get(name) if parent == self.root else None
        if text is None:
            return None
        return load_template_text(text, f"{directory}/{TEMPLATE_FILE}")


# --- delivery: the dead-letter read side ------------------------------------------------
class InMemoryDeadLetterReader(PagedEntries):
    """The dead-letter read side (``RedisDeadLetterReader`` / ``SqliteDeadLetterReader``)
    over an :class:`InMemoryDeadLetterQueue`'s entries: ids are ``<ms>-<seq>`` and
    order by their numbers, as both brokers' do."""

    def __init__(self, dlq: InMemoryDeadLetterQueue, key: str = "events (dlq)") -> None:
        self._dlq = dlq
        self.key = key

    def _sorted(self) -> list[tuple[StreamId, DeadLetterEntry]]:
        return sorted(((StreamId.parse(i), e) for i, e in self._dlq.entries), key=lambda r: r[0])

    async def count(self) -> int:
        return len(self._dlq.entries)

    async def page(
        self, *, newest_first: bool = True, count: int = 100, after: str | None = None
    ) -> list[StoredDeadLetter]:
        rows = self._sorted()
        if newest_first:
            rows.reverse()
        if after is not None:
            start = StreamId.parse(after)
            rows = [r for r in rows if (r[0] < start if newest_first else r[0] > start)]
        return [StoredDeadLetter(str(i), e) for i, e in rows[:count]]

    async def get(self, entry_id: str) -> StoredDeadLetter:
        normalised = parse_entry_id(entry_id)
        for found, entry in self._dlq.entries:
            if found == normalised:
                return StoredDeadLetter(found, entry)
        raise DeadLetterNotFound(f"no dead-letter entry {normalised} in {self.key}")

    async def delete(self, entry_id: str) -> None:
        if not await self.discard(entry_id):
            normalised = parse_entry_id(entry_id)
            raise DeadLetterNotFound(f"no dead-letter entry {normalised} in {self.key}")

    async def discard(self, entry_id: str) -> bool:
        normalised = parse_entry_id(entry_id)
        before = len(self._dlq.entries)
        self._dlq.entries = [(i, e) for i, e in self._dlq.entries if i != normalised]
        return len(self._dlq.entries) < before

    async def trim_before(self, cutoff_ms: int) -> int:
        before = len(self._dlq.entries)
        self._dlq.entries = [
            (i, e) for i, e in self._dlq.entries if StreamId.parse(i).ms >= cutoff_ms
        ]
        return before - len(self._dlq.entries)
