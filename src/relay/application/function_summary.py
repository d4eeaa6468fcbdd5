"""What the state view records of a function's template (``FunctionSummary``).

Used by the reconciler (:mod:`relay.application.reconcile`) for the events it
publishes as a function is discovered, prepared or fails.
"""

from __future__ import annotations

from relay.domain.events import FunctionSummary, HandlerSummary, ScheduleSummary, ServiceSummary
from relay.domain.template import Template


def summarize(template: Template) -> FunctionSummary:
    """The parts of a template the state view records (secret names, not values)."""
    return FunctionSummary(
        runtime=template.runtime,
        concurrency=template.concurrency,
        handlers=tuple(
            HandlerSummary(handler=r.handler, timeout_ns=r.timeout_ns, retries=r.retries)
            for r in template.events
        ),
        schedules=tuple(
            ScheduleSummary(
                handler=s.handler,
                cron=s.cron,
                timezone=s.timezone,
                timeout_ns=s.timeout_ns,
                retries=s.retries,
                catchup_ns=s.catchup_ns,
                overlap=s.overlap,
            )
            for s in template.schedules
        ),
        services=tuple(
            ServiceSummary(
                **{s.kind: s.source},
                host=s.host,
                path=s.path,
                port=s.port,
                replicas=s.replicas,
            )
            for s in template.services
        ),
        env=dict(template.env),
        secrets=dict(template.secrets),
    )
