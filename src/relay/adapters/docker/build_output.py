"""One classic-builder build through the Engine API, and its output kept for
diagnostics: the tail of the engine's build stream, capped, with a marker saying
how much of its beginning was dropped. Function, dependency and service images
are all built by :func:`stream_build`."""

from __future__ import annotations

import io
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerStreamError

OUTPUT_CAP_BYTES = 1024 * 1024
SUMMARY_MAX_CHARS = 300
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_EXIT = re.compile(r"returned a non-zero code: (\d+)")
# Lines the classic builder writes around every step; never the reason a build failed.
_BOILERPLATE = (" --->", "Step ", "Removing intermediate container", "The command '")


class CappedOutput:
    """The tail of a build log, at most ``cap`` bytes, with a marker saying how
    much was dropped from the front (the end of a log holds the error)."""

    def __init__(self, cap: int = OUTPUT_CAP_BYTES) -> None:
        self._cap = cap
        self._parts: deque[str] = deque()
        self._size = 0
        self._dropped = 0

    def add(self, text: str) -> None:
        if not text:
            return
        self._parts.append(text)
        self._size += len(text.encode())
        while self._size > self._cap and self._parts:
            head = self._parts.popleft()
            size = len(head.encode())
            excess = self._size - self._cap
            if size > excess:  # keep the end of a part that straddles the cap
                kept = head.encode()[excess:].decode(errors="ignore")
                self._parts.appendleft(kept)
                self._size = self._size - size + len(kept.encode())
                self._dropped += size - len(kept.encode())
                break
            self._size -= size
            self._dropped += size

    def text(self) -> str:
        body = "".join(self._parts)
        if self._dropped:
            return f"[... {self._dropped} bytes of earlier build output truncated ...]\n{body}"
        return body


def record_chunk(chunk: Mapping[str, Any], output: CappedOutput) -> str | None:
    """Add one build-stream chunk to ``output``; return its error message, if any."""
    if "stream" in chunk:
        output.add(_ANSI.sub("", str(chunk["stream"])))
    if "error" in chunk or "errorDetail" in chunk:
        detail = chunk.get("errorDetail") or {}
        message = _ANSI.sub("", str(detail.get("message") or chunk.get("error") or "unknown error"))
        output.add(f"{message}\n")
        return message
    return None


async def stream_build(
    docker: aiodocker.Docker,
    *,
    tag: str,
    context: bytes,
    labels: Mapping[str, str],
    output: CappedOutput,
    dockerfile: str | None = None,
) -> str | None:
    """Build the tar ``context`` as ``tag``, recording the stream in ``output``;
    the build's error message if it failed, else ``None``. The engine refusing
    the request outright raises ``DockerError``, for the caller to translate."""
    error: str | None = None
    try:
        stream = docker.images.build(
            fileobj=io.BytesIO(context),
            encoding="application/x-tar",
            path_dockerfile=dockerfile,
            tag=tag,
            labels=dict(labels),
            rm=True,
            forcerm=True,
            stream=True,
        )
        async for chunk in stream:
            error = record_chunk(chunk, output) or error
    except DockerStreamError as exc:
        output.add(f"{exc.message}\n")
        return exc.message
    return error


def last_line(text: str) -> str:
    """The last non-blank line of ``text`` (an error's one-line summary)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "unknown error"


def summarize_failure(error: str, output: str) -> str:
    """One line for a failed build: the step's exit code and the last line the
    failing tool wrote that mentions an error (else its last line), rather than
    the engine's echo of the whole command."""
    exit_code = _EXIT.search(error)
    lines = [
        line.strip()
        for line in _ANSI.sub("", output).splitlines()
        if line.strip() and not line.startswith(_BOILERPLATE) and line.strip() != error.strip()
    ]
    errors = [line for line in lines if "error" in line.lower()]
    reason = (errors or lines or [last_line(error)])[-1]
    if exit_code is None:
        reason = last_line(error)
    elif not lines:
        reason = f"exit code {exit_code.group(1)}"
    else:
        reason = f"exit code {exit_code.group(1)}: {reason}"
    if len(reason) > SUMMARY_MAX_CHARS:
        reason = reason[: SUMMARY_MAX_CHARS - 3] + "..."
    return reason
