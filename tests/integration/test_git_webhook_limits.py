"""What the internet can make ``POST /github`` cost, and bad input, over real
sockets against the real aiohttp server: stalled connections, a blank secret, a
non-ASCII signature and a body nested too deep to parse."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anyio
import pytest
from anyio.abc import SocketStream
from structlog.testing import capture_logs

from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.git.webhook import WebhookServer
from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.subscribers import subscribe
from relay.application.bus import MessageBus
from relay.domain.git import GitSource
from tests.fakes_compose import sync_loop
from tests.integration.test_git_webhook import (
    REPO,
    SECRET_NAME,
    Endpoint,
    GatedSync,
    push_body,
    settle,
    sign,
    wait_for,
)

pytestmark = pytest.mark.anyio

BODY_CAP = 64 * 1024


@pytest.fixture(params=[
    pytest.param(("asyncio", {}), id="asyncio"),
    pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),  # what `relay start` runs
])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    backend: tuple[str, dict[str, object]] = request.param
    return backend


@pytest.fixture
async def limited(tmp_path: Path) -> AsyncIterator[Endpoint]:
    """A signed endpoint that reads 4 requests at once, parks 8 more connections
    and gives each connection 1 s (the defaults are 16, 128 and 10 s)."""
    secrets = tmp_path / "state" / "secrets"
    FileSecretStore(secrets).set(SECRET_NAME, "s3cret")
    bus = MessageBus({})
    metrics = Metrics()
    subscribe(bus, metrics)
    sync = GatedSync()
    scheduler = sync_loop(sync, lambda _e: None, bus)
    server = WebhookServer(
        "127.0.0.1", 0, source=GitSource(repository=REPO, webhook_secret=SECRET_NAME),
        secrets=FileSecretStore(secrets), request_sync=scheduler.request, notify=bus.emit,
        max_body_bytes=BODY_CAP, max_connections=4, max_waiting=8, read_deadline_s=1.0,
    )
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        await tg.start(scheduler.run)
        await tg.start(server.run)
        yield Endpoint(f"http://127.0.0.1:{server.bound_port}/github", server, sync, metrics,
                       http)
        sync.release.set()
        tg.cancel_scope.cancel()


async def _closed_by_server(stream: SocketStream) -> bool:
    """Read until the server closes (EOF or reset); False if it never does."""
    with anyio.move_on_after(10):
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
            return True
    return False


async def test_stalled_connections_stay_bounded_are_cut_at_the_deadline_and_a_push_gets_through(
    limited: Endpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's attack: 40 connections that announce a body, send most of it
    (or stop inside the headers) and stall. Before: every one held up to 8 MiB
    with no deadline. Now 4 are read, 8 wait unread, 28 are closed at once; all
    are cut after the deadline, and a signed push then gets 202."""
    guard = limited.server.guard
    port = limited.server.bound_port
    assert port is not None
    head = (b"POST /github HTTP/1.1\r\nHost: relay\r\nX-GitHub-Event: push\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % BODY_CAP)
    streams: list[SocketStream] = []
    try:
        for n in range(40):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            streams.append(stream)
            # half stall inside the body, half inside the headers
            await stream.send(head + b"[" * (BODY_CAP - 100) if n % 2 else head[:40])
        await wait_for(lambda: (guard.active, guard.waiting, guard.refused) == (4, 8, 28))
        assert guard.peak_active == 4
        assert guard.buffered <= 4 * guard.max_bytes
        assert guard.peak_buffered <= 4 * guard.max_bytes
        closed = [await _closed_by_server(stream) for stream in streams]
        assert all(closed)
    finally:
        for stream in streams:
            await stream.aclose()
    await wait_for(lambda: (guard.active, guard.waiting, guard.buffered) == (0, 0, 0))
    assert guard.timed_out == 12
    assert guard.peak_active == 4
    # a cut connection is one `git_webhook_timeout` line, never a server error
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    body = push_body()
    status, text = await limited.post(body, delivery="after", signature=sign("s3cret", body))
    assert (status, text) == (202, "sync scheduled")


async def test_a_burst_over_the_read_limit_waits_its_turn_instead_of_failing(
    limited: Endpoint,
) -> None:
    body = push_body()
    statuses: list[int] = []
    async with anyio.create_task_group() as tg:
        for n in range(12):  # 4 read at once, 8 wait
            async def one(n: int = n) -> None:
                status, _ = await limited.post(body, delivery=f"b{n}",
                                               signature=sign("s3cret", body))
                statuses.append(status)
            tg.start_soon(one)
    assert statuses == [202] * 12
    assert limited.server.guard.peak_active <= 4
    assert limited.server.guard.refused == 0


@pytest.mark.parametrize("value", ["", "\n", " \t\r\n"])
async def test_a_blank_stored_secret_refuses_a_push_signed_with_an_empty_key(
    limited: Endpoint, tmp_path: Path, value: str
) -> None:
    """Before: the newline was stripped to an empty HMAC key and the push signed
    with it was accepted (202, sync requested)."""
    FileSecretStore(tmp_path / "state" / "secrets").set(SECRET_NAME, value)
    body = push_body()
    with capture_logs() as logs:
        status, text = await limited.post(body, delivery="d", signature=sign("", body))
    assert (status, text) == (500, "webhook secret unavailable")
    refused = [e for e in logs if e["event"] == "git_webhook_secret_unavailable"]
    assert len(refused) == 1
    assert refused[0]["error"].startswith(f'secret "{SECRET_NAME}" is empty or whitespace only')
    await settle(lambda: limited.sync.started == 0)
    assert limited.deliveries("unavailable") == 1
    assert limited.deliveries("accepted") == 0


async def _raw_post(port: int, headers: bytes, body: bytes) -> int:
    """One request written byte for byte (a client library would refuse the
    non-ASCII header); the answer's status code."""
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(b"POST /github HTTP/1.1\r\nHost: relay\r\nX-GitHub-Event: push\r\n"
                          + headers + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answer = b""
        with anyio.fail_after(10):
            while b"\r\n" not in answer:
                answer += await stream.receive()
    return int(answer.split(b" ", 2)[1])


async def test_a_non_ascii_signature_is_401_logged_and_counted(limited: Endpoint) -> None:
    """Before: compare_digest raised TypeError on the non-ASCII text, a 500 with a
    traceback."""
    port = limited.server.bound_port
    assert port is not None
    body = push_body()
    good = sign("s3cret", body).encode()
    with capture_logs() as logs:
        for header in (b"sha256=\xc3\xa9" + good[9:], "sha256=é".encode("latin-1"),
                       good[:-2] + "ü".encode()):
            status = await _raw_post(port, b"X-Hub-Signature-256: " + header + b"\r\n", body)
            assert status == 401, header
    assert [e["outcome"] for e in logs if e["event"] == "git_webhook_delivery"] == [
        "unauthorized"] * 3
    assert not [e for e in logs if e.get("log_level") in ("error", "critical")]
    assert limited.deliveries("unauthorized") == 3
    await settle(lambda: limited.sync.started == 0)


async def test_a_deeply_nested_signed_body_is_400_logged_and_counted(limited: Endpoint) -> None:
    """Before: json.loads raised RecursionError, a 500 with a traceback."""
    body = b"[" * 30_000 + b"]" * 30_000  # 60 KB: under the body cap
    with capture_logs() as logs:
        status, text = await limited.post(body, delivery="deep", signature=sign("s3cret", body))
    assert (status, text) == (400, "body is not JSON")
    assert [e["outcome"] for e in logs if e["event"] == "git_webhook_delivery"] == ["malformed"]
    assert limited.deliveries("malformed") == 1
    await settle(lambda: limited.sync.started == 0)
