"""``POST /v1/events`` over real HTTP against the real aiohttp server and a real
embedded broker file (Redis: ``test_ingest_redis.py``): every status, the
tokens, the caps, and a flood of stalled connections."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
from anyio.abc import SocketStream
from prometheus_client import CollectorRegistry

from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.ingest.server import IngestServer
from relay.adapters.ingest.tokens import IngestTokens, handler_token
from relay.adapters.metrics.ingest import subscribe_ingest
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock
from relay.application.bus import MessageBus
from relay.domain.errors import RelayError
from relay.domain.publication import Publication

pytestmark = pytest.mark.anyio

TOKEN = "t0ken-for-tests"
SECRET = "ingest-token"
MAX_EVENT = 1024
MAX_BODY = 8 * 1024
STREAM = "events"


class GatedPublisher:
    """The real publisher behind a gate a test opens (requests held in flight)."""

    def __init__(self, inner: SqliteEventPublisher) -> None:
        self.inner = inner
        self.gate = anyio.Event()
        self.waiting = 0

    async def append(self, publications: Sequence[Publication]) -> list[str]:
        self.waiting += 1
        await self.gate.wait()
        return await self.inner.append(publications)


@dataclass
class Ingest:
    url: str
    server: IngestServer
    store: BrokerStore
    publisher: GatedPublisher
    registry: CollectorRegistry
    http: aiohttp.ClientSession
    secrets: FileSecretStore

    async def post(self, body: Any, token: str | None = TOKEN, raw: bytes | None = None,
                   extra: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        headers.update(extra or {})
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.http.post(self.url, data=data, headers=headers) as response:
            return response.status, await response.json()

    def answered(self, status: int) -> float:
        value = self.registry.get_sample_value("ingest_requests_total", {"status": str(status)})
        return value or 0.0

    async def payloads(self) -> list[bytes]:
        rows = await self.store.read(
            lambda c: c.execute("SELECT payload FROM jobs ORDER BY seq").fetchall()
        )
        return [bytes(row[0]) for row in rows]


@pytest.fixture(params=[
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),  # what `relay start` runs
])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    backend: tuple[str, dict[str, object]] = request.param
    return backend


async def wait_for(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(10):
        while not condition():  # noqa: ASYNC110 - polling a plain attribute
            await anyio.sleep(0.005)


@pytest.fixture
async def ingest(tmp_path: Path) -> AsyncIterator[Ingest]:
    """2 requests at once (4 connections read, 8 parked), 1 s per connection."""
    secrets = FileSecretStore(tmp_path / "secrets")
    secrets.set(SECRET, TOKEN + "\n")  # as `echo ... | relay secret set` stores it
    store = BrokerStore(tmp_path / "broker.sqlite3", SystemClock())
    publisher = GatedPublisher(SqliteEventPublisher(store, STREAM))
    publisher.gate.set()
    bus = MessageBus({})
    registry = CollectorRegistry()
    subscribe_ingest(bus, registry)
    server = IngestServer(
        "127.0.0.1", 0, publisher=publisher, tokens=IngestTokens(secrets, SECRET, refresh_s=0),
        notify=bus.emit, max_event_bytes=MAX_EVENT, max_body_bytes=MAX_BODY,
        max_requests=2, read_deadline_s=1.0, waiting=8,
    )
    try:
        async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
            await tg.start(server.run)
            yield Ingest(f"http://127.0.0.1:{server.bound_port}/v1/events", server, store,
                         publisher, registry, http, secrets)
            tg.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(store.close)


async def test_one_item_and_an_array_are_202_with_ids_once_in_the_broker(ingest: Ingest) -> None:
    status, body = await ingest.post({"event": {"n": 1}, "priority": "high"})
    assert status == 202
    [first] = body["ids"]
    status, body = await ingest.post([{"event": {"n": 2}}, {"event": {"n": 3}}])
    assert status == 202
    assert len(body["ids"]) == 2
    assert first not in body["ids"]
    assert await ingest.payloads() == [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    assert ingest.answered(202) == 2
    assert ingest.registry.get_sample_value("ingest_events_total") == 3


async def test_the_requests_traceparent_header_is_kept_beside_each_event(ingest: Ingest) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    status, _ = await ingest.post([{"event": {"n": 1}}, {"event": {"n": 2}}],
                                  extra={"traceparent": parent})
    assert status == 202
    status, _ = await ingest.post({"event": {"n": 3}}, extra={"traceparent": "00-nonsense"})
    assert status == 202  # a malformed header is ignored (W3C), the event still lands
    rows = await ingest.store.read(
        lambda c: c.execute("SELECT payload, traceparent FROM jobs ORDER BY seq").fetchall()
    )
    assert [(bytes(p), t) for p, t in rows] == [
        (b'{"n":1}', parent), (b'{"n":2}', parent), (b'{"n":3}', None)
    ]


async def test_the_token_is_checked_in_constant_time_and_a_mismatch_is_401(
    ingest: Ingest,
) -> None:
    """No header, another scheme, a token one character off, an empty one: 401,
    the body unread and nothing appended; the error never echoes a token."""
    for token, header in ((None, None), (TOKEN[:-1] + "X", None), ("", None),
                          (None, f"Basic {TOKEN}"), (None, TOKEN)):
        headers = {"Authorization": header} if header else {}
        if token is not None:
            headers = {"Authorization": f"Bearer {token}"}
        async with ingest.http.post(ingest.url, json={"event": {}}, headers=headers) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="relay"'
            text = await response.text()
        assert json.loads(text) == {"error": "missing or invalid bearer token"}
        assert TOKEN not in text
    assert ingest.answered(401) == 5
    assert await ingest.payloads() == []


async def test_the_handlers_derived_token_is_accepted_and_a_rotation_takes_effect(
    ingest: Ingest,
) -> None:
    assert (await ingest.post({"event": {}}, token=handler_token(TOKEN)))[0] == 202
    ingest.secrets.set(SECRET, "rotated")
    assert (await ingest.post({"event": {}}))[0] == 401
    assert (await ingest.post({"event": {}}, token=handler_token(TOKEN)))[0] == 401
    assert (await ingest.post({"event": {}}, token="rotated"))[0] == 202
    assert ingest.server.tokens.handler_env_token() == handler_token("rotated")


@pytest.mark.parametrize(("raw", "error"), [
    (b"{not json", "body is not JSON (one item or an array of items)"),
    (b'{"event": {"x": NaN}}', "body is not JSON (one item or an array of items)"),
    (b'{"event": {"x": 1e400}}', "event holds a number out of range (no JSON for it)"),
    (b"[" * 3000 + b"]" * 3000, "body is not JSON (one item or an array of items)"),
    (b'[{"event": {}}, {"event": 3}]', "item 1: event must be a JSON object, not a number"),
    (b'{"event": {}, "priority": "urgent"}',
     "priority 'urgent' is not one of critical, high, normal, low"),
])
async def test_bad_content_is_400_with_one_line_and_nothing_is_appended(
    ingest: Ingest, raw: bytes, error: str
) -> None:
    status, body = await ingest.post(None, raw=raw)
    assert (status, body) == (400, {"error": error})
    assert await ingest.payloads() == []
    assert ingest.answered(400) == 1


async def test_a_body_or_an_event_over_its_cap_is_413(ingest: Ingest) -> None:
    status, body = await ingest.post(None, raw=b" " * (MAX_BODY + 1))
    assert (status, body) == (413, {"error": f"body over INGEST_MAX_BODY_BYTES ({MAX_BODY})"})
    big = {"event": {"k": "x" * MAX_EVENT}}
    status, body = await ingest.post([{"event": {}}, big])
    assert status == 413
    assert body["error"].startswith("item 1: event is 1032 bytes, over MAX_EVENT_BYTES (1024)")
    assert await ingest.payloads() == []
    assert ingest.answered(413) == 2


async def test_over_the_request_cap_is_429_at_once_and_the_held_ones_then_land(
    ingest: Ingest,
) -> None:
    ingest.publisher.gate = anyio.Event()
    statuses: list[int] = []
    async with anyio.create_task_group() as tg:
        for n in range(2):
            async def held(n: int = n) -> None:
                statuses.append((await ingest.post({"event": {"n": n}}))[0])
            tg.start_soon(held)
        await wait_for(lambda: ingest.publisher.waiting == 2)
        async with ingest.http.post(ingest.url, json={"event": {}},
                                    headers={"Authorization": f"Bearer {TOKEN}"}) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "1"
            assert await response.json() == {"error": "over 2 requests at once"}
        ingest.publisher.gate.set()
    assert statuses == [202, 202]
    assert len(await ingest.payloads()) == 2
    assert ingest.answered(429) == 1


async def _closed_by_server(stream: SocketStream) -> bool:
    with anyio.move_on_after(10):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return True
    return False


async def test_a_flood_of_stalled_connections_stays_bounded_and_a_post_then_gets_through(
    ingest: Ingest,
) -> None:
    """60 connections that stall inside their headers or their body: 4 are read,
    8 wait unread, 48 are closed at accept; all are cut at the deadline. The
    bytes held stay under 4 connections' cap, whatever was sent."""
    guard = ingest.server.guard
    port = ingest.server.bound_port
    assert port is not None
    head = (b"POST /v1/events HTTP/1.1\r\nHost: relay\r\nAuthorization: Bearer "
            + TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % MAX_BODY)
    streams: list[SocketStream] = []
    try:
        for n in range(60):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            streams.append(stream)
            await stream.send(head + b"[" * (MAX_BODY - 100) if n % 2 else head[:30])
        await wait_for(lambda: (guard.active, guard.waiting, guard.refused) == (4, 8, 48))
        assert guard.peak_active == 4
        assert guard.peak_buffered <= 4 * guard.max_bytes
        assert all([await _closed_by_server(stream) for stream in streams])
    finally:
        for stream in streams:
            await stream.aclose()
    await wait_for(lambda: (guard.active, guard.waiting, guard.buffered) == (0, 0, 0))
    assert guard.timed_out == 12
    assert await ingest.payloads() == []
    assert (await ingest.post({"event": {"after": True}}))[0] == 202


@pytest.mark.parametrize("stored", [None, "", " \n"])
async def test_a_missing_or_blank_token_secret_refuses_the_start_in_one_line(
    tmp_path: Path, stored: str | None
) -> None:
    """Row 384: a blank token would let in whoever sends an empty one."""
    secrets = FileSecretStore(tmp_path / "secrets")
    if stored is not None:
        secrets.set(SECRET, stored)
    server = IngestServer("127.0.0.1", 0, publisher=GatedPublisher(None),  # type: ignore[arg-type]
                          tokens=IngestTokens(secrets, SECRET), notify=lambda _e: None,
                          max_event_bytes=MAX_EVENT)
    with pytest.raises(RelayError) as refused:
        await server.bind()
    line = str(refused.value)
    assert line.startswith(f"INGEST_TOKEN_SECRET: secret \"{SECRET}\" ")
    assert "\n" not in line
    assert server.bound_port is None
