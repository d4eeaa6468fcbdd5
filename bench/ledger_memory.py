"""Redis memory a finished message leaves behind: its ledger hash, next to its stream entry.

    .venv/bin/python bench/ledger_memory.py [--messages 20000] [--redis-url URL]

Against a throwaway Redis (see ``_redisbench.throwaway_redis``) unless
``--redis-url`` is given, it writes ``--messages`` events to a fresh stream
(the baseline: what the stream entries themselves cost, from ``used_memory``
before and after), reads them into a consumer group, and runs each one
through the ledger's real ``begin`` and ``finish`` scripts as a worker does
for a handled event, once with one matching handler and once with three.
It prints the bytes per message of the stream entries and of the ledger
hashes left after the acknowledgment, plus ``MEMORY USAGE`` of one hash.

The hashes keep their TTL (``LEDGER_RETENTION``), so multiply the per-message
figure by your rate and that retention to size Redis (docs/configuration.md).
Prints figures only; nothing here asserts.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

import redis as redis_sync

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _redisbench import throwaway_redis

from relay.adapters.redis.keys import dlq_key, invocation_key
from relay.adapters.redis.ledger import ACKED_TTL_S, _pack, _records, load_script

EVENT = '{"type": "order.created", "order_id": 123456, "total": 42.5}'
TOKEN = secrets.token_hex(16)
BATCH = 1_000


def used(client: redis_sync.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def stream_of(client: redis_sync.Redis, stream: str, group: str, count: int) -> list[str]:
    client.xgroup_create(stream, group, id="0", mkstream=True)
    ids: list[str] = []
    for start in range(0, count, BATCH):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(BATCH, count - start)):
            pipe.xadd(stream, {"event": EVENT})
        ids += [i.decode() for i in pipe.execute()]
    client.xreadgroup(group, "bench-worker", {stream: ">"}, count=count)
    return ids


def settle(
    client: redis_sync.Redis, stream: str, group: str, ids: list[str], handlers: int
) -> None:
    """``begin`` then ``finish`` (every handler ok) for each message, pipelined."""
    begin, finish = load_script("begin"), load_script("finish")
    shas = client.script_load(begin.source), client.script_load(finish.source)
    fields = [f"billing/handlers.step_{n}" for n in range(handlers)]
    claims = "\x1e".join(_pack(f, "5", "15000") for f in fields)
    reports = "\x1e".join(_pack(f, "1", "ok", "") for f in fields)
    for sha, phase in zip(shas, ("begin", "finish"), strict=True):
        for start in range(0, len(ids), BATCH):
            pipe = client.pipeline(transaction=False)
            for message_id in ids[start : start + BATCH]:
                keys = (invocation_key(stream, group, message_id), stream, dlq_key(stream))
                head = _pack(group, "bench-worker", message_id, "2026-01-01T00:00:00.000Z",
                             str(ACKED_TTL_S), "0")
                if phase == "begin":
                    args = (head, "matched:billing", TOKEN, claims, _records(fields))
                else:
                    args = (head, TOKEN, reports, _records(fields), *([""] * handlers))
                pipe.evalsha(sha, 3, *keys, *args)
            for reply in pipe.execute():
                if phase == "finish" and int(reply[0][0]) != 1:
                    raise SystemExit(f"bench: a message was not acknowledged: {reply!r}")


def measure(client: redis_sync.Redis, messages: int, handlers: int) -> tuple[float, float, int]:
    stream, group = f"bench-mem-{secrets.token_hex(4)}", "relay"
    before = used(client)
    ids = stream_of(client, stream, group, messages)
    with_stream = used(client)
    settle(client, stream, group, ids, handlers)
    after = used(client)
    one = client.memory_usage(invocation_key(stream, group, ids[0])) or 0
    client.delete(stream, *[invocation_key(stream, group, i) for i in ids])
    return (with_stream - before) / messages, (after - with_stream) / messages, int(one)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    with throwaway_redis(args.redis_url) as url:
        client = redis_sync.Redis.from_url(url)
        print(f"{args.messages} finished messages, bytes per message (Redis used_memory deltas)")
        print(f"{'handlers':>8}  {'stream entry':>12}  {'ledger hash':>11}  {'one hash':>8}")
        for handlers in (1, 3):
            entry, ledger, one = measure(client, args.messages, handlers)
            print(f"{handlers:>8}  {entry:>12.0f}  {ledger:>11.0f}  {one:>8}")
        client.close()


if __name__ == "__main__":
    main()
