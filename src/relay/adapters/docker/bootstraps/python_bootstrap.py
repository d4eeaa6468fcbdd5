"""Relay's Python bootstrap: one long-lived process serving one request at a time.

Runs as ``python -u /relay/bootstrap.py`` inside a warm execution container.
Requests arrive one per line on a private copy of stdin (the handler's fd 0 is
/dev/null; its fds 1 and 2 both point at stderr). The answer is one frame on
stderr, written after the handler's output is flushed, so it arrives after all
of it; it carries the request's nonce, which the handler never sees, so nothing
the handler prints can forge a result. Standard library only: it runs on
whatever Python the function image has.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import select
import signal
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

GRACE_S = float(os.environ.get("RELAY_GRACE_S") or "2")
IDLE_DEADLINE_S = float(os.environ.get("RELAY_IDLE_DEADLINE_S") or "330")
APP_DIR = os.environ.get("RELAY_APP_DIR") or os.getcwd()
END_MARKER = "\x1erelay-end:"
_MISSING = object()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        # a handler may have replaced or closed them
        with contextlib.suppress(Exception):
            stream.flush()


_RESOLVED: dict[str, Callable[[Any], Any]] = {}


def _resolve(handler: str) -> Callable[[Any], Any]:
    fn = _RESOLVED.get(handler)
    if fn is None:
        fn = _RESOLVED[handler] = _import(handler)
    return fn


def _import(handler: str) -> Callable[[Any], Any]:
    module_name, _, attr = handler.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"handler {handler!r} must be module.function")
    module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise TypeError(f"module {module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _run(handler: str, event_text: str) -> None:
    fn = _resolve(handler)
    event = json.loads(event_text)
    result = fn(event)
    if inspect.isawaitable(result):
        asyncio.run(_await(result))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return detail[:500]


# What each variable a request set was before Relay first set it (_MISSING:
# unset). The next request's environment is applied as a difference: a variable
# it does not set goes back to that value, one it sets to the value already in
# place is not written again (the same function's requests mostly repeat theirs).
_ORIGINAL: dict[str, object] = {}


def _apply_env(env: dict[str, str]) -> None:
    for key in [key for key in _ORIGINAL if key not in env]:
        old = _ORIGINAL.pop(key)
        with contextlib.suppress(ValueError):
            if old is _MISSING:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(old)
    environ = os.environ
    for key, value in env.items():
        if key not in _ORIGINAL:
            _ORIGINAL[key] = environ.get(key, _MISSING)
        if environ.get(key) != value:  # a handler may have changed it meanwhile
            environ[key] = value


def _serve_one(line: bytes) -> None:
    try:
        request = json.loads(line)
        nonce = str(request["id"])
        handler = str(request["handler"])
        env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
        timeout_s = float(request.get("timeout_s") or 6)
        event_text = request["event"]
    except Exception as exc:  # noqa: BLE001 - any malformed request is a protocol error
        # no usable nonce: this can only be output (Relay's own deadline ends it)
        _write_all(2, f"\nrelay bootstrap: bad request: {_describe(exc)}\n".encode())
        return
    env["RELAY_HANDLER"] = handler
    # Backstop deadline inside the container: if Relay is gone (killed) and the
    # handler hangs, the kernel ends the process at timeout + grace (SIGALRM's
    # default action; no Python code, so it works even inside blocking C code).
    signal.setitimer(signal.ITIMER_REAL, timeout_s + GRACE_S)
    ok, error = True, ""
    try:
        _apply_env(env)  # ValueError for a name the OS refuses: a failure
        _run(handler, event_text)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            ok, error = False, f"handler exited with status {exc.code}"
    except Exception as exc:  # noqa: BLE001 - a handler failure is a result, not a crash
        traceback.print_exc()
        ok, error = False, _describe(exc)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    # after the handler's buffered output, on the same fd: stream order
    _flush_std()
    answer = json.dumps({"ok": ok, "error": error})
    _write_all(2, (END_MARKER + nonce + answer + "\n").encode())


def main() -> None:
    # A private, close-on-exec copy of the request fd; the handler's fds 0/1/2
    # become /dev/null, stderr, stderr.
    requests_fd = os.dup(0)
    os.dup2(2, 1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    # the default action of SIGALRM terminates the process: the request deadline
    # (the bootstrap is not PID 1: the container runs a tiny init)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    if APP_DIR not in sys.path:
        sys.path.insert(0, APP_DIR)
    buffer = b""
    while True:
        while b"\n" not in buffer:
            ready, _, _ = select.select([requests_fd], [], [], IDLE_DEADLINE_S)
            if not ready:
                os._exit(0)  # idle past Relay's own eviction: nobody will come back
            chunk = os.read(requests_fd, 1 << 16)
            if not chunk:
                os._exit(0)  # stdin closed: Relay detached or died
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        if line.strip():
            _serve_one(line)


if __name__ == "__main__":
    main()
