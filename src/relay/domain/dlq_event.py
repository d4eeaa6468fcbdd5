"""The ``event`` field of a malformed message's DLQ entry: the whole payload, byte
for byte, for every payload within ``MAX_EVENT_BYTES`` (one rule for both brokers;
:mod:`relay.domain.outcome` makes the entries, ``relay dlq replay`` reads them back).
"""

from __future__ import annotations

import base64
import binascii
from typing import Final

# A payload that is not UTF-8 cannot be a stream field's text as it is: the DLQ entry
# keeps it as this mark and its base64. A UTF-8 payload that happens to start with the
# mark is encoded the same way, so the text always decodes back to exactly one payload.
EVENT_BASE64_MARK: Final = "relay-base64:"
SUMMARY_BYTES: Final = 256  # what an oversized payload's entry keeps of it
OVERSIZED: Final = "larger than MAX_EVENT_BYTES"
MISSING_EVENT: Final = "missing event field"


def dlq_event_text(raw: bytes) -> str:
    """The DLQ entry's ``event`` for a payload kept whole: its text when it is UTF-8,
    else :data:`EVENT_BASE64_MARK` and the base64 of its bytes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not text.startswith(EVENT_BASE64_MARK):
        return text
    return EVENT_BASE64_MARK + base64.b64encode(raw).decode("ascii")


def dlq_event_bytes(text: str) -> bytes:
    """The payload :func:`dlq_event_text` kept (its exact inverse)."""
    if text.startswith(EVENT_BASE64_MARK):
        try:
            return base64.b64decode(text[len(EVENT_BASE64_MARK) :], validate=True)
        except binascii.Error:
            pass  # not one this rule wrote: the text is all there is
    return text.encode()


def republishable(reason: str) -> bool:
    """Whether a malformed message's entry holds its whole payload (so ``relay dlq
    replay`` can publish exactly those bytes again): all but a missing ``event``
    field and an oversized payload, whose entry keeps a summary only."""
    return reason != MISSING_EVENT and OVERSIZED not in reason
