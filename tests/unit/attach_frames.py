"""What the Docker engine sends on an execution container's attach connection,
for fake transports: multiplexed frames and the bootstrap's answer frame."""

from __future__ import annotations

import json
from typing import NamedTuple

STDOUT, STDERR = 1, 2


class Message(NamedTuple):
    stream: int
    data: bytes


def mux(message: Message) -> bytes:
    """One multiplexed attach frame, as the engine sends it."""
    header = bytes([message.stream, 0, 0, 0]) + len(message.data).to_bytes(4, "big")
    return header + message.data


def frame(nonce: str, ok: bool = True, error: str = "") -> bytes:
    """The one answer frame: marker, nonce, JSON answer, newline (on stderr)."""
    body = json.dumps({"ok": ok, "error": error}).encode()
    return b"\x1erelay-end:" + nonce.encode() + body + b"\n"


def answer(nonce: str, ok: bool = True, error: str = "") -> Message:
    return Message(STDERR, frame(nonce, ok, error))
