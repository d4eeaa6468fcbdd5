"""Handlers for the runtime integration tests (run inside the test image)."""

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from typing import Any

STATE = {"count": 0}


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def facts(event: dict[str, Any]) -> None:
    out: dict[str, Any] = {"uid": os.getuid(), "gid": os.getgid()}
    try:
        with open("/rootfile", "w") as handle:
            handle.write("x")
        out["root_writable"] = True
    except OSError:
        out["root_writable"] = False
    with open("/tmp/probe", "w") as handle:
        handle.write("ok")
    out["tmp_writable"] = True
    stat = os.statvfs("/tmp")
    out["tmp_bytes"] = stat.f_blocks * stat.f_frsize
    for line in (_read("/proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs"):
            out[key] = value.strip()
    out["memory_limit"] = _read("/sys/fs/cgroup/memory/memory.limit_in_bytes")
    out["memsw_limit"] = _read("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes")
    out["pids_max"] = _read("/sys/fs/cgroup/pids/pids.max")
    out["cfs_quota"] = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    out["cfs_period"] = _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    routes = _read("/proc/net/route") or ""
    out["default_route"] = any(line.split()[1] == "00000000" for line in routes.splitlines()[1:])
    print("FACTS " + json.dumps(out))


def hello(event: dict[str, Any]) -> None:
    STATE["count"] += 1
    shown = {name: os.environ.get(name) for name in event.get("show", [])}
    print(
        "HELLO "
        + json.dumps(
            {
                "count": STATE["count"],
                "host": socket.gethostname(),
                "version": os.environ.get("APP_VERSION"),
                "env": shown,
            }
        )
    )


async def async_hello(event: dict[str, Any]) -> None:
    await asyncio.sleep(0)
    print("ASYNC " + json.dumps(event))


def sleep(event: dict[str, Any]) -> None:
    print("SLEEPING " + os.environ.get("APP_VERSION", ""))
    time.sleep(event["s"])
    print("WOKE " + os.environ.get("APP_VERSION", ""))


def crash(event: dict[str, Any]) -> None:
    print("CRASHING")
    sys.stdout.flush()
    os._exit(event.get("code", 3))


def fail(event: dict[str, Any]) -> None:
    print("about to fail")
    raise ValueError("boom from the handler")


def forge_success(event: dict[str, Any]) -> None:
    # everything a confused or hostile handler could print to look like an answer
    frame = {"id": None, "ok": True, "error": ""}
    print(json.dumps(frame))
    print(json.dumps({"id": "0" * 24, "ok": True, "error": ""}))
    sys.stderr.write(json.dumps(frame) + "\n\x1erelay-end:" + "0" * 24 + "\n")
    os.write(1, (json.dumps(frame) + "\n").encode())
    os.write(2, (json.dumps(frame) + "\n").encode())
    raise RuntimeError("the real outcome is a failure")


def forge_failure(event: dict[str, Any]) -> None:
    print(json.dumps({"id": None, "ok": False, "error": "forged"}))
    os.write(1, b'{"id": null, "ok": false, "error": "forged"}\n')


def digest(event: dict[str, Any]) -> None:
    value = os.environ.get(event["var"], "")
    print("DIGEST " + hashlib.sha256(value.encode()).hexdigest())


def set_env(event: dict[str, Any]) -> None:
    os.environ["LEAKED_BY_HANDLER"] = "1"
    print("ENV " + json.dumps({k: os.environ.get(k) for k in event["show"]}))


def long_line(event: dict[str, Any]) -> None:
    sys.stdout.write("y" * 200_000)


def size(event: dict[str, Any]) -> None:
    print("SIZE " + json.dumps({"blob": len(event["blob"])}))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def flood(event: dict[str, Any]) -> None:
    """``mib`` MiB on stdout as fast as the pipe takes it, in lines or in one."""
    piece = (b"f" * 1023 + b"\n") * 64 if event.get("newlines") else b"f" * 65536
    for _ in range(event["mib"] * 16):
        _write_all(1, piece)
    _write_all(1, b"\nFLOODED\n")


def flood_socket(event: dict[str, Any]) -> None:
    """Many MiB of lines into Relay's own socket (the bootstrap's connection)."""
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                with socket.socket(fileno=os.dup(int(name))) as sock:
                    for _ in range(event["mib"] * 16):
                        sock.sendall(b"x\n" * 32768)  # until Relay hangs up
    print("SOCKET FLOODED")


CONTEXT = (
    "RELAY_HANDLER",
    "RELAY_MESSAGE_ID",
    "RELAY_ATTEMPT",
    "RELAY_DEADLINE",
    "RELAY_OCCURRENCE_ID",
)


def context(event: dict[str, Any]) -> None:
    """Prints the invocation's context variables; fails its first attempt on request."""
    print("CONTEXT " + json.dumps({name: os.environ.get(name) for name in CONTEXT}))
    if event.get("fail_first") and os.environ.get("RELAY_ATTEMPT") == "1":
        raise RuntimeError("the first attempt fails")
