"""HTTP ingest: ``POST /v1/events`` on ``INGEST_ADDR`` appends events to the broker."""
