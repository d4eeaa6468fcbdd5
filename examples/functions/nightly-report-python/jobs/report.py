"""The weekday morning report: one run per occurrence (handlers must stay idempotent:
execution is at least once)."""


def handler(event):
    print(f"Report for the morning of {event['scheduled_at']}")
