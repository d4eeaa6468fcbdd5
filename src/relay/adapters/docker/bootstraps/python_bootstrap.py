"""Relay's Python bootstrap: one long-lived process serving one request at a time.

Runs as ``python -u /relay/bootstrap.py`` inside a warm execution container.
Requests arrive one per line on a private copy of stdin (the handler's fd 0 is
/dev/null; its fds 1 and 2 both point at stderr). The answer is one frame on
stderr, written after the handler's output is flushed, so it arrives after all
of it; it carries the request's nonce, which the handler never sees, so nothing
the handler prints can forge a result. Standard library only: it runs on
whatever Python the function image has.

When Relay mounts a socket of its own into the container (``RELAY_CHANNEL``
names it), the bootstrap connects to it before serving, and requests may also
arrive there. Every answer then goes on the socket and says how many bytes of
output were written to stderr before it, so Relay forwards that output first;
to count it, the process forks and the parent copies the serving child's fds 1
and 2 (a pipe) to stderr (see ``_serve_with_socket``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib
import inspect
import json
import mmap
import os
import select
import signal
import socket
import sys
import termios
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

GRACE_S = float(os.environ.get("RELAY_GRACE_S") or "2")
IDLE_DEADLINE_S = float(os.environ.get("RELAY_IDLE_DEADLINE_S") or "330")
APP_DIR = os.environ.get("RELAY_APP_DIR") or os.getcwd()
try:
    import ctypes
except ImportError:  # a Python built without it: answers always go through the relay
    ctypes = None  # type: ignore[assignment]

CHANNEL = os.environ.get("RELAY_CHANNEL") or ""
END_MARKER = "\x1erelay-end:"
_MISSING = object()
_OK = '{"ok": true, "error": ""}'  # json.dumps of the usual answer, made once
# The most of a return value's JSON text an answer carries (relay.domain.execution
# RESULT_MAX_BYTES; a test checks both agree): ASCII, so characters are bytes.
RESULT_MAX_BYTES = 16 * 1024


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - not contextlib.suppress: a context manager per stream per request
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - a handler may have replaced or closed them
            pass


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


def _run(handler: str, event_text: str) -> Any:
    fn = _resolve(handler)
    event = json.loads(event_text)
    result = fn(event)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


def _result_fields(value: Any) -> dict[str, object]:
    """The return value for the answer: its JSON text (its repr as a JSON string
    when it is not JSON), cut at RESULT_MAX_BYTES with the full size beside it."""
    try:
        text = json.dumps(value)
    except Exception:  # noqa: BLE001 - not JSON (a set, an object, a cycle): say what it was
        try:
            text = json.dumps(repr(value))
        except Exception:  # noqa: BLE001 - a repr that raises
            text = json.dumps(f"<{type(value).__name__} that cannot be shown>")
    if len(text) <= RESULT_MAX_BYTES:
        return {"result": text}
    return {"result": text[:RESULT_MAX_BYTES], "result_size": len(text)}


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return detail[:500]


# What each variable a request set was before Relay first set it (_MISSING:
# unset). The next request's environment is applied as a difference: a variable
# it does not set goes back to that value, one it sets to the value already in
# place is not written again (the same function's requests mostly repeat theirs).
_ORIGINAL: dict[str, object] = {}
# What this process last wrote to each of them: a value that differs from it
# (the message id, the deadline) is written without reading the old one first.
_WRITTEN: dict[str, str] = {}


def _apply_env(env: dict[str, str]) -> None:
    for key in [key for key in _ORIGINAL if key not in env]:
        old = _ORIGINAL.pop(key)
        _WRITTEN.pop(key, None)
        with contextlib.suppress(ValueError):
            if old is _MISSING:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(old)
    environ = os.environ
    written = _WRITTEN
    for key, value in env.items():
        if key not in _ORIGINAL:
            _ORIGINAL[key] = environ.get(key, _MISSING)
        elif written.get(key) == value and environ.get(key) == value:
            continue  # as the last request left it (a handler may have changed it)
        environ[key] = value
        written[key] = value


def _serve_one(line: bytes, answer: Callable[[str, str], None]) -> None:
    try:
        request = json.loads(line)
        nonce = str(request["id"])
        handler = str(request["handler"])
        env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
        timeout_s = float(request.get("timeout_s") or 6)
        event_text = request["event"]
        # only a run someone watches asks: delivery never pays to encode the value
        want_result = request.get("want_result") is True
    except Exception as exc:  # noqa: BLE001 - any malformed request is a protocol error
        # no usable nonce: this can only be output (Relay's own deadline ends it)
        _write_all(2, f"\nrelay bootstrap: bad request: {_describe(exc)}\n".encode())
        return
    env["RELAY_HANDLER"] = handler
    # Backstop deadline inside the container: if Relay is gone (killed) and the
    # handler hangs, the kernel ends the process at timeout + grace (SIGALRM's
    # default action; no Python code, so it works even inside blocking C code).
    signal.setitimer(signal.ITIMER_REAL, timeout_s + GRACE_S)
    ok, error, value = True, "", None
    try:
        _apply_env(env)  # ValueError for a name the OS refuses: a failure
        value = _run(handler, event_text)
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
    if not ok:
        answer(nonce, json.dumps({"ok": False, "error": error}))
    elif value is None or not want_result:
        answer(nonce, _OK)
    else:
        answer(nonce, _adding(_OK, **_result_fields(value)))


def _serve(sources: list[int], answer: Callable[[str, str], None]) -> None:
    """Serve request lines from ``sources`` one at a time until one of them ends."""
    # the default action of SIGALRM terminates the process: the request deadline
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    if APP_DIR not in sys.path:
        sys.path.insert(0, APP_DIR)
    buffers = dict.fromkeys(sources, b"")
    while True:
        ready, _, _ = select.select(sources, [], [], IDLE_DEADLINE_S)
        if not ready:
            os._exit(0)  # idle past Relay's own eviction: nobody will come back
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                os._exit(0)  # Relay detached or died
            buffer = buffers[fd] + chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    _serve_one(line, answer)
            buffers[fd] = buffer


def _quiet_stdio() -> int:
    """A private, close-on-exec copy of stdin (the requests); fd 0 becomes /dev/null."""
    requests_fd = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return requests_fd


def _adding(answer: str, **fields: object) -> str:
    """The answer's JSON object text with ``fields`` added."""
    return answer[:-1] + ", " + json.dumps(fields)[1:]


def _serve_on_stdio(problem: str) -> None:
    """Requests on stdin; output then each answer on stderr (fd 1 joins fd 2)."""
    requests_fd = _quiet_stdio()
    os.dup2(2, 1)
    said = [problem]

    def answer(nonce: str, text: str) -> None:
        if said[0]:  # why the offered socket is not used, with the first answer
            text = _adding(text, channel=said[0])
            said[0] = ""
        _write_all(2, (END_MARKER + nonce + text + "\n").encode())

    _serve([requests_fd], answer)


def _serve_with_socket(channel: socket.socket) -> None:
    """Requests on the socket (and stdin); answers on the socket, each saying how
    many bytes of output came before it.

    The process forks. The child serves, with its fds 1 and 2 on a pipe that
    this process, the relay, copies to stderr, counting. The relay outlives the
    child: output written just before the child dies (a crash, ``os._exit``,
    the deadline's SIGALRM) is still copied, and the relay then ends the same
    way the child did.

    The count is a word both processes share: twice the bytes copied, plus one
    while the relay is between taking bytes from the pipe and counting them.
    The child answers on the socket itself when the pipe is empty and the word
    is even and did not change around that look (nothing it wrote can be in
    flight); otherwise it hands the answer to the relay through a second pipe,
    and the relay sends it after copying what came before it."""
    output_r, output_w = os.pipe()
    answers_r, answers_w = os.pipe()
    word = _shared_word()
    child = os.fork()
    if child == 0:
        try:
            os.close(answers_r)
            requests_fd = _quiet_stdio()
            os.dup2(output_w, 1)  # inherited by the handler's own subprocesses
            os.dup2(output_w, 2)
            os.close(output_w)
            unread = bytearray(4)

            def answer(nonce: str, text: str) -> None:
                before = word.value
                fcntl.ioctl(output_r, termios.FIONREAD, unread)
                if not before & 1 and unread == b"\0\0\0\0" and word.value == before:
                    frame = END_MARKER + nonce + _adding(text, out=before >> 1) + "\n"
                    channel.sendall(frame.encode())
                else:
                    _write_all(answers_w, (nonce + " " + text + "\n").encode())

            _serve([requests_fd, channel.fileno()], answer)
        except BaseException:  # noqa: BLE001 - a bug of the bootstrap's own: say it, then leave
            traceback.print_exc()
        finally:
            os._exit(1)
    os.close(output_w)
    os.close(answers_w)
    os.close(_quiet_stdio())  # the relay reads no requests: fd 0 becomes /dev/null
    _relay(child, output_r, answers_r, channel, word)


class _NotShared:
    """Stands in for the shared word without ctypes: odd for ever in the child."""

    value = 1


def _shared_word() -> Any:
    if ctypes is None:
        return _NotShared()
    shared = mmap.mmap(-1, 8)  # anonymous and shared: the child sees the relay's writes
    return ctypes.c_uint64.from_buffer(shared)


def _relay(child: int, output_r: int, answers_r: int, channel: socket.socket, word: Any) -> None:
    os.set_blocking(output_r, False)
    copied = 0
    pending = b""

    def copy() -> bool:
        """Copy what the pipe holds now; False once every writer is gone."""
        nonlocal copied
        while True:
            word.value = copied << 1 | 1
            try:
                chunk = os.read(output_r, 1 << 16)
            except BlockingIOError:
                word.value = copied << 1
                return True
            if chunk:
                _write_all(2, chunk)
                copied += len(chunk)
            word.value = copied << 1
            if not chunk:
                return False

    sources = [output_r, answers_r]
    while True:
        ready, _, _ = select.select(sources, [], [])
        if output_r in ready and not copy():
            sources.remove(output_r)  # fds 1 and 2 closed by the handler: answers only
        if answers_r not in ready:
            continue
        chunk = os.read(answers_r, 1 << 16)
        if not chunk:
            break  # the child is gone
        pending += chunk
        copy()  # whatever was written before these answers
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            nonce, _, text = line.decode().partition(" ")
            frame = END_MARKER + nonce + _adding(text, out=copied) + "\n"
            with contextlib.suppress(OSError):  # Relay went away: the child sees it too
                channel.sendall(frame.encode())
    copy()
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _connect(path: str) -> tuple[socket.socket | None, str]:
    """Relay's socket, or why it cannot be used."""
    if not path:
        return None, ""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        return None, f"cannot connect to {path}: {exc.strerror or exc}"
    return sock, ""


def main() -> None:
    channel, problem = _connect(CHANNEL)
    if channel is None:
        _serve_on_stdio(problem)
    else:
        _serve_with_socket(channel)


if __name__ == "__main__":
    main()
