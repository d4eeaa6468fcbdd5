"""Persistent services: desired state, labels, routing and the convergence plan.

Pure rules, table-tested byte for byte (``tests/unit/test_service_rules.py``):

- :func:`traefik_id` / :func:`middleware_name`: the deterministic Traefik-safe
  router/service id ``relay-<function>-<identity>-<16 hex>`` and the StripPrefix
  middleware ``<id base>-path-<16 hex>``, both capped at 100 characters with the
  hash kept (distinct identities that sanitize alike still differ);
- :func:`traefik_labels`: the 4 labels of a routed service, the optional
  entrypoints/tls/certresolver/priority ones only when set, and the path ones;
- :func:`service_environment` and :func:`env_hash`: the replica's environment
  (plan env, template env, secrets, then ``PORT``) and a keyed one-way digest of
  it for the ``relay.env_hash`` label (no value is recoverable from it);
- :func:`replica_labels` and :func:`container_name`;
- :func:`plan_convergence`: what one pass does to the observed containers.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence

import msgspec

from relay.domain.template import ServiceSpec

SERVICE_TYPE = "service"
ID_CAP = 100
HASH_HEX = 16
_UNSAFE = re.compile(r"[^a-z0-9-]+")
_DASHES = re.compile(r"-{2,}")

# The labels that decide whether a running replica still matches (besides routing).
MATCH_LABELS = (
    "relay.image",
    "relay.image_id",
    "relay.port",
    "relay.env_hash",
    "relay.networks",
)


class RoutingSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The worker-wide ``TRAEFIK_*`` values (``None``/empty: unset)."""

    network: str | None = None
    entrypoints: tuple[str, ...] = ()
    certresolver: str | None = None
    priority: int | None = None
    host_override: str | None = None


# --- names -----------------------------------------------------------------------
def identity_hash(function: str, identity: str) -> str:
    """16 hex of SHA-256 over the full, untruncated function name and identity."""
    digest = hashlib.sha256(f"{function}\x00{identity}".encode()).hexdigest()
    return digest[:HASH_HEX]


def _sanitize(text: str) -> str:
    return _DASHES.sub("-", _UNSAFE.sub("-", text.lower())).strip("-")


def _capped(base: str, suffix: str) -> str:
    room = ID_CAP - len(suffix)
    return base[:room].rstrip("-") + suffix


def traefik_id(function: str, identity: str) -> str:
    """``relay-<function>-<identity>-<hash>``, sanitized to ``[a-z0-9-]``, at most
    100 characters; the readable part is trimmed to keep the hash."""
    base = _sanitize(f"relay-{function}-{identity}")
    return _capped(base, f"-{identity_hash(function, identity)}")


def middleware_name(function: str, identity: str) -> str:
    """The StripPrefix middleware of a service: ``<id base>-path-<hash>``."""
    base = _sanitize(f"relay-{function}-{identity}")
    return _capped(base, f"-path-{identity_hash(function, identity)}")


def container_name(function: str, identity: str, slot: int, generation: str) -> str:
    """``relay-svc-<function>-<identity>-<slot>-<generation>-<hash>``: readable for
    grep, unique per replica and generation (a replacement starts beside the old
    container), ending in the identity's 64-bit hash. Docker allows
    ``[a-zA-Z0-9][a-zA-Z0-9_.-]``; the readable part is capped like the ids."""
    base = _sanitize(f"relay-svc-{function}-{identity}")
    return _capped(base, f"-{slot}-{generation[:8]}-{identity_hash(function, identity)}")


# --- routing ---------------------------------------------------------------------
def effective_host(host: str, override: str | None) -> str:
    """``TRAEFIK_HOST_OVERRIDE`` replaces the domain and keeps the left-most label:
    ``issuer.example.com`` with ``localhost`` routes as ``issuer.localhost``."""
    if not override:
        return host
    return f"{host.split('.', 1)[0]}.{override}"


def router_rule(host: str, path: str | None, override: str | None) -> str:
    rule = f"Host(`{effective_host(host, override)}`)"
    if path:
        rule += f" && PathPrefix(`{path}`)"
    return rule


def traefik_labels(function: str, service: ServiceSpec, routing: RoutingSettings) -> dict[str, str]:
    """The Traefik labels of one replica; empty for a service without ``host``.
    ``routing.network`` must be set (checked before, see ``routing_problem``)."""
    if service.host is None:
        return {}
    rid = traefik_id(function, service.identity)
    router = f"traefik.http.routers.{rid}"
    labels = {
        "traefik.enable": "true",
        "traefik.docker.network": routing.network or "",
        f"{router}.rule": router_rule(service.host, service.path, routing.host_override),
        f"traefik.http.services.{rid}.loadbalancer.server.port": str(service.port),
    }
    if routing.entrypoints:
        labels[f"{router}.entrypoints"] = ",".join(routing.entrypoints)
    if routing.certresolver:
        labels[f"{router}.tls"] = "true"
        labels[f"{router}.tls.certresolver"] = routing.certresolver
    if routing.priority is not None:
        labels[f"{router}.priority"] = str(routing.priority)
    if service.path:
        middleware = middleware_name(function, service.identity)
        labels[f"{router}.middlewares"] = middleware
        labels[f"traefik.http.middlewares.{middleware}.stripprefix.prefixes"] = service.path
    return labels


def routing_problem(service: ServiceSpec, routing: RoutingSettings) -> str | None:
    """The spec's error text when a routed service has no ``TRAEFIK_NETWORK``."""
    if service.host is not None and not routing.network:
        return (
            f'service "{service.identity}": TRAEFIK_NETWORK is required '
            "when Traefik routing is configured"
        )
    return None


def missing_network(service: ServiceSpec, network: str) -> str:
    return f'service "{service.identity}": Traefik network "{network}" does not exist'


# --- environment -----------------------------------------------------------------
def service_environment(
    plan_env: Mapping[str, str],
    template_env: Mapping[str, str],
    secret_values: Mapping[str, str],
    port: int,
) -> dict[str, str]:
    """Plan env, then template env, then secrets, then ``PORT`` (never overridden)."""
    env = {**plan_env, **template_env, **secret_values}
    env["PORT"] = str(port)
    return env


def env_hash(env: Mapping[str, str], key: bytes) -> str:
    """HMAC-SHA256 over the sorted environment: equal environments give equal
    labels, and without ``key`` (kept by the worker, never in a label) a guess
    of a secret value cannot be checked against the label."""
    body = msgspec.json.encode(sorted(env.items()))
    return hmac.new(key, body, hashlib.sha256).hexdigest()


# --- desired replicas ------------------------------------------------------------
class ResolvedImage(msgspec.Struct, frozen=True, kw_only=True):
    """A service's image, ready to run: the reference, its content id, and the
    command override (``None`` keeps the image's own ENTRYPOINT/CMD)."""

    image: str
    image_id: str
    command: tuple[str, ...] | None = None
    workdir: str | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    """The runtime's plan environment (empty for build/image sources)."""


class DesiredService(msgspec.Struct, frozen=True, kw_only=True):
    """Everything that decides how a service's replicas are created."""

    function: str
    spec: ServiceSpec
    image: ResolvedImage
    env: dict[str, str]
    env_hash: str
    routing: RoutingSettings
    hostname: str

    def labels(self, slot: int) -> dict[str, str]:
        return replica_labels(self, slot)

    @property
    def generation(self) -> str:
        """A digest of what a replica is made of (not the slot): a replacement
        has a different name than the container it replaces."""
        parts = sorted(replica_labels(self, 0).items())
        return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()[:8]


def replica_labels(desired: DesiredService, slot: int) -> dict[str, str]:
    """The spec's ownership labels plus the Traefik ones; no ``relay.handler``."""
    spec = desired.spec
    network = desired.routing.network if spec.host is not None else None
    return {
        "relay.type": SERVICE_TYPE,
        "relay.function": desired.function,
        "relay.identity": spec.identity,
        "relay.image": desired.image.image,
        "relay.image_id": desired.image.image_id,
        "relay.port": str(spec.port),
        "relay.replica": str(slot),
        "relay.env_hash": desired.env_hash,
        "relay.hostname": desired.hostname,
        "relay.networks": network or "",
        **traefik_labels(desired.function, spec, desired.routing),
    }


# --- convergence -----------------------------------------------------------------
class ObservedReplica(msgspec.Struct, frozen=True, kw_only=True):
    """One existing container of a service (any state)."""

    id: str
    labels: dict[str, str]
    running: bool

    @property
    def slot(self) -> int:
        try:
            return int(self.labels.get("relay.replica", ""))
        except ValueError:
            return -1


class ConvergencePlan(msgspec.Struct, frozen=True, kw_only=True):
    """``start``: slots to create with nothing to replace; ``replace``: (slot, old
    container id) pairs, the new one started before the old one is stopped;
    ``remove``: containers to stop and delete (excess, duplicates, crashed);
    ``keep``: containers left untouched."""

    start: tuple[int, ...] = ()
    replace: tuple[tuple[int, str], ...] = ()
    remove: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return bool(self.start or self.replace or self.remove)


def is_stale(observed: ObservedReplica, wanted: Mapping[str, str]) -> bool:
    """Any ownership/match label or any Traefik label differs (added, changed or gone)."""
    have = observed.labels
    if any(have.get(k) != wanted.get(k) for k in MATCH_LABELS):
        return True
    routed_have = {k: v for k, v in have.items() if k.startswith("traefik.")}
    routed_want = {k: v for k, v in wanted.items() if k.startswith("traefik.")}
    return routed_have != routed_want


def plan_convergence(
    desired: DesiredService, observed: Sequence[ObservedReplica]
) -> ConvergencePlan:
    """Converge ``observed`` to ``desired.spec.replicas`` slots ``0..n-1``.

    A crashed (not running) replica is removed and its slot started again; a
    stale one is replaced start-before-stop; slots at or above the count, and
    extra containers of one slot, are removed (lowest slots kept)."""
    count = desired.spec.replicas
    by_slot: dict[int, list[ObservedReplica]] = {}
    remove: list[str] = []
    for replica in sorted(observed, key=lambda r: (r.slot, not r.running, r.id)):
        if 0 <= replica.slot < count:
            by_slot.setdefault(replica.slot, []).append(replica)
        else:
            remove.append(replica.id)
    start: list[int] = []
    replace: list[tuple[int, str]] = []
    keep: list[str] = []
    for slot in range(count):
        replicas = by_slot.get(slot, [])
        wanted = desired.labels(slot)
        fresh = [r for r in replicas if r.running and not is_stale(r, wanted)]
        if fresh:
            keep.append(fresh[0].id)
            remove.extend(r.id for r in replicas if r is not fresh[0])
            continue
        live = [r for r in replicas if r.running]
        remove.extend(r.id for r in replicas if not r.running)
        if live:
            replace.append((slot, live[0].id))
            remove.extend(r.id for r in live[1:])
        else:
            start.append(slot)
    return ConvergencePlan(
        start=tuple(start), replace=tuple(replace), remove=tuple(remove), keep=tuple(keep)
    )
