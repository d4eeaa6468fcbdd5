"""The control socket's wire format: one JSON object per line each way.

A request is versioned and carries one command, decoded straight into the bus
command it names (a msgspec tagged union on the command's ``cmd`` field)::

    {"v": 1, "command": {"cmd": "reset_stats"}}
    {"v": 1, "command": {"cmd": "force_breaker", "function": "pay", "state": "open"}}

A response is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "<one
line>", "kind": "<error class>"}``. An unknown version, an unknown command, a
missing, unknown or mistyped field, or a line that is not JSON is one error reply
of kind ``ProtocolError``: the line says what is wrong and never echoes the
request's values beyond a bounded excerpt.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from relay.domain.commands import (
    ForceBreaker,
    GetBreaker,
    GetHealth,
    GetPoolState,
    InvokeFunction,
    ReplayDeadLetter,
    ResetStats,
    SyncGit,
)
from relay.domain.errors import RelayError
from relay.domain.messages import Command

PROTOCOL_VERSION: Final = 1
MAX_REQUEST_BYTES: Final = 1024 * 1024
MAX_RESPONSE_BYTES: Final = 8 * 1024 * 1024
MAX_ERROR_CHARS: Final = 300  # an error reply quotes at most this much of what it refuses

# The commands the CLI may send to a live worker; the daemon sends the same ones.
ControlCommand = (
    GetPoolState
    | ResetStats
    | InvokeFunction
    | ReplayDeadLetter
    | GetHealth
    | GetBreaker
    | ForceBreaker
    | SyncGit
)
CONTROL_COMMANDS: Final[tuple[type[Command], ...]] = ControlCommand.__args__


class ControlRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One request line: the protocol version and the command."""

    v: int
    command: ControlCommand


class _Version(msgspec.Struct, frozen=True):
    """Only the version, read first: a newer client's command this worker does not
    know is reported as a version mismatch, not as an unknown command."""

    v: Any = None


class ProtocolError(RelayError):
    """A request line is not a valid control request."""


def decode_request(line: bytes) -> Command:
    """Turn one request line into its bus command, or raise :class:`ProtocolError`."""
    try:
        version = msgspec.json.decode(line, type=_Version).v
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ProtocolError(_bounded(f"invalid request: expected a JSON object ({exc})")) from exc
    if version is None:
        raise ProtocolError(
            f'invalid request: no protocol version "v" (this worker speaks {PROTOCOL_VERSION}; '
            "use the relay command of the worker's version)"
        )
    if version != PROTOCOL_VERSION or isinstance(version, bool):
        shown = _bounded(msgspec.json.encode(version).decode())
        raise ProtocolError(
            f"unsupported control protocol version {shown} (this worker speaks "
            f"{PROTOCOL_VERSION}; use the relay command of the worker's version)"
        )
    try:
        return msgspec.json.decode(line, type=ControlRequest).command
    except msgspec.ValidationError as exc:
        raise ProtocolError(_bounded(f"invalid request: {exc}")) from exc


def encode_request(command: Command) -> bytes:
    """One request line for ``command`` (one of :data:`CONTROL_COMMANDS`)."""
    return msgspec.json.encode({"v": PROTOCOL_VERSION, "command": command}) + b"\n"


def ok_response(result: Any) -> bytes:
    return msgspec.json.encode({"ok": True, "result": msgspec.to_builtins(result)}) + b"\n"


def error_response(message: str, kind: str = "RelayError") -> bytes:
    line = " ".join(message.split()) or kind
    return msgspec.json.encode({"ok": False, "error": line, "kind": kind}) + b"\n"


def _bounded(text: str) -> str:
    if len(text) <= MAX_ERROR_CHARS:
        return text
    return text[: MAX_ERROR_CHARS - 3] + "..."
