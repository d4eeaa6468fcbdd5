"""Hourly cleanup, keyed by the occurrence's instant so a re-run does the same work."""


def handler(event):
    print(f"Cleanup for the hour ending {event['scheduled_at']}")
