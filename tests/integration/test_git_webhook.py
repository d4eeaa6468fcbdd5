"""``POST /github`` served by the real aiohttp server on loopback, with the real
coalescing scheduler, the real file secret store and the real metrics; only the
sync itself is a gated fake (the real one is proven in e2e/test_git_e2e.py)."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.git.webhook import WebhookServer
from relay.adapters.metrics.registry import Metrics
from relay.adapters.metrics.subscribers import subscribe
from relay.application.bus import MessageBus
from relay.domain.errors import RelayError
from relay.domain.git import GitSource, SyncSummary
from tests.e2e.harness import run_relay
from tests.fakes_compose import sync_loop

pytestmark = pytest.mark.anyio

REPO = "git@github.com:acme/functions.git"
SECRET_NAME = "github-webhook"


def push_body(ref: str = "refs/heads/main", **extra: object) -> bytes:
    payload = {
        "ref": ref,
        "deleted": False,
        "repository": {"full_name": "acme/functions", "ssh_url": REPO},
        **extra,
    }
    return json.dumps(payload).encode()


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class GatedSync:
    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.release = anyio.Event()

    async def __call__(self) -> SyncSummary:
        self.started += 1
        await self.release.wait()
        self.release = anyio.Event()
        self.finished += 1
        return SyncSummary(commit="c", functions=1)


@dataclass
class Endpoint:
    url: str
    server: WebhookServer
    sync: GatedSync
    metrics: Metrics
    http: aiohttp.ClientSession

    async def post(
        self, body: bytes, *, event: str = "push", delivery: str | None = None,
        signature: str | None = None,
    ) -> tuple[int, str]:
        headers = {"X-GitHub-Event": event, "Content-Type": "application/json"}
        if delivery is not None:
            headers["X-GitHub-Delivery"] = delivery
        if signature is not None:
            headers["X-Hub-Signature-256"] = signature
        async with self.http.post(self.url, data=body, headers=headers) as response:
            return response.status, (await response.text()).strip()

    def deliveries(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "git_webhook_deliveries_total", {"outcome": outcome}
        )
        return value or 0.0


async def wait_for(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 - polling a plain attribute
            await anyio.sleep(0.001)


async def settle(predicate: Callable[[], bool]) -> None:
    """``predicate`` holds over a sustained window (many event-loop turns and 0.2 s)."""
    with anyio.move_on_after(0.2):
        while True:
            assert predicate()
            await anyio.lowlevel.checkpoint()
            await anyio.sleep(0.005)
    assert predicate()


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "secrets"


@pytest.fixture
async def endpoint(
    request: pytest.FixtureRequest, secrets_dir: Path
) -> AsyncIterator[Endpoint]:
    secret = getattr(request, "param", SECRET_NAME)
    source = GitSource(repository=REPO, ref="main", webhook_secret=secret)
    bus = MessageBus({})
    metrics = Metrics()
    subscribe(bus, metrics)
    sync = GatedSync()
    scheduler = sync_loop(sync, lambda _e: None, bus)
    server = WebhookServer(
        "127.0.0.1", 0, source=source, secrets=FileSecretStore(secrets_dir),
        request_sync=scheduler.request, notify=bus.emit, max_body_bytes=64 * 1024,
    )
    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        await tg.start(scheduler.run)
        await tg.start(server.run)
        yield Endpoint(f"http://127.0.0.1:{server.bound_port}/github", server, sync, metrics,
                       http)
        sync.release.set()
        tg.cancel_scope.cancel()


async def test_a_signed_push_is_accepted_at_once_and_only_schedules_the_sync(
    endpoint: Endpoint, secrets_dir: Path
) -> None:
    FileSecretStore(secrets_dir).set(SECRET_NAME, "s3cret")
    body = push_body()
    status, text = await endpoint.post(body, delivery="d1", signature=sign("s3cret", body))
    # 202 came back while the sync is still held: the request never waited for it
    assert (status, text) == (202, "sync scheduled")
    await wait_for(lambda: endpoint.sync.started == 1)
    assert endpoint.sync.finished == 0
    assert endpoint.deliveries("accepted") == 1


async def test_wrong_missing_and_other_secret_signatures_get_401_and_no_sync(
    endpoint: Endpoint, secrets_dir: Path
) -> None:
    FileSecretStore(secrets_dir).set(SECRET_NAME, "s3cret")
    body = push_body()
    for signature in (None, sign("guess", body), "sha256=", "sha1=abc", sign("s3cret", b"{}")):
        status, text = await endpoint.post(body, delivery="d", signature=signature)
        assert status == 401, signature
        assert text == "missing or invalid X-Hub-Signature-256"
        assert "s3cret" not in text
    # malformed JSON with a bad signature is still 401: no hint to the unauthenticated
    status, _ = await endpoint.post(b"{not json", signature=sign("guess", b"{not json"))
    assert status == 401
    await settle(lambda: endpoint.sync.started == 0)
    assert endpoint.deliveries("unauthorized") == 6


async def test_a_secret_rotated_with_relay_secret_set_applies_without_a_restart(
    endpoint: Endpoint, secrets_dir: Path
) -> None:
    env = {"RELAY_STATE_DIR": str(secrets_dir.parent)}
    assert run_relay(["secret", "set", SECRET_NAME], env, stdin="old-secret").returncode == 0
    body = push_body()
    assert (await endpoint.post(body, delivery="a", signature=sign("old-secret", body)))[0] == 202
    # `echo new-secret |` stores a trailing newline; GitHub signs without one
    assert run_relay(["secret", "set", SECRET_NAME], env, stdin="new-secret\n").returncode == 0
    status, _ = await endpoint.post(body, delivery="b", signature=sign("old-secret", body))
    assert status == 401
    status, _ = await endpoint.post(body, delivery="c", signature=sign("new-secret", body))
    assert status == 202


async def test_a_missing_secret_value_refuses_every_delivery(
    endpoint: Endpoint, secrets_dir: Path
) -> None:
    body = push_body()
    status, text = await endpoint.post(body, signature=sign("", body))
    assert (status, text) == (500, "webhook secret unavailable")
    await settle(lambda: endpoint.sync.started == 0)
    assert endpoint.deliveries("unavailable") == 1


@pytest.mark.parametrize("endpoint", [None], indirect=True)
async def test_without_a_secret_pings_other_events_refs_repos_and_deletions_get_200_ignored(
    endpoint: Endpoint,
) -> None:
    other_repo = json.loads(push_body())
    other_repo["repository"] = {"ssh_url": "git@github.com:acme/other.git"}
    cases = [
        (push_body(), "ping", "ping"),
        (push_body(), "issues", "event issues ignored"),
        (push_body(ref="refs/heads/dev"), "push", "other ref ignored"),
        (push_body(deleted=True), "push", "deleted ref ignored"),
        (json.dumps(other_repo).encode(), "push", "other repository ignored"),
    ]
    for body, event, reason in cases:
        assert await endpoint.post(body, event=event) == (200, reason)
    await settle(lambda: endpoint.sync.started == 0)
    assert endpoint.deliveries("ignored") == 5
    # unsigned deliveries are accepted when no secret is configured (the spec's choice)
    assert (await endpoint.post(push_body()))[0] == 202


@pytest.mark.parametrize("endpoint", [None], indirect=True)
async def test_malformed_json_gets_400_and_an_oversized_body_413(endpoint: Endpoint) -> None:
    assert await endpoint.post(b"{not json") == (400, "body is not JSON")
    assert await endpoint.post(b"\xff\xfe") == (400, "body is not JSON")
    huge = push_body(padding="x" * (64 * 1024))
    status, text = await endpoint.post(huge)
    assert (status, text) == (413, f"body over {64 * 1024} bytes")
    # without a Content-Length (chunked), the cap holds while reading
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b"x" * 8192

    async with endpoint.http.post(endpoint.url, data=chunks(),
                                  headers={"X-GitHub-Event": "push"}) as response:
        assert response.status == 413
    await settle(lambda: endpoint.sync.started == 0)
    assert endpoint.deliveries("too_large") == 2
    assert endpoint.deliveries("malformed") == 2


@pytest.mark.parametrize("endpoint", [None], indirect=True)
async def test_a_replayed_delivery_id_is_acknowledged_without_a_second_sync(
    endpoint: Endpoint,
) -> None:
    assert (await endpoint.post(push_body(), delivery="same"))[0] == 202
    await wait_for(lambda: endpoint.sync.started == 1)
    endpoint.sync.release.set()
    await wait_for(lambda: endpoint.sync.finished == 1)
    assert await endpoint.post(push_body(), delivery="same") == (
        200, "delivery already accepted; no second sync"
    )
    await settle(lambda: endpoint.sync.started == 1)
    assert endpoint.deliveries("duplicate") == 1


@pytest.mark.parametrize("endpoint", [None], indirect=True)
async def test_a_burst_of_20_pushes_during_a_sync_gives_exactly_one_follow_up(
    endpoint: Endpoint,
) -> None:
    assert (await endpoint.post(push_body(), delivery="first"))[0] == 202
    await wait_for(lambda: endpoint.sync.started == 1)
    async with anyio.create_task_group() as tg:
        for n in range(20):
            async def one(n: int = n) -> None:
                status, _ = await endpoint.post(push_body(), delivery=f"burst-{n}")
                assert status == 202
            tg.start_soon(one)
    assert endpoint.deliveries("accepted") == 21
    endpoint.sync.release.set()
    await wait_for(lambda: endpoint.sync.started == 2)
    endpoint.sync.release.set()
    await wait_for(lambda: endpoint.sync.finished == 2)
    await settle(lambda: endpoint.sync.started == 2)


async def test_a_taken_port_is_fatal_at_start(secrets_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = WebhookServer(
            "127.0.0.1", port, source=GitSource(repository=REPO),
            secrets=FileSecretStore(secrets_dir), request_sync=lambda: None,
            notify=lambda _e: None,
        )
        with pytest.raises(RelayError) as caught:
            await server.run()
    assert str(caught.value).startswith(f"GIT_WEBHOOK_ADDR 127.0.0.1:{port}: cannot listen (")


@pytest.mark.parametrize(("secret", "expected"), [
    (None, ["git_webhook_listening", "git_webhook_unauthenticated"]),
    (SECRET_NAME, ["git_webhook_listening"]),
])
async def test_the_start_up_log_names_the_address_and_says_plainly_when_unauthenticated(
    secrets_dir: Path, secret: str | None, expected: list[str]
) -> None:
    server = WebhookServer(
        "127.0.0.1", 0, source=GitSource(repository=REPO, webhook_secret=secret),
        secrets=FileSecretStore(secrets_dir), request_sync=lambda: None, notify=lambda _e: None,
    )
    with capture_logs() as logs:
        await server.bind()
    await server.aclose()
    assert [e["event"] for e in logs] == expected
    assert logs[0]["detail"] == f"Webhook http server listening on 127.0.0.1:{server.bound_port}"
    if secret is None:
        assert "unauthenticated" in logs[1]["detail"]
