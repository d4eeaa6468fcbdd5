"""The HTTP ingest series, fed by :class:`relay.domain.events.IngestAnswered`.

``ingest_requests_total{status}``: every answer of ``POST /v1/events`` by its
HTTP status (the label set is closed: ``relay.domain.ingest.STATUSES``, each
present from the start at 0 so a rate of 429s or 503s is defined before the
first one); ``ingest_events_total``: the events the 202s appended.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from relay.application.bus import MessageBus
from relay.domain import events as ev
from relay.domain.ingest import STATUSES


def subscribe_ingest(bus: MessageBus, registry: CollectorRegistry) -> None:
    """Register the ingest series on ``registry`` and feed them from ``bus``."""
    requests = Counter(
        "ingest_requests", "HTTP ingest requests answered, by HTTP status.", ["status"],
        registry=registry,
    )
    for status in STATUSES:
        requests.labels(status=str(status))
    appended = Counter(
        "ingest_events", "Events appended through HTTP ingest.", registry=registry
    )

    def answered(e: ev.IngestAnswered) -> None:
        requests.labels(status=str(e.status)).inc()
        if e.events and e.status == 202:
            appended.inc(e.events)

    bus.subscribe(ev.IngestAnswered, answered)
