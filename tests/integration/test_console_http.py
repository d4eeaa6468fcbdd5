"""The console's HTTP surface over real sockets: the real aiohttp server, the real
embedded broker file and state database under ``tmp_path``; the secret store and
the replay command are in-memory. Status codes, the token, CSRF and the caps."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import anyio
import pytest
from yarl import URL

from relay.adapters.brokers import open_broker
from relay.adapters.sqlite.broker.ledger import insert_dead_letter
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.sqlite.run_history import RunHistory, open_history_db
from relay.adapters.system import SystemClock
from relay.application.registry import FunctionRegistry
from relay.domain.errors import RelayError
from relay.domain.outcome import DeadLetterEntry
from relay.domain.publication import DEFAULT_DEDUP_WINDOW_NS
from relay.entrypoints.console.pages import Console
from relay.entrypoints.console.reads import ConsoleReads
from relay.entrypoints.console.replays import ReplayQueue
from relay.entrypoints.console.security import AUTH_COOKIE, SESSION_COOKIE, Access
from relay.entrypoints.console.server import MAX_BODY_BYTES, ConsoleServer
from relay.entrypoints.console.views import Breakers
from tests.fakes import InMemorySecretStore

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-console-token-value"
CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


async def _console(tmp_path: Path, stack: AsyncExitStack, token_secret: str | None,
                   secrets: InMemorySecretStore) -> Console:
    settings = SimpleNamespace(
        broker=SimpleNamespace(embedded=True, path=tmp_path / "broker.sqlite3"),
        redis=SimpleNamespace(stream="events", group="relay", url=""),
        hostname="console-test", ledger_retention_ns=3600 * 10**9, dlq_retention_ns=None,
        publish_dedup_window_ns=DEFAULT_DEDUP_WINDOW_NS,
    )
    broker = await open_broker(stack, settings, SystemClock())
    db = open_history_db(tmp_path / "db.sqlite3")
    stack.callback(db.close)

    async def send(_command: Any) -> None:
        raise RelayError("not in this test")

    return Console(
        reads=ConsoleReads(broker, stream="events", group="relay"),
        history=RunHistory(tmp_path / "db.sqlite3"), db=db, registry=FunctionRegistry(),
        breakers=Breakers(), replays=ReplayQueue(send), access=Access(secrets, token_secret),
    )


BROKERS: dict[str, Any] = {}
"""The embedded broker each served console reads, by its URL."""
FILES: dict[str, Path] = {}
"""Its broker file, by the console's URL (the test writes entries with a store of its own)."""


async def _serve(tmp_path: Path, token_secret: str | None = None, **kw: Any
                 ) -> AsyncIterator[tuple[str, ConsoleServer]]:
    secrets = InMemorySecretStore({"console-token": TOKEN + "\n"})
    async with AsyncExitStack() as stack:
        console = await _console(tmp_path, stack, token_secret, secrets)
        server = ConsoleServer(console, "127.0.0.1", 0, **kw)
        await server.bind()
        async with anyio.create_task_group() as tg:
            await tg.start(server.run)
            url = f"http://127.0.0.1:{server.bound_port}"
            BROKERS[url] = console.reads._broker
            FILES[url] = tmp_path / "broker.sqlite3"
            yield url, server
            tg.cancel_scope.cancel()


@pytest.fixture
async def open_console(tmp_path: Path) -> AsyncIterator[tuple[str, ConsoleServer]]:
    async for served in _serve(tmp_path):
        yield served


@pytest.fixture
async def token_console(tmp_path: Path) -> AsyncIterator[tuple[str, ConsoleServer]]:
    async for served in _serve(tmp_path, "console-token"):
        yield served


def _client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def test_every_page_answers_on_loopback_with_the_security_headers(
    open_console: tuple[str, ConsoleServer],
) -> None:
    url, _server = open_console
    async with _client() as http:
        for path in ("/", "/functions", "/runs", "/dlq", "/runs?outcome=exhausted",
                     "/static/uPlot.iife.min.js"):
            async with http.get(url + path) as r:
                assert r.status == 200, path
                assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
                assert r.headers["X-Frame-Options"] == "DENY"
        async with http.get(url + "/runs?outcome=nonsense") as r:
            assert r.status == 200
            assert "unknown outcome &#39;nonsense&#39;" in await r.text()  # escaped, one line
        async with http.get(url + "/trace/not-an-id") as r:
            assert r.status == 400
        async with http.get(url + "/trace/1-0") as r:
            assert r.status == 200
            assert "Verdict:" in await r.text()
        async with http.get(url + "/dlq/1-0") as r:
            assert r.status == 404


async def test_a_post_without_its_csrf_token_is_refused(
    open_console: tuple[str, ConsoleServer],
) -> None:
    url, _server = open_console
    async with _client() as http:
        async with http.post(url + "/dlq/remove", data={"id": "1-0", "confirm": "yes"}) as r:
            assert r.status == 403
        async with http.get(url + "/dlq") as r:
            csrf = CSRF.search(await r.text()).group(1)  # type: ignore[union-attr]
        async with http.post(url + "/dlq/remove", data={"id": "1-0", "csrf": "0" * 64}) as r:
            assert r.status == 403
        async with http.post(url + "/dlq/remove", data={"id": "1-0", "csrf": csrf}) as r:
            assert r.status == 200
            assert "Remove 1 dead-lettered entry?" in await r.text()
    async with _client() as other:  # another browser's session: its token does not fit
        async with other.get(url + "/") as r:
            await r.read()
        async with other.post(url + "/dlq/remove", data={"id": "1-0", "csrf": csrf}) as r:
            assert r.status == 403


async def test_beyond_loopback_a_token_is_needed_and_never_shown(
    token_console: tuple[str, ConsoleServer],
) -> None:
    url, _server = token_console
    async with _client() as http:
        async with http.get(url + "/") as r:
            assert r.status == 401
        async with http.get(url + "/", headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401
        async with http.get(url + "/", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 200
        async with http.get(url + "/login") as r:
            assert r.status == 200
            csrf = CSRF.search(await r.text()).group(1)  # type: ignore[union-attr]
        async with http.post(url + "/login", data={"token": "wrong", "csrf": csrf}) as r:
            assert r.status == 401
        async with http.post(url + "/login", data={"token": TOKEN, "csrf": csrf},
                             allow_redirects=False) as r:
            assert r.status == 303
            cookie = r.cookies[AUTH_COOKIE].value
            assert TOKEN not in cookie
        for path in ("/", "/functions", "/runs", "/dlq"):
            async with http.get(url + path) as r:
                assert r.status == 200, path
                assert TOKEN not in await r.text()
        assert http.cookie_jar.filter_cookies(URL(url))[SESSION_COOKIE].value


async def test_a_missing_token_secret_refuses_to_start(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        console = await _console(tmp_path, stack, "absent-secret", InMemorySecretStore())
        with pytest.raises(RelayError, match=r'^CONSOLE_TOKEN_SECRET: secret "absent-secret"'):
            await ConsoleServer(console, "127.0.0.1", 0).bind()
        blank = await _console(tmp_path / "b", stack, "blank",
                               InMemorySecretStore({"blank": "  \n"}))
        with pytest.raises(RelayError, match="is empty"):
            await ConsoleServer(blank, "127.0.0.1", 0).bind()


async def test_a_body_over_the_cap_is_refused(open_console: tuple[str, ConsoleServer]) -> None:
    url, _server = open_console
    async with _client() as http:
        big = {"id": "x" * (MAX_BODY_BYTES + 1)}
        async with http.post(url + "/dlq/remove", data=big) as r:
            assert r.status == 413


async def test_a_stalled_connection_is_cut_at_the_read_deadline(tmp_path: Path) -> None:
    async for url, server in _serve(tmp_path, read_deadline_s=0.5, max_connections=1,
                                    max_waiting=0):
        port = int(url.rsplit(":", 1)[1])
        stalled = await anyio.connect_tcp("127.0.0.1", port)
        await stalled.send(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
        refused = await anyio.connect_tcp("127.0.0.1", port)  # over the cap: closed at once
        with anyio.fail_after(5):
            assert await _closed(refused)
            assert await _closed(stalled)
        assert server.guard.refused == 1
        assert server.guard.timed_out == 1
        async with _client() as http, http.get(url + "/") as r:
            assert r.status == 200  # the slot is free again
        await stalled.aclose()
        await refused.aclose()


async def _closed(stream: Any) -> bool:
    try:
        while await stream.receive():
            pass
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
        return True
    return True


async def test_a_dead_letter_is_listed_inspected_escaped_and_removed_after_a_confirmation(
    open_console: tuple[str, ConsoleServer],
) -> None:
    url, _server = open_console
    store = BrokerStore(FILES[url], SystemClock())  # a second connection, as a CLI's
    hostile = '{"kind": "</pre><script>alert(1)</script>", "n": 1}'
    entry = DeadLetterEntry(original_stream="events", original_id="1700000000000-1",
                            group="relay", consumer="w", event=hostile, reason="boom <b>",
                            function="fn", handler="h", handler_attempts=3)
    try:
        entry_id = await store.write(lambda c, now_ms: insert_dead_letter(c, now_ms, entry))
    finally:
        store.close()
    async with _client() as http:
        async with http.get(url + "/dlq?function=fn") as r:
            page = await r.text()
            assert entry_id in page
            assert "boom &lt;b&gt;" in page
            csrf = CSRF.search(page).group(1)  # type: ignore[union-attr]
        async with http.get(url + "/dlq?function=other") as r:
            assert entry_id not in await r.text()
        async with http.get(url + f"/dlq/{entry_id}") as r:
            page = await r.text()
            escaped = "&#34;kind&#34;: &#34;&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;&#34;,"
            assert escaped in page
            assert '\n  &#34;n&#34;: 1\n' in page  # pretty-printed
            assert "<script>alert" not in page
        async with http.post(url + "/dlq/remove", data={"id": entry_id, "csrf": csrf}) as r:
            assert "Remove 1 dead-lettered entry?" in await r.text()
        assert (await BROKERS[url].dead_letters.count()) == 1  # asked, not removed
        form = {"id": entry_id, "csrf": csrf, "confirm": "yes"}
        async with http.post(url + "/dlq/remove", data=form, allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/dlq?notice=removed+1+entr(y/ies)"
        assert (await BROKERS[url].dead_letters.count()) == 0


async def test_an_unreadable_broker_is_one_line_on_the_page(tmp_path: Path) -> None:
    async for url, _server in _serve(tmp_path):
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / f"broker.sqlite3{suffix}").unlink(missing_ok=True)
        (tmp_path / "broker.sqlite3").mkdir()  # a directory where the file was
        async with _client() as http:
            for path in ("/dlq", "/trace/1-0"):
                async with http.get(url + path) as r:
                    assert r.status == 503, path
                    assert "cannot read from the broker: " in await r.text()
            async with http.get(url + "/") as r:
                assert r.status == 200  # the overview says "-" for the backlog
