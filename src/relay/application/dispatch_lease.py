"""A claim's lease as the worker sees it, and the check right before a handler starts.

Split from :mod:`relay.application.dispatch`. The ledger grants each claim a lease
on its own clock; the worker cannot read that clock, so it counts the lease from
*before* it sent the ``begin`` on its local monotonic clock: the estimate is never
longer than the ledger's real deadline. Right before the handler starts (after a
cold start, a wait for a slot), :meth:`Lease.cover` makes sure the lease outlives
the handler's timeout plus the grace, renewing it when it would not, and raises
:class:`~relay.domain.execution.LeaseLost` when it cannot: then nothing runs and
the claim is released uncharged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec

from relay.application.ports import Clock
from relay.domain.errors import DependencyUnavailable
from relay.domain.events import InvocationStarted, LeaseRenewed
from relay.domain.execution import LeaseLost
from relay.domain.message_outcomes import Released
from relay.domain.messages import DomainEvent
from relay.domain.outcome import ClaimStatus, MessageContext, RenewRequest, split_field

Renew = Callable[[RenewRequest], Awaitable[int]]
Notify = Callable[[DomainEvent], None]


class Leases(msgspec.Struct, frozen=True):
    """The leases one ``begin`` asked for, and when (local monotonic) it was sent."""

    since: float
    lease_ms: Mapping[str, int]


class Lease:
    """One claim's lease: ``lease_ms`` from (no later than) ``since``."""

    __slots__ = (
        "_clock",
        "_ctx",
        "_grace_ms",
        "_lease_ms",
        "_notify",
        "_renew",
        "_since",
        "_status",
        "_token",
    )

    def __init__(
        self,
        *,
        renew: Renew,
        clock: Clock,
        notify: Notify,
        grace_ms: int,
        ctx: MessageContext,
        token: str,
        status: ClaimStatus,
        leases: Leases,
    ) -> None:
        self._renew = renew
        self._clock = clock
        self._notify = notify
        self._grace_ms = grace_ms
        self._ctx = ctx
        self._token = token
        self._status = status
        self._since = leases.since
        self._lease_ms = leases.lease_ms.get(status.field, 0)

    def guard(self, timeout_ns: int) -> Callable[[], Any]:
        """What the runtime awaits right before the handler starts."""

        async def cover() -> None:
            await self.cover(timeout_ns)

        return cover

    async def cover(self, timeout_ns: int) -> None:
        """Make sure the claim outlives the handler's timeout plus the grace (renew
        it if needed), then announce the start; or raise LeaseLost."""
        need_ms = timeout_ns // 1_000_000 + self._grace_ms
        elapsed_ms = int((self._clock.monotonic() - self._since) * 1000)
        status, ctx = self._status, self._ctx
        function, handler = split_field(status.field)
        remaining_ms = self._lease_ms - elapsed_ms
        if remaining_ms < need_ms:
            asked = self._clock.monotonic()
            request = RenewRequest(
                context=ctx,
                token=self._token,
                field=status.field,
                attempt=status.attempt,
                lease_ms=need_ms,
            )
            try:
                until = await self._renew(request)
            except DependencyUnavailable as exc:
                raise LeaseLost(Released.LEASE_UNRENEWABLE, str(exc)) from exc
            if until == 0:
                raise LeaseLost(
                    Released.LEASE_LOST, "the claim was taken over before the handler ran"
                )
            self._since, self._lease_ms = asked, need_ms
            self._notify(
                LeaseRenewed(
                    function=function,
                    handler=handler,
                    message_id=ctx.message_id,
                    attempt=status.attempt,
                    remaining_ms=max(0, remaining_ms),
                    lease_ms=need_ms,
                )
            )
        self._notify(
            InvocationStarted(
                function=function,
                handler=handler,
                message_id=ctx.message_id,
                attempt=status.attempt,
            )
        )
