"""What ``POST /v1/events`` accepts (relay.domain.ingest): items into Publications."""

from __future__ import annotations

from typing import Any

import pytest

from relay.domain.handler_context import CONTEXT_ENV_NAMES, ingest_env
from relay.domain.ingest import (
    MAX_IDEMPOTENCY_KEY,
    MAX_ITEMS,
    EventTooLarge,
    IngestRefused,
    publications,
)
from relay.domain.publication import Publication

LIMIT = 64


def test_one_item_and_an_array_become_publications_carrying_every_option() -> None:
    """The options are parsed and carried to the broker's port (its adapters honour them)."""
    item = {"event": {"a": 1, "é": "ü"}, "priority": "high",
            "deliver_at": "2026-12-24T18:00:00Z", "idempotency_key": "order-1"}
    [one] = publications(item, LIMIT)
    assert one == Publication(
        payload='{"a":1,"é":"ü"}'.encode(), priority="high",
        deliver_at_ms=1_798_135_200_000, idempotency_key="order-1",
    )
    many = publications([{"event": {}}, {"event": {"b": 2}, "deliver_at": 5}], LIMIT)
    assert many == [Publication(b"{}"), Publication(b'{"b":2}', deliver_at_ms=5)]


def test_deliver_at_takes_an_offset_and_refuses_a_time_without_a_zone() -> None:
    [p] = publications({"event": {}, "deliver_at": "2026-12-24T19:00:00+01:00"}, LIMIT)
    assert p.deliver_at_ms == 1_798_135_200_000
    with pytest.raises(IngestRefused, match="has no zone; add Z or an offset"):
        publications({"event": {}, "deliver_at": "2026-12-24T18:00:00"}, LIMIT)


@pytest.mark.parametrize(("body", "line"), [
    ([], "the array is empty; send at least one item"),
    ("x", 'expected an object with an "event" field, not a string'),
    ({"priority": "high"}, 'the "event" field is missing'),
    ({"event": [1]}, "event must be a JSON object, not an array"),
    ({"event": {}, "priorty": "high"},
     "unknown field 'priorty'; accepted: deliver_at, event, idempotency_key, priority"),
    ({"event": {}, "priority": "urgent"},
     "priority 'urgent' is not one of critical, high, normal, low"),
    ({"event": {}, "priority": 1}, "priority must be a string, not a number"),
    ({"event": {}, "deliver_at": "soon"},
     "deliver_at 'soon' is not an RFC 3339 time such as 2026-12-24T18:00:00Z"),
    ({"event": {}, "deliver_at": True},
     "deliver_at must be an RFC 3339 time or epoch milliseconds, not a boolean"),
    ({"event": {}, "deliver_at": -1}, "deliver_at must not be negative"),
    ({"event": {}, "idempotency_key": ""},
     "idempotency_key must be a non-empty string, not an empty string"),
    ({"event": {}, "idempotency_key": "k" * (MAX_IDEMPOTENCY_KEY + 1)},
     f"idempotency_key is {MAX_IDEMPOTENCY_KEY + 1} characters; at most {MAX_IDEMPOTENCY_KEY}"),
    ({"event": {}, "idempotency_key": "a\nb"}, "idempotency_key holds a control character"),
    ({"event": {"big": float("inf")}}, "event holds a number out of range (no JSON for it)"),
    ([{"event": {}}] * (MAX_ITEMS + 1), f"{MAX_ITEMS + 1} items in one request; at most"),
])
def test_bad_items_are_one_line_each(body: Any, line: str) -> None:
    with pytest.raises(IngestRefused) as refused:
        publications(body, LIMIT)
    assert str(refused.value).startswith(line)
    assert refused.value.status == 400


def test_an_array_names_the_bad_item_and_refuses_the_whole_request() -> None:
    with pytest.raises(IngestRefused, match=r"^item 1: event must be a JSON object, not null$"):
        publications([{"event": {}}, {"event": None}, {"event": {}}], LIMIT)


def test_an_event_over_max_event_bytes_is_413_measured_as_appended() -> None:
    """The compact encoding is what the broker stores, so it is what is measured."""
    fits = {"k": "x" * (LIMIT - 8)}  # {"k":"..."} is exactly LIMIT bytes
    assert len(publications({"event": fits}, LIMIT)[0].payload) == LIMIT
    with pytest.raises(EventTooLarge) as refused:
        publications([{"event": {}}, {"event": {"k": "x" * (LIMIT - 7)}}], LIMIT)
    assert refused.value.status == 413
    assert str(refused.value) == (
        f"item 1: event is {LIMIT + 1} bytes, over MAX_EVENT_BYTES ({LIMIT})"
    )


def test_handlers_get_the_ingest_variables_only_with_a_url_and_the_token_only_with_one() -> None:
    url = "http://relay:8088/v1/events"
    assert ingest_env(None, "t") == {}
    assert ingest_env(url, None) == {"RELAY_INGEST_URL": url}
    assert ingest_env(url, "t") == {"RELAY_INGEST_URL": url, "RELAY_INGEST_TOKEN": "t"}
    # a template may not set them (they are Relay's)
    assert {"RELAY_INGEST_URL", "RELAY_INGEST_TOKEN"} <= CONTEXT_ENV_NAMES
