"""The pure service rules, byte for byte: Traefik labels and ids, names, env hash, plans."""

from __future__ import annotations

import re
import time

import pytest

from relay.domain.services import (
    DesiredService,
    ObservedReplica,
    ResolvedImage,
    RoutingSettings,
    container_name,
    effective_host,
    env_hash,
    identity_hash,
    middleware_name,
    plan_convergence,
    service_environment,
    traefik_id,
    traefik_labels,
)
from relay.domain.template import ServiceSpec
from relay.domain.template_services import MAX_REPLICAS

NETWORK_ONLY = RoutingSettings(network="proxy")
ALL = RoutingSettings(
    network="proxy", entrypoints=("websecure",), certresolver="letsencrypt", priority=100
)


def _spec(**kw: object) -> ServiceSpec:
    base: dict[str, object] = {"kind": "entrypoint", "source": "app/main.py", "port": 8000}
    base.update(kw)
    return ServiceSpec(**base)  # type: ignore[arg-type]


def test_the_four_labels_with_network_only_config() -> None:
    rid = traefik_id("users", "app/main.py")
    labels = traefik_labels("users", _spec(host="api.example.com"), NETWORK_ONLY)
    assert labels == {
        "traefik.enable": "true",
        "traefik.docker.network": "proxy",
        f"traefik.http.routers.{rid}.rule": "Host(`api.example.com`)",
        f"traefik.http.services.{rid}.loadbalancer.server.port": "8000",
    }


def test_all_eight_labels_when_every_variable_is_set() -> None:
    rid = traefik_id("users", "app/main.py")
    labels = traefik_labels("users", _spec(host="api.example.com"), ALL)
    assert labels == {
        "traefik.enable": "true",
        "traefik.docker.network": "proxy",
        f"traefik.http.routers.{rid}.rule": "Host(`api.example.com`)",
        f"traefik.http.services.{rid}.loadbalancer.server.port": "8000",
        f"traefik.http.routers.{rid}.entrypoints": "websecure",
        f"traefik.http.routers.{rid}.tls": "true",
        f"traefik.http.routers.{rid}.tls.certresolver": "letsencrypt",
        f"traefik.http.routers.{rid}.priority": "100",
    }


def test_a_path_adds_path_prefix_and_a_strip_prefix_middleware() -> None:
    rid = traefik_id("users", "app/main.py")
    mw = middleware_name("users", "app/main.py")
    labels = traefik_labels("users", _spec(host="api.example.com", path="/v2"), NETWORK_ONLY)
    assert labels[f"traefik.http.routers.{rid}.rule"] == (
        "Host(`api.example.com`) && PathPrefix(`/v2`)"
    )
    assert labels[f"traefik.http.routers.{rid}.middlewares"] == mw
    assert labels[f"traefik.http.middlewares.{mw}.stripprefix.prefixes"] == "/v2"
    assert len(labels) == 6
    assert mw != rid


def test_no_host_means_no_traefik_label_at_all() -> None:
    assert traefik_labels("users", _spec(), ALL) == {}


@pytest.mark.parametrize(
    ("host", "override", "effective"),
    [
        ("issuer.example.com", "localhost", "issuer.localhost"),
        ("api.example.com", "localhost", "api.localhost"),
        ("api.example.com", None, "api.example.com"),
        ("api.example.com", "dev.test", "api.dev.test"),
    ],
)
def test_host_override_keeps_the_left_most_label(
    host: str, override: str | None, effective: str
) -> None:
    assert effective_host(host, override) == effective


def test_the_id_is_sanitized_and_ends_in_the_identity_hash() -> None:
    rid = traefik_id("users", "ghcr.io/acme/api:1.2")
    assert (
        rid == f"relay-users-ghcr-io-acme-api-1-2-{identity_hash('users', 'ghcr.io/acme/api:1.2')}"
    )
    assert re.fullmatch(r"[a-z0-9-]+-[0-9a-f]{16}", rid)


def test_identities_that_sanitize_alike_get_distinct_ids() -> None:
    a, b = traefik_id("f", "ghcr.io/acme/a/b:1"), traefik_id("f", "ghcr.io/acme/a-b:1")
    assert a != b
    assert a.rsplit("-", 1)[0] == b.rsplit("-", 1)[0]  # same readable base


def test_the_cap_keeps_the_hash() -> None:
    long_a = "a" * 60 + "/x/" + "b" * 80 + ".py"
    long_b = "a" * 60 + "/x/" + "b" * 80 + "c.py"
    for identity in (long_a, long_b):
        rid, mw = traefik_id("fn", identity), middleware_name("fn", identity)
        assert len(rid) <= 100
        assert len(mw) <= 100
        assert rid.endswith("-" + identity_hash("fn", identity))
        assert mw.endswith("-path-" + identity_hash("fn", identity))
        assert "--" not in rid
    assert traefik_id("fn", long_a) != traefik_id("fn", long_b)


def test_container_names_are_readable_and_end_in_the_identity_hash() -> None:
    name = container_name("users", "app/main.py", 1, "0123abcd")
    assert name == f"relay-svc-users-app-main-py-1-0123abcd-{identity_hash('users', 'app/main.py')}"


def test_port_is_set_last_and_never_overridden() -> None:
    env = service_environment({"A": "plan", "B": "plan"}, {"B": "tpl", "PORT": "1"}, {"C": "s"}, 80)
    assert env == {"A": "plan", "B": "tpl", "C": "s", "PORT": "80"}


def test_env_hash_is_keyed_and_carries_no_value() -> None:
    env = {"TOKEN": "hunter2"}
    digest = env_hash(env, b"k" * 32)
    assert "hunter2" not in digest
    assert digest != env_hash(env, b"j" * 32)
    assert digest != env_hash({"TOKEN": "hunter3"}, b"k" * 32)
    assert digest == env_hash(dict(env), b"k" * 32)


def _desired(replicas: int = 2, env_hash_value: str = "e1") -> DesiredService:
    return DesiredService(
        function="fn",
        spec=_spec(replicas=replicas),
        image=ResolvedImage(image="img:1", image_id="sha256:1"),
        env={"PORT": "8000"},
        env_hash=env_hash_value,
        routing=RoutingSettings(),
        hostname="w1",
    )


def _replica(
    cid: str, desired: DesiredService, slot: int, *, running: bool = True
) -> ObservedReplica:
    return ObservedReplica(id=cid, labels=desired.labels(slot), running=running)


def test_plan_scales_down_keeping_the_lowest_slots() -> None:
    three = _desired(3)
    observed = [_replica(f"c{i}", three, i) for i in range(3)]
    plan = plan_convergence(_desired(1), observed)
    assert plan.keep == ("c0",)
    assert set(plan.remove) == {"c1", "c2"}
    assert not plan.start


def test_plan_restarts_a_crashed_slot_and_replaces_a_stale_one() -> None:
    old, new = _desired(2, "old"), _desired(2, "new")
    observed = [_replica("c0", new, 0, running=False), _replica("c1", old, 1)]
    plan = plan_convergence(new, observed)
    assert plan.start == (0,)
    assert plan.remove == ("c0",)
    assert plan.replace == ((1, "c1"),)


def test_a_container_without_env_hash_is_replaced_once() -> None:
    desired = _desired(1)
    labels = desired.labels(0)
    del labels["relay.env_hash"]
    plan = plan_convergence(desired, [ObservedReplica(id="c0", labels=labels, running=True)])
    assert plan.replace == ((0, "c0"),)


def test_planning_the_replica_cap_is_quick_on_the_event_loop() -> None:
    """Convergence plans synchronously on the event loop; at MAX_REPLICAS (routed,
    every slot observed and stale, the costliest case) a plan stays far below the
    100 ms the loop may stall without leases or the control socket noticing."""
    routed = _spec(replicas=MAX_REPLICAS, host="api.example.com", path="/v2")
    old = DesiredService(
        function="fn", spec=routed, image=ResolvedImage(image="img:1", image_id="sha256:1"),
        env={}, env_hash="old", routing=NETWORK_ONLY, hostname="w1",
    )
    new = DesiredService(
        function="fn", spec=routed, image=ResolvedImage(image="img:1", image_id="sha256:1"),
        env={}, env_hash="new", routing=NETWORK_ONLY, hostname="w1",
    )
    observed = [_replica(f"c{i}", old, i) for i in range(MAX_REPLICAS)]
    began = time.perf_counter()
    plan = plan_convergence(new, observed)
    took = time.perf_counter() - began
    assert len(plan.replace) == MAX_REPLICAS
    assert took < 0.1, f"planning {MAX_REPLICAS} replicas took {took * 1000:.1f} ms"
