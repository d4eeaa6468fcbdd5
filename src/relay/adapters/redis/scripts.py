"""Lua scripts on one dedicated, pipelined connection: the ledger's hot path.

Every handled event makes two script calls (``begin`` and ``finish``). They go
through :class:`ScriptChannel`, which keeps one connection of the client's pool
for itself and lets calls overlap on it:

- *writing*: a caller whose call is not yet sent, while nobody is writing,
  becomes the writer. It yields once, so the other messages of the same read
  batch can queue their calls, then writes everything queued as one pipeline
  (one ``send``), and again while more arrived during the write;
- *reading*: replies come back in the order the calls were written. A caller
  whose call is sent, while nobody is reading, becomes the reader: it reads
  replies in order, hands each to its caller, and stops after its own call's
  write batch; the oldest caller still waiting then takes over.

So a new batch never waits for the previous batch's replies, and no background
task is needed: the roles pass from caller to caller. Each call waits shielded
and bounded (30 s), so a call handed to Redis reaches its caller. The command
bytes are packed here (RESP), not by redis-py's generic encoder: a script call
has a fixed shape, and packing was the biggest single cost of the old path.

Failures follow :func:`relay.adapters.redis.connection.redis_client`: a broken
connection (a Redis restart) is re-opened and every call it left unanswered is
sent once more (safe: each script is fenced by its token); a refused connection
or a timeout fails the calls with :class:`DependencyUnavailable`, never retried.
A ``NOSCRIPT`` reply (``SCRIPT FLUSH``, a restart) loads the script on the
connection and sends the call again.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol

import anyio
import anyio.lowlevel
from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from relay.domain.errors import DependencyUnavailable

SEND_TIMEOUT_S: Final = 30.0
MAX_BATCH: Final = 256


class LuaScript:
    """A script's source and the SHA1 that ``EVALSHA`` names it by."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self._sha = self.sha.encode()
        self._load = _command(b"SCRIPT", b"LOAD", source.encode())

    def evalsha(self, keys: Sequence[str], args: Sequence[str]) -> bytes:
        """The packed ``EVALSHA`` command."""
        return _command(
            b"EVALSHA",
            self._sha,
            b"%d" % len(keys),
            *(k.encode() for k in keys),
            *(a.encode() for a in args),
        )

    def load_command(self) -> bytes:
        """The packed ``SCRIPT LOAD`` command."""
        return self._load


def _command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class ScriptConnection(Protocol):
    """What the channel uses of a redis-py asyncio connection."""

    @property
    def is_connected(self) -> bool: ...

    async def connect(self) -> None: ...

    async def disconnect(self, nowait: bool = False) -> None: ...

    async def send_packed_command(self, command: bytes, check_health: bool = True) -> None: ...

    async def read_response(self) -> Any: ...


OpenConnection = Callable[[], Awaitable[ScriptConnection]]


async def dedicated_connection(client: Redis) -> ScriptConnection:
    """A connection of ``client``'s pool that stays checked out (the pool still
    closes it when the client is closed)."""
    conn: ScriptConnection = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    return conn


class _Call:
    __slots__ = ("batch", "data", "done", "error", "reply", "retried", "script", "sent", "wake")

    def __init__(self, script: LuaScript | None, data: bytes) -> None:
        self.script = script  # None: a SCRIPT LOAD sent ahead of a batch, reply ignored
        self.data = data
        self.sent = False
        self.batch = 0
        self.retried = False
        self.done = False
        self.reply: Any = None
        self.error: BaseException | None = None
        self.wake: anyio.Event | None = None

    def finish(self, reply: Any = None, error: BaseException | None = None) -> None:
        self.reply, self.error, self.done = reply, error, True
        self.notify()

    def notify(self) -> None:
        if self.wake is not None:
            self.wake.set()


def _wake_first(calls: deque[_Call]) -> None:
    """Hand a free role to the oldest caller parked on it (one that gave up is not
    parked; one still running checks the roles again on its own)."""
    for call in calls:
        if call.wake is not None:
            call.wake.set()
            return


class ScriptChannel:
    """Concurrent script calls pipelined on one connection (see the module text)."""

    def __init__(
        self, open_connection: OpenConnection, *, timeout_s: float = SEND_TIMEOUT_S
    ) -> None:
        self._open = open_connection
        self._timeout_s = timeout_s
        self._conn: ScriptConnection | None = None
        self._unsent: deque[_Call] = deque()
        self._waiting: deque[_Call] = deque()  # written, replies due in this order
        self._loaded: set[str] = set()  # scripts loaded on the current connection
        self._writing = False
        self._reading = False
        self._batches = 0
        self._generation = 0  # connections opened: an error of an older one is stale
        self.round_trips = 0  # pipelines written (for the benches)
        self.calls = 0

    async def call(self, script: LuaScript, keys: Sequence[str], args: Sequence[str]) -> Any:
        call = _Call(script, script.evalsha(keys, args))
        self._unsent.append(call)
        self.calls += 1
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + self._timeout_s):
            while not call.done:
                if not call.sent and not self._writing:
                    await self._write()
                elif call.sent and not self._reading:
                    await self._read_through(call)
                else:
                    call.wake = anyio.Event()
                    await call.wake.wait()
                    call.wake = None
        if not call.done:
            # Our own deadline passed: a late reply is dropped by the reader.
            if not call.sent:
                self._unsent.remove(call)
            raise DependencyUnavailable(f"redis ledger script {script.name} timed out")
        if call.error is not None:
            raise call.error
        return call.reply

    def _pass_roles(self) -> None:
        """After a role is given up: hand each free role with work behind it to the
        oldest caller parked on it. Both, always: while one caller wrote, a reader
        may have answered that writer's own call and left, and the writer then
        returns without reading what it wrote after."""
        if not self._writing:
            _wake_first(self._unsent)
        if not self._reading:
            _wake_first(self._waiting)

    # --- writing -------------------------------------------------------------------------

    async def _write(self) -> None:
        self._writing = True
        try:
            await anyio.lowlevel.checkpoint()  # let the rest of this read batch queue up
            while self._unsent:
                await self._write_batch()
        finally:
            self._writing = False
            self._pass_roles()

    async def _write_batch(self) -> None:
        batch = [self._unsent.popleft() for _ in range(min(MAX_BATCH, len(self._unsent)))]
        try:
            conn = await self._connection()
        except Exception as exc:  # noqa: BLE001 - refused: each caller gets the error
            error = DependencyUnavailable(f"redis ledger connection failed: {exc}")
            for call in batch:
                call.finish(error=error)
            return
        self._batches += 1
        loads = [
            _Call(None, script.load_command())
            for script in {c.script.sha: c.script for c in batch if c.script}.values()
            if script.sha not in self._loaded
        ]
        self._loaded.update(c.script.sha for c in batch if c.script)
        for call in (*loads, *batch):
            call.sent, call.batch = True, self._batches
            self._waiting.append(call)
        self.round_trips += 1
        generation = self._generation
        try:
            await conn.send_packed_command(
                b"".join(c.data for c in (*loads, *batch)), check_health=False
            )
        except BaseException as exc:
            await self._broken(exc, generation)
            if not isinstance(exc, Exception):
                raise

    async def _connection(self) -> ScriptConnection:
        if self._conn is None:
            self._conn = await self._open()
        elif self._conn.is_connected:
            return self._conn
        else:
            await self._conn.connect()
        self._generation += 1
        self._loaded.clear()
        return self._conn

    # --- reading -------------------------------------------------------------------------

    async def _read_through(self, own: _Call) -> None:
        """Read replies until ``own`` and the rest of its write batch are answered."""
        self._reading = True
        generation = self._generation
        try:
            while self._waiting and (not own.done or self._waiting[0].batch <= own.batch):
                await self._read_one()
        except BaseException as exc:
            await self._broken(exc, generation)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._reading = False
            self._pass_roles()

    async def _read_one(self) -> None:
        conn = self._conn
        assert conn is not None  # a call is only waiting once written
        try:
            reply: Any = await conn.read_response()
            error: BaseException | None = None
        except ResponseError as exc:  # an error reply: the stream itself is intact
            reply, error = None, exc
        call = self._waiting.popleft()
        if call.script is None:
            return  # a SCRIPT LOAD: a failure shows as NOSCRIPT on the call after it
        if isinstance(error, NoScriptError) and not call.retried:
            self._loaded.discard(call.script.sha)  # flushed: load again, send again
            self._requeue(call)
        elif error is not None:
            call.finish(error=DependencyUnavailable(f"redis ledger script failed: {error}"))
        else:
            call.finish(reply)

    def _requeue(self, call: _Call) -> None:
        call.retried, call.sent = True, False
        self._unsent.append(call)

    async def _broken(self, exc: BaseException, generation: int) -> None:
        """The connection is in an unknown state: close it; what it left unanswered
        is sent once more on a new one, unless this was a timeout or cancellation.
        An error of an older connection changes nothing: that one was handled."""
        if generation != self._generation:
            return
        conn = self._conn
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await conn.disconnect(nowait=True)
        retry = isinstance(exc, Exception) and not isinstance(exc, TimeoutError)
        error = DependencyUnavailable(f"redis ledger call was not answered: {exc!r}")
        while self._waiting:
            call = self._waiting.popleft()
            if call.script is None:
                continue
            if retry and not call.retried:
                self._requeue(call)
            else:
                call.finish(error=error)
