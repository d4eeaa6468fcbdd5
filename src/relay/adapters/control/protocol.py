"""The control socket's wire format: one JSON object per line each way.

A request is ``{"op": "<name>", ...fields}``; each op is one bus command and its
fields are that command's fields. A response is ``{"ok": true, "result": ...}``
or ``{"ok": false, "error": "<one line>", "kind": "<error class>"}``.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from relay.domain import commands
from relay.domain.errors import RelayError

MAX_REQUEST_BYTES: Final = 1024 * 1024
MAX_RESPONSE_BYTES: Final = 8 * 1024 * 1024

# op name -> the bus command it becomes. The CLI and the daemon send the same commands.
OPS: Final[dict[str, type[commands.Command]]] = {
    "pool_state": commands.GetPoolState,
    "reset_stats": commands.ResetStats,
    "invoke": commands.InvokeFunction,
    "dlq_replay": commands.ReplayDeadLetter,
    "health": commands.GetHealth,
    "breaker_state": commands.GetBreaker,
    "breaker_force": commands.ForceBreaker,
}


class ProtocolError(RelayError):
    """A request line is not a valid control request."""


def decode_request(line: bytes) -> commands.Command:
    """Turn one request line into its bus command, or raise :class:`ProtocolError`."""
    try:
        raw = msgspec.json.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"invalid request: not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise ProtocolError("invalid request: expected a JSON object")
    op = raw.pop("op", None)
    if not isinstance(op, str) or op not in OPS:
        known = ", ".join(sorted(OPS))
        raise ProtocolError(f"invalid request: unknown op {op!r} (known: {known})")
    try:
        return msgspec.convert(raw, OPS[op])
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid {op} request: {exc}") from exc


def encode_request(op: str, fields: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"op": op, **fields}) + b"\n"


def ok_response(result: Any) -> bytes:
    return msgspec.json.encode({"ok": True, "result": msgspec.to_builtins(result)}) + b"\n"


def error_response(message: str, kind: str = "RelayError") -> bytes:
    line = " ".join(message.split()) or kind
    return msgspec.json.encode({"ok": False, "error": line, "kind": kind}) + b"\n"
