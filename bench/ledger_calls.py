"""CPU per message of the ledger's two script calls, old ScriptChannel against new.

Runs N messages' ``begin`` + ``finish`` through :class:`RedisInvocationLedger`
with 16 concurrent tasks (as a worker's read batch does), in one process, and
reports the CPU this process spent per message (``time.process_time``: robust
while others use the machine) and messages per second (wall clock: only
indicative on a shared machine). ``old`` is the channel at a baseline commit
(redis-py connection, roles handed from caller to caller), loaded from git into
this process; ``new`` is the working tree's; ``lean`` is the yardstick, the bare
protocol of ``bench/_lean.py`` with none of the channel's guarantees. They
alternate within each round and the figures are medians over the rounds. Redis
is a throwaway one (see ``_redisbench.throwaway_redis``) unless ``--url`` is
given. Run it under uvloop (as the worker runs), asyncio, or both:

    .venv/bin/python bench/ledger_calls.py [--messages 4000] [--rounds 7] [--tasks 16] [--loop both]

Prints figures only; nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import secrets
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _lean import RespProtocol
from _redisbench import add_burst, throwaway_redis

from relay.adapters.redis.connection import redis_client
from relay.adapters.redis.ledger import RedisInvocationLedger
from relay.adapters.redis.scripts import LuaScript
from relay.domain.invocation import Complete
from relay.domain.outcome import (
    AttemptReport,
    BeginRequest,
    ClaimRequest,
    FinishRequest,
    MessageContext,
)

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "80b0100"  # the last commit with the redis-py ScriptChannel
SCRIPTS = "src/relay/adapters/redis/scripts.py"
FIELD = "bench/bench.noop"
WARM = 64  # messages per run before the measurement (connect, SCRIPT LOAD)


def baseline_scripts(commit: str) -> types.ModuleType:
    """``scripts.py`` as it was at ``commit``, as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:{SCRIPTS}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    spec = importlib.util.spec_from_loader("relay_bench_old_scripts", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, f"{commit}:{SCRIPTS}", "exec"), module.__dict__)  # our own file, from git
    return module


class LeanChannel:
    """The yardstick: ``bench/_lean.py``'s bare protocol (no timeouts, shielding,
    reconnects or NOSCRIPT handling) behind the channel's ``call``."""

    def __init__(self, client: Any, scripts: list[LuaScript]) -> None:
        self._client = client
        self._scripts = scripts
        self._protocol: Any = None

    async def call(self, script: LuaScript, keys: list[str], args: list[str]) -> Any:
        if self._protocol is None:
            kwargs = self._client.connection_pool.connection_kwargs
            _, protocol = await asyncio.get_running_loop().create_connection(
                RespProtocol, kwargs.get("host", "localhost"), kwargs.get("port", 6379)
            )
            for each in self._scripts:
                await protocol.call(each.load_command())
            self._protocol = protocol
        return await self._protocol.call(script.evalsha(keys, args))


def ledger_for(variant: str, client: Any, old: types.ModuleType) -> RedisInvocationLedger:
    ledger = RedisInvocationLedger(client)
    if variant == "lean":
        scripts = [ledger._begin, ledger._finish, ledger._malformed]
        ledger._channel = LeanChannel(client, scripts)  # type: ignore[assignment]  # same call()
    elif variant == "old":
        # the baseline module has its own ScriptChannel class, with the same call()
        ledger._channel = old.ScriptChannel(lambda: old.dedicated_connection(client))
    return ledger


def requests(stream: str, group: str, message_id: str) -> tuple[BeginRequest, FinishRequest]:
    ctx = MessageContext(
        stream=stream, group=group, consumer="c1", message_id=message_id, timestamp="t"
    )
    token = secrets.token_hex(8)
    begin = BeginRequest(
        context=ctx,
        classification="matched:bench",
        token=token,
        claims=(ClaimRequest(field=FIELD, max_attempts=3, lease_ms=60_000),),
        gates=(FIELD,),
    )
    finish = FinishRequest(
        context=ctx,
        token=token,
        reports=(AttemptReport(field=FIELD, attempt=1, transition=Complete()),),
        gates=(FIELD,),
    )
    return begin, finish


async def one_run(
    client: Any, variant: str, old: types.ModuleType, messages: int, tasks: int
) -> tuple[float, float]:
    """(CPU us per message, messages per second) for one fresh ledger."""
    stream, group = f"bench-ledger-{secrets.token_hex(4)}", "g"
    await client.xgroup_create(stream, group, id="0", mkstream=True)
    await add_burst(client, stream, WARM + messages)
    ids: list[str] = []
    while len(ids) < WARM + messages:
        reply = await client.xreadgroup(group, "c1", {stream: ">"}, count=1000)
        ids += [entry[0].decode() for entry in reply[0][1]]
    work = [requests(stream, group, message_id) for message_id in ids]
    ledger = ledger_for(variant, client, old)

    async def drain(queue: list[tuple[BeginRequest, FinishRequest]]) -> None:
        while queue:
            begin, finish = queue.pop()
            result = await ledger.begin(begin)
            if result.statuses[0].status != "claimed":
                raise SystemExit(f"bench: unexpected claim status {result.statuses[0]}")
            settled = await ledger.finish(finish)
            if not settled.acknowledged:
                raise SystemExit("bench: a finished message was not acknowledged")

    async def run(queue: list[tuple[BeginRequest, FinishRequest]]) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(tasks):
                tg.start_soon(drain, queue)

    await run(work[:WARM])
    measured = work[WARM:]
    cpu, wall = time.process_time(), time.perf_counter()
    await run(measured)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await client.delete(stream)
    keys = [key async for key in client.scan_iter(match=f"relay:invocation:{stream}:*", count=1000)]
    for start in range(0, len(keys), 500):
        await client.delete(*keys[start : start + 500])
    return cpu / messages * 1e6, messages / wall


async def compare(url: str, args: argparse.Namespace, label: str) -> None:
    old = baseline_scripts(args.baseline)
    client = redis_client(url)
    figures: dict[str, list[tuple[float, float]]] = {"old": [], "new": [], "lean": []}
    try:
        for number in range(args.rounds):
            order = ("old", "new", "lean") if number % 2 == 0 else ("lean", "new", "old")
            for variant in order:
                run = await one_run(client, variant, old, args.messages, args.tasks)
                figures[variant].append(run)
    finally:
        await client.aclose()
    print(f"\n{label}: {args.messages} messages x {args.rounds} rounds, {args.tasks} tasks")
    print(f"  {'channel':8} {'CPU us/message':>15} {'messages/s':>11}   (medians; CPU per round)")
    medians = {}
    for variant in ("old", "new", "lean"):
        cpu = statistics.median(c for c, _ in figures[variant])
        rate = statistics.median(r for _, r in figures[variant])
        medians[variant] = cpu
        rounds = " ".join(f"{c:.0f}" for c, _ in figures[variant])
        print(f"  {variant:8} {cpu:15.1f} {rate:11.0f}   ({rounds})")
    saved = medians["old"] - medians["new"]
    print(f"  new/old CPU: {medians['new'] / medians['old']:.2f}  (saves {saved:.1f} us/message)")
    print(f"  new above lean: {medians['new'] - medians['lean']:.1f} us/message")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--baseline", default=BASELINE, help="commit of the old scripts.py")
    parser.add_argument("--url", default=None, help="an existing Redis (default: a throwaway one)")
    args = parser.parse_args()
    loops = ("uvloop", "asyncio") if args.loop == "both" else (args.loop,)
    with throwaway_redis(args.url) as url:
        for loop in loops:
            anyio.run(compare, url, args, loop, backend_options={"use_uvloop": loop == "uvloop"})


if __name__ == "__main__":
    main()
