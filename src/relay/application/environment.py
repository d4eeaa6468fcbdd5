"""The per-invocation environment: template env plus secrets resolved just in time."""

from __future__ import annotations

from collections.abc import Mapping

from relay.application.ports import SecretStore
from relay.domain.errors import RelayError
from relay.domain.execution import SecretNotFound
from relay.domain.names import RESERVED_ENV_NAMES

RESERVED_NAMES = RESERVED_ENV_NAMES


class MissingSecret(RelayError):
    """A template's secret reference could not be resolved; names the reference only."""


def resolve_environment(
    template_env: Mapping[str, str],
    secret_refs: Mapping[str, str],
    secrets: SecretStore,
) -> dict[str, str]:
    """Literal env values plus each secret reference resolved to its current value.

    Called immediately before each invocation, so a rotated secret is seen by the
    next one. Raises ``MissingSecret`` naming the variable and the reference
    (never a value). ``RELAY_HANDLER`` and the invocation context's variables
    are Relay's and are never taken from here.
    """
    env = {name: value for name, value in template_env.items() if name not in RESERVED_NAMES}
    for variable, reference in secret_refs.items():
        if variable in RESERVED_NAMES:
            continue
        try:
            env[variable] = secrets.get(reference)
        except SecretNotFound:
            raise MissingSecret(
                f'secret "{reference}" (for {variable}) is not set; '
                f"set it with `relay secret set {reference}`"
            ) from None
    return env
