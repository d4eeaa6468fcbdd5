"""Shared pieces of the stream benchmarks: a throwaway Redis, a throwaway
``relay start`` worker, command-count deltas, XADD->XACK latency (without
MONITOR) and round trips per event (with it).

Not a test helper: benchmarks print figures and ratios measured side by side in
one run; nothing here asserts on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import hiredis
import redis as redis_sync
from redis.asyncio import Redis

from relay.adapters.redis.keys import invocation_key

ROOT = Path(__file__).resolve().parents[1]
REDIS_IMAGE = "relay-testbed/redis:7"
RELAY = str(Path(sys.executable).parent / "relay")
BENCH_EVENT = '{"kind":"bench"}'  # matched by NOOP_TEMPLATE's pattern

# Commands the benchmark itself sends; never counted as the consumer's work.
BENCH_COMMANDS = frozenset(
    {
        "xadd",
        "info",
        "xinfo",
        "xinfo|groups",
        "client",
        "ping",
        "monitor",
        "config|resetstat",
        "xlen",
        "xgroup|create",
        "hello",
        "client|setinfo",
        "select",
        "del",
    }
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def throwaway_redis(url: str | None = None) -> Iterator[str]:
    """Yield a Redis URL: ``url`` as given, else a container of the test-bed Redis
    image (label relay.test=true, removed afterwards), else a local redis-server."""
    if url:
        yield url
        return
    name = f"relay-bench-redis-{secrets.token_hex(4)}"
    have_image = (
        subprocess.run(
            ["docker", "image", "inspect", REDIS_IMAGE], capture_output=True, check=False
        ).returncode
        == 0
    )
    if have_image:
        # No published port: the host reaches the container on its bridge address,
        # which avoids docker-proxy's extra hop on every command.
        subprocess.run(
            [
                "docker",
                "run",
                "-d",
                "--rm",
                "--name",
                name,
                "--label",
                "relay.test=true",
                REDIS_IMAGE,
            ],
            check=True,
            capture_output=True,
        )
        try:
            address = subprocess.run(
                ["docker", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", name],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            wait_for_redis(address, 6379)
            yield f"redis://{address}:6379/0"
        finally:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
        return
    port = free_port()
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit(f"bench: neither the image {REDIS_IMAGE} nor redis-server is available")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_redis("127.0.0.1", port)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wait_for_redis(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        client = redis_sync.Redis(host=host, port=port, socket_timeout=1)
        try:
            if client.ping():
                return
        except redis_sync.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            client.close()


async def command_counts(client: Redis) -> dict[str, int]:
    """``INFO commandstats`` as ``{command: calls}`` (commands run inside Lua included)."""
    info: dict[str, Any] = await client.info("commandstats")
    counts = {}
    for key, value in info.items():
        name = key.removeprefix("cmdstat_")
        counts[name] = int(value["calls"]) if isinstance(value, dict) else 0
    return counts


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        name: after[name] - before.get(name, 0)
        for name in after
        if after[name] - before.get(name, 0) and name not in BENCH_COMMANDS
    }


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def acked_everything(client: Redis, stream: str, group: str, last_id: str) -> bool:
    """True once ``group`` has delivered ``last_id`` and nothing is pending."""
    for info in await client.xinfo_groups(stream):
        if info["name"] == group:
            return bool(info["last-delivered-id"] == last_id and int(info["pending"]) == 0)
    return False


async def wait_acked(
    client: Redis, stream: str, group: str, last_id: str, limit_s: float, alive: Any = None
) -> float:
    """Poll until everything up to ``last_id`` is acknowledged; the monotonic time then."""
    deadline = time.monotonic() + limit_s
    while not await acked_everything(client, stream, group, last_id):
        if alive is not None and not alive():
            raise SystemExit("bench: the relay worker exited; see its log above")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: not everything acknowledged within {limit_s:.0f}s")
        await anyio.sleep(0.005)
    return time.monotonic()


def bulk(part: str | bytes | int) -> bytes:
    """One RESP bulk string."""
    raw = part if isinstance(part, bytes) else str(part).encode()
    return b"$%d\r\n%s\r\n" % (len(raw), raw)


def resp_command(*parts: str | bytes | int) -> bytes:
    """One command packed as RESP (a bench writes it on a socket of its own)."""
    return b"*%d\r\n" % len(parts) + b"".join(bulk(part) for part in parts)


def _xadd_parts(stream: str) -> tuple[bytes, bytes]:
    """XADD stream * seq <n> event <body>, packed once: everything before <n>, and after."""
    prefix = b"*7\r\n" + b"".join(bulk(p) for p in ("XADD", stream, "*", "seq"))
    return prefix, bulk("event") + bulk(BENCH_EVENT)


async def add_burst(client: Redis, stream: str, count: int, *, first_seq: int = 0) -> str:
    """XADD ``count`` events, pipelined in chunks of 500 on a connection of its own;
    returns the last id. The commands are packed by hand and the replies parsed by
    hiredis: the producer shares the machine's two cores with what it measures, and
    redis-py's per-command encoding cost about 40 us of CPU per event."""
    kwargs = client.connection_pool.connection_kwargs
    prefix, suffix = _xadd_parts(stream)
    reader = hiredis.Reader()
    last = b""
    async with await anyio.connect_tcp(
        kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    ) as conn:
        if kwargs.get("db"):
            await conn.send(resp_command("SELECT", kwargs["db"]))
            while reader.gets() is False:
                reader.feed(await conn.receive())
        for start in range(0, count, 500):
            chunk = range(first_seq + start, first_seq + min(count, start + 500))
            await conn.send(b"".join(prefix + bulk(seq) + suffix for seq in chunk))
            for _ in chunk:
                reply = reader.gets()
                while reply is False:
                    reader.feed(await conn.receive())
                    reply = reader.gets()
                if isinstance(reply, hiredis.ReplyError):
                    raise SystemExit(f"bench: XADD failed: {reply}")
                last = reply
    return last.decode()


@dataclass
class LatencyRun:
    latencies_ms: list[float] = field(default_factory=list)
    round_trips: int = 0
    commands_in_scripts: int = 0
    events: int = 0
    instrument_cpu: float = 0.0  # the producer and probe's own CPU, in cores


@dataclass
class Paced:
    """What :func:`paced_run` saw: entry id -> ``time.monotonic()`` just before its
    XADD was written; entry id -> when its settlement reached the probe; and the
    instrument's own CPU over the run, as a share of one core."""

    sent: dict[str, float]
    acked: dict[str, float]
    cpu_share: float


def redis_address(url: str) -> tuple[str, int, int]:
    """Host, port and database number of a ``redis://`` URL, as redis-py reads it."""
    kwargs = redis_sync.Redis.from_url(url).connection_pool.connection_kwargs
    host, port = kwargs.get("host", "localhost"), int(kwargs.get("port", 6379))
    return host, port, int(kwargs.get("db") or 0)


def _connect(host: str, port: int, db: int) -> socket.socket:
    conn = socket.create_connection((host, port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if db:
        conn.sendall(resp_command("SELECT", db))
        reader = hiredis.Reader()
        while reader.gets() is False:
            reader.feed(conn.recv(4096))
    return conn


def paced_run(
    url: str,
    stream: str,
    rate: float,
    count: int,
    watch_prefix: bytes | None = None,
    limit_s: float = 300.0,
) -> Paced:
    """XADD ``count`` events at ``rate``/s and, with ``watch_prefix`` (the ledger
    keys' start, :func:`settled_prefix`), watch them
    settle (see :class:`Paced`).

    The instrument shares the machine's two cores with what it measures, so it is
    one thread on two raw sockets: XADDs packed once and written without waiting
    for their replies, which are taken (and their ids parsed by hiredis) every
    64 events without a wake-up of their own, and ``select`` with microsecond
    timeouts for the pacing and the notifications. The asyncio producer plus a
    redis-py subscriber thread it replaces used about 40% of a core at 2,250
    events/s, as much as two thirds of the worker it was measuring.

    Settlement, without MONITOR: the script that XACKs a message also gives its
    ledger hash a TTL in the same atomic step, and Redis publishes that ``EXPIRE``
    as a key-event notification (``notify-keyspace-events Eg``), stamped on
    arrival: the moment a client can learn of the acknowledgment. It costs Redis
    one small publish per message. CLOCK_MONOTONIC is one clock for every process
    on the machine, so a consumer of its own can stamp its XACKs the same way.
    """
    host, port, db = redis_address(url)
    prefix, suffix = _xadd_parts(stream)
    producer = _connect(host, port, db)
    replies = hiredis.Reader()
    stamps: list[float] = []
    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    watcher = None
    notifications = hiredis.Reader()
    watched, skip = watch_prefix or b"", len(watch_prefix or b"")
    previous: Any = b""
    if watch_prefix is not None:
        admin = redis_sync.Redis.from_url(url)
        previous = next(iter(admin.config_get("notify-keyspace-events").values()), b"")
        admin.config_set("notify-keyspace-events", "Eg")
        watcher = _connect(host, port, db)
        watcher.sendall(resp_command("SUBSCRIBE", f"__keyevent@{db}__:expire"))
        while notifications.gets() is False:  # the subscription is confirmed
            notifications.feed(watcher.recv(4096))

    def take_replies(wait: bool) -> None:
        while True:
            try:
                data = producer.recv(65536, 0 if wait else socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not data:
                raise SystemExit("bench: Redis closed the producer's connection")
            replies.feed(data)
            while (reply := replies.gets()) is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise SystemExit(f"bench: XADD failed: {reply}")
                sent[reply.decode()] = stamps[len(sent)]
            if wait:
                return

    sending = [] if watcher is None else [watcher]
    cpu_before = time.thread_time()
    try:
        start = time.monotonic()
        deadline = start + count / rate + limit_s
        seq = 0
        while True:
            now = time.monotonic()
            if seq < count:
                due = start + seq / rate
                if due <= now:
                    stamps.append(now)
                    producer.sendall(prefix + bulk(seq) + suffix)
                    seq += 1
                    if seq % 64 == 0:
                        take_replies(wait=False)
                    continue
                timeout, sockets = due - now, sending
            elif len(sent) == count and (watcher is None or len(acked) >= count):
                break
            elif now > deadline:
                break  # the report says how many were measured
            else:
                timeout, sockets = 0.2, [producer, *sending]
            readable, _, _ = select.select(sockets, [], [], timeout)
            arrived = time.monotonic()
            if producer in readable:
                take_replies(wait=True)
            if watcher is not None and watcher in readable:
                notifications.feed(watcher.recv(65536))
                while (message := notifications.gets()) is not False:
                    key = message[2]
                    if isinstance(key, bytes) and key.startswith(watched):
                        acked.setdefault(key[skip:].decode(), arrived)
    finally:
        producer.close()
        if watcher is not None:
            watcher.close()
            admin.config_set("notify-keyspace-events", previous)
            admin.close()
    used = time.thread_time() - cpu_before
    return Paced(sent, acked, used / max(time.monotonic() - start, 1e-9))


async def paced_adds(url: str, stream: str, rate: float, count: int) -> Paced:
    """XADD ``count`` events at ``rate``/s (:func:`paced_run`, nothing watched)."""
    paced: Paced = await anyio.to_thread.run_sync(paced_run, url, stream, rate, count)
    return paced


def latencies(sent: dict[str, float], acked: dict[str, float]) -> list[float]:
    """Milliseconds from each XADD to its acknowledgment, where both are known."""
    return [(acked[i] - t) * 1000 for i, t in sent.items() if i in acked]


def settled_prefix(stream: str, group: str) -> bytes:
    """Where Relay's ledger keys for ``stream`` and ``group`` start."""
    return invocation_key(stream, group, "").encode()


async def settle_latency(
    url: str, stream: str, group: str, rate: float, count: int, limit_s: float = 300.0
) -> LatencyRun:
    """XADD->XACK latency at ``rate``/s of a consumer that settles through Relay's
    ledger scripts (:func:`paced_run`)."""
    paced: Paced = await anyio.to_thread.run_sync(
        paced_run, url, stream, rate, count, settled_prefix(stream, group), limit_s
    )
    return LatencyRun(
        latencies_ms=latencies(paced.sent, paced.acked),
        events=count,
        instrument_cpu=paced.cpu_share,
    )


@dataclass
class SteadyRun:
    """A paced run with what it cost: CPU per event of the consumer process and
    of Redis (its own ``INFO cpu``, so a Redis in a container needs no pid)."""

    latencies_ms: list[float]
    consumer_us: float
    redis_us: float


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` and its live children so far (Linux
    ``/proc``): the children are the worker processes of ``relay start --processes N``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return own
    return own + sum(process_cpu_s(int(child)) for child in children)


async def redis_cpu_s(client: Redis) -> float:
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def steady_run(
    url: str, stream: str, group: str, rate: float, count: int, consumer_pid: int
) -> SteadyRun:
    """:func:`settle_latency` at ``rate``, with the consumer's and Redis's CPU per
    event over the run: at one rate for every consumer, the comparison is of their
    code, not of the load each was given."""
    client = Redis.from_url(url)
    try:
        consumer, server = process_cpu_s(consumer_pid), await redis_cpu_s(client)
        run = await settle_latency(url, stream, group, rate, count)
        consumer = process_cpu_s(consumer_pid) - consumer
        server = await redis_cpu_s(client) - server
    finally:
        await client.aclose()
    return SteadyRun(run.latencies_ms, consumer / count * 1e6, server / count * 1e6)


async def monitored_round_trips(
    url: str, stream: str, group: str, rate: float, count: int, limit_s: float = 300.0
) -> LatencyRun:
    """XADD ``count`` events at ``rate``/s while ``redis-cli monitor`` (C, writing to a
    file, so parsing costs nothing during the run) records every command: counts
    the consumer's top-level commands (round trips; pipelined ones count one each)
    and the commands its Lua scripts ran. MONITOR slows Redis down, so no latency
    is taken from this run."""
    cli = shutil.which("redis-cli")
    if cli is None:
        raise SystemExit("bench: redis-cli is needed to count round trips")
    host, port, _ = redis_address(url)
    client = Redis.from_url(url, decode_responses=True)
    with tempfile.NamedTemporaryFile(prefix="relay-bench-monitor-", suffix=".log") as log:
        monitor = _start_monitor([cli, "-h", host, "-p", str(port), "monitor"], log)
        try:
            await anyio.sleep(0.3)  # MONITOR is attached
            sent = (await paced_adds(url, stream, rate, count)).sent
            await wait_acked(client, stream, group, list(sent)[-1], limit_s)
            await anyio.sleep(0.3)  # the last lines reach the file
        finally:
            monitor.terminate()
            monitor.wait(timeout=10)
            await client.aclose()
        return _count_monitor(Path(log.name), count)


def _start_monitor(argv: list[str], log: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.DEVNULL)


_QUOTED = re.compile(rb'"((?:[^"\\]|\\.)*)"')


def _count_monitor(path: Path, events: int) -> LatencyRun:
    run = LatencyRun(events=events)
    for line in path.read_bytes().splitlines():
        _stamp, _, rest = line.partition(b" [")
        client, _, command = rest.partition(b"] ")
        tokens = _QUOTED.findall(command)
        if not tokens:
            continue
        name = tokens[0].decode().lower()
        if client.endswith(b" lua"):
            run.commands_in_scripts += 1
        elif name not in BENCH_COMMANDS:
            run.round_trips += 1
    return run


# --- a real `relay start` worker ------------------------------------------------------

NOOP_TEMPLATE = """runtime: python3.14
concurrency: {concurrency}
events:
  - handler: noop.handler
    pattern:
      kind: [bench]
"""
NOOP_HANDLER = "def handler(event):\n    return None\n"


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a crashed host."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout: float = 40.0) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def write_function(root: Path, name: str, template: str, files: dict[str, str]) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "template.yaml").write_text(template)
    for rel, text in files.items():
        (directory / rel).write_text(text)
    return root


def start_worker(
    *,
    url: str,
    stream: str,
    group: str,
    functions: Path,
    workdir: Path,
    name: str,
    extra_env: dict[str, str] | None = None,
    processes: int = 1,
) -> Worker:
    """``relay start --functions DIR [--processes N]`` with its own state and run
    directories."""
    state, run = workdir / f"{name}-state", workdir / f"{name}-run"
    state.mkdir(exist_ok=True)
    run.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RELAY_"))}
    env |= {
        "REDIS_URI": url,
        "REDIS_STREAM": stream,
        "REDIS_GROUP": group,
        "RELAY_STATE_DIR": str(state),
        "RELAY_RUN_DIR": str(run),
        "LOG_LEVEL": "WARN",
        "RELAY_HOSTNAME": name,
    }
    env |= extra_env or {}
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            # the flag only when asked: relay_ab.py runs an older relay without it
            [RELAY, "start", "--functions", str(functions),
             *(["--processes", str(processes)] if processes > 1 else [])],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Worker(proc, log_path)


def start_noop_worker(
    *,
    url: str,
    stream: str,
    group: str,
    root: Path,
    function: str,
    name: str,
    concurrency: int,
    extra_env: dict[str, str] | None = None,
    processes: int = 1,
) -> Worker:
    """``relay start`` on one no-op Python function with MAX_CONCURRENCY =
    ``concurrency`` (so that many warm containers per process), LOG_LEVEL=WARN, plus
    ``extra_env``; ``processes`` worker processes (``--processes``)."""
    functions = write_function(
        root / "functions",
        function,
        NOOP_TEMPLATE.format(concurrency=concurrency),
        {"noop.py": NOOP_HANDLER},
    )
    return start_worker(
        url=url,
        stream=stream,
        group=group,
        functions=functions,
        workdir=root,
        name=name,
        extra_env={"MAX_CONCURRENCY": str(concurrency), **(extra_env or {})},
        processes=processes,
    )


async def warm_up(client: Redis, stream: str, group: str, worker: Worker, limit_s: float) -> None:
    """Send small bursts until one is fully acknowledged (the image is built and
    the containers are warm), then a larger one so every container has served."""
    alive = worker.alive
    deadline = time.monotonic() + limit_s
    while True:
        if not alive():
            raise SystemExit("bench: the relay worker exited during start-up")
        try:
            last = await add_burst(client, stream, 8, first_seq=0)
            await wait_acked(client, stream, group, last, 15, alive=alive)
            break
        except SystemExit:
            if time.monotonic() > deadline:
                raise
    last = await add_burst(client, stream, 400, first_seq=0)
    await wait_acked(client, stream, group, last, 120, alive=alive)


def remove_function_images(function: str) -> None:
    """Images Relay built for this benchmark's uniquely named function."""
    listed = subprocess.run(
        [
            "docker",
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            f"reference=relay-fn-{function}*",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    for image in listed.stdout.split():
        subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)


def run_consumer(consume: Any) -> None:
    """The entry point of a bench consumer process (``bench/_floor.py``,
    ``bench/_lean.py``): ``consume(url, stream, group, image, containers)`` from
    the command line, on uvloop when it is installed (as the worker runs)."""
    url, stream, group, image, containers = sys.argv[1:6]
    try:
        import uvloop  # noqa: PLC0415 - optional, as in the worker
    except ImportError:
        asyncio.run(consume(url, stream, group, image, int(containers)))
        return
    uvloop.run(consume(url, stream, group, image, int(containers)))


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="relay-bench-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
