"""HTTP ingest beside ``relay publish`` (issue 33), measured in one run on this machine.

    .venv/bin/python bench/ingest.py [--events 20000] [--concurrency 8] [--runs 3]
                                     [--redis redis://127.0.0.1:6379/0] [--dir DIR]

Prints events/s (the median of ``--runs``), each on the same broker and the same
events (``{"n": <i>, "pad": "<32 bytes>"}``), for:

- **HTTP, batches of 1**: ``POST /v1/events`` with one item per request,
  ``--concurrency`` clients at once;
- **HTTP, batches of 100**: the same with an array of 100 items per request;
- **relay publish, stdin**: the events as JSON lines piped into ``relay publish``
  (one process; it appends ``BATCH`` lines per transaction or pipeline).

The endpoint is Relay's own :class:`IngestServer` (its guard, its token check,
its ``append``) in a process of its own on uvloop, as ``relay start`` serves it,
with a bearer token; the broker is a new embedded broker file in ``--dir``
(default: a temporary directory), or with ``--redis`` a new stream on that
Redis (deleted afterwards). Each answer is one connection (the endpoint closes
it after answering; see docs/producing.md), so batches of 1 pay a TCP handshake
per event. Nothing runs the events: this is the producer side only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import redis

from relay.adapters.fs.secrets import FileSecretStore
from relay.adapters.ingest.server import IngestServer
from relay.adapters.ingest.tokens import IngestTokens
from relay.adapters.redis.connection import connect_redis
from relay.adapters.redis.producer import RedisEventPublisher
from relay.adapters.sqlite.broker.producer import SqliteEventPublisher
from relay.adapters.sqlite.broker.store import BrokerStore
from relay.adapters.system import SystemClock

TOKEN = "bench-token"
SECRET = "ingest-bench"
RELAY = str(Path(sys.executable).with_name("relay"))


def _event(n: int) -> dict[str, Any]:
    return {"n": n, "pad": "x" * 32}


# --- the server process -----------------------------------------------------------------


async def _serve(state: Path, broker: str, stream: str, port_file: Path) -> None:
    secrets = FileSecretStore(state / "secrets")
    secrets.set(SECRET, TOKEN)
    if broker.startswith("redis"):
        publisher: Any = RedisEventPublisher(await connect_redis(broker), stream)
    else:
        publisher = SqliteEventPublisher(BrokerStore(Path(broker), SystemClock()), stream)
    server = IngestServer("127.0.0.1", 0, publisher=publisher,
                          tokens=IngestTokens(secrets, SECRET), notify=lambda _e: None,
                          max_event_bytes=256 * 1024)
    await server.bind()
    written = anyio.Path(f"{port_file}.tmp")
    await written.write_text(str(server.bound_port))
    await written.rename(port_file)  # the parent never reads half a port
    await server.run()


def _start_server(state: Path, broker: str, stream: str) -> tuple[subprocess.Popen[bytes], int]:
    port_file = state / "port"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(state), broker, stream])
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("bench: the ingest server did not start")
        time.sleep(0.05)
    return proc, int(port_file.read_text())


# --- the clients ------------------------------------------------------------------------


async def _post_all(url: str, events: int, batch: int, concurrency: int) -> float:
    """Seconds to append ``events`` in requests of ``batch`` items; every one 202."""
    bodies = [
        json.dumps([{"event": _event(n)} for n in range(start, min(start + batch, events))])
        for start in range(0, events, batch)
    ]
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    queue = iter(bodies)
    refused = 0

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal refused
        for body in queue:
            while True:
                async with http.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status == 202:
                        break
                    if response.status != 429:
                        raise SystemExit(f"bench: answer {response.status}")
                    refused += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(client, http)
        took = time.perf_counter() - began
    if refused:
        print(f"  ({refused} answers were 429 and retried)")
    return took


def _publish_stdin(broker: str, stream: str, events: int) -> float:
    lines = "".join(json.dumps(_event(n)) + "\n" for n in range(events)).encode()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_BROKER"))}
    if broker.startswith("redis"):
        env.update(RELAY_BROKER="redis", REDIS_URI=broker, REDIS_STREAM=stream)
    else:
        env.update(RELAY_BROKER="sqlite", RELAY_BROKER_PATH=broker, REDIS_STREAM=stream)
    began = time.perf_counter()
    done = subprocess.run([RELAY, "publish"], input=lines, env=env, capture_output=True,
                          check=False)
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"bench: relay publish failed: {done.stderr.decode()[-300:]}")
    return took


def _broker(args: argparse.Namespace, work: Path, run: int) -> tuple[str, str]:
    if args.redis:
        return args.redis, f"bench-ingest-{uuid.uuid4().hex[:8]}"
    return str(work / f"broker-{run}.sqlite3"), "events"


def _cleanup(broker: str, stream: str) -> None:
    if broker.startswith("redis"):
        client = redis.Redis.from_url(broker)
        client.delete(stream)
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--redis", default=None, help="a Redis URL (default: embedded broker)")
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="relay-bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)
    figures: dict[str, list[float]] = {"HTTP, batches of 1": [], "HTTP, batches of 100": [],
                                       "relay publish, stdin": []}
    for run in range(args.runs):
        for label, batch in (("HTTP, batches of 1", 1), ("HTTP, batches of 100", 100)):
            broker, stream = _broker(args, work, run * 3 + batch)
            state = work / f"state-{run}-{batch}"
            state.mkdir()
            proc, port = _start_server(state, broker, stream)
            try:
                url = f"http://127.0.0.1:{port}/v1/events"
                took = anyio.run(_post_all, url, args.events, batch, args.concurrency)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
                _cleanup(broker, stream)
            figures[label].append(args.events / took)
        broker, stream = _broker(args, work, run * 3 + 2)
        try:
            figures["relay publish, stdin"].append(
                args.events / _publish_stdin(broker, stream, args.events))
        finally:
            _cleanup(broker, stream)
    where = f"Redis {args.redis}" if args.redis else f"embedded broker in {work}"
    print(f"{args.events} events per run, {args.runs} run(s), {where}, "
          f"HTTP with {args.concurrency} concurrent clients")
    for label, values in figures.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"{label:<22} {statistics.median(values):>10,.0f} events/s  (runs: {shown})")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        state_dir, broker_arg, stream_arg = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
        anyio.run(_serve, state_dir, broker_arg, stream_arg, state_dir / "port",
                  backend_options={"use_uvloop": True})
    else:
        main()
