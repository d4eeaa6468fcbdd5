"""A human-readable description of a cron expression, in 24-hour time.

Display only (``relay function inspect``, ``relay schedule ls``), from the
cron-descriptor library: ``0 3 * * *`` is "At 03:00", ``0 8 * * 1-5`` is "At
08:00, Monday through Friday"; a 6-field expression has its seconds first, as
Relay's. An expression it cannot describe gives ``None`` (the caller prints the
raw expression alone); it never raises.
"""

from __future__ import annotations

from cron_descriptor import DescriptionTypeEnum, ExpressionDescriptor, Options


def describe(cron: str) -> str | None:
    """Describe ``cron`` (5 fields, or 6 with seconds first), or ``None``."""
    if len(cron.split()) not in (5, 6):
        return None  # 7 fields would be read as having a year
    options = Options()
    options.use_24hour_time_format = True
    try:
        text = ExpressionDescriptor(cron, options).get_description(DescriptionTypeEnum.FULL)
    except Exception:  # noqa: BLE001 - display only: whatever the library raises, print the raw cron
        return None
    return text or None
