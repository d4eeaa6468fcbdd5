"""Service convergence through the real reconciler and bus, with in-memory images,
service containers and secrets, over function directories in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.application.reconcile import FAILED, PREPARED, UNCHANGED
from relay.application.services import ServiceConverger
from relay.domain.commands import ReconcileAll, ReconcileFunction
from relay.domain.events import FunctionPrepared, FunctionReconcileFailed, ServicesConverged
from relay.domain.messages import DomainEvent
from relay.domain.services import RoutingSettings
from tests.fakes import (
    FakeClock,
    InMemorySecretStore,
    InMemoryServiceContainers,
    InMemoryServiceImages,
)
from tests.fakes_compose import FakeWorker

pytestmark = pytest.mark.anyio

TEMPLATE = """\
runtime: node24
env:
  MODE: {mode}
secrets:
  TOKEN: api-token
services:
  - entrypoint: service.js
    port: 3000
    replicas: {replicas}
{extra}"""


class World:
    def __init__(
        self,
        root: Path,
        routing: RoutingSettings | None = None,
        containers: InMemoryServiceContainers | None = None,
    ) -> None:
        self.root = root
        self.images = InMemoryServiceImages()
        self.containers = containers or InMemoryServiceContainers()
        self.secrets = InMemorySecretStore({"api-token": "s3cret-one"})
        self.clock = FakeClock()
        self.events: list[DomainEvent] = []
        self.services = ServiceConverger(
            images=self.images,
            containers=self.containers,
            secrets=self.secrets,
            routing=routing or RoutingSettings(),
            hostname="worker-1",
            env_key=b"k" * 32,
            clock=self.clock,
        )
        # the real composition root: ReconcileFunction sends ConvergeServices
        self.worker = FakeWorker(root, clock=self.clock, secrets=self.secrets,
                                 services=self.services)
        self.registry = self.worker.registry
        self.builder = self.worker.builder
        self.bus = self.worker.bus
        for kind in (FunctionPrepared, FunctionReconcileFailed, ServicesConverged):
            self.bus.subscribe(kind, self.events.append)

    def write(
        self, *, mode: str = "a", replicas: int = 2, extra: str = "", name: str = "api"
    ) -> None:
        d = self.root / name
        d.mkdir(exist_ok=True)
        (d / "service.js").write_text("// server\n")
        (d / "template.yaml").write_text(TEMPLATE.format(mode=mode, replicas=replicas, extra=extra))

    async def reconcile(self, name: str = "api") -> str:
        result: str = await self.bus.send(ReconcileFunction(name=name))
        return result

    def failures(self) -> list[str]:
        return [e.error for e in self.events if isinstance(e, FunctionReconcileFailed)]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


async def test_replicas_start_with_the_environment_in_order_and_no_host_port(world: World) -> None:
    world.write()
    assert await world.reconcile() == PREPARED
    running = world.containers.running("service.js")
    assert sorted(r.slot for r in running) == [0, 1]
    desired = next(iter(world.containers.started.values()))
    assert desired.env == {"PLAN": "1", "MODE": "a", "TOKEN": "s3cret-one", "PORT": "3000"}
    labels = running[0].labels
    assert labels["relay.type"] == "service"
    assert labels["relay.identity"] == "service.js"
    assert "relay.handler" not in labels
    assert "s3cret-one" not in str(labels)
    assert labels["relay.image"] in world.builder.images["api"]


async def test_an_unchanged_pass_touches_nothing(world: World) -> None:
    world.write()
    await world.reconcile()
    before = list(world.containers.log)
    assert await world.reconcile() == UNCHANGED
    assert world.containers.log == before


async def test_a_crashed_replica_is_recreated_on_the_next_pass(world: World) -> None:
    world.write()
    await world.reconcile()
    crashed = world.containers.running()[0]
    world.containers.crash(crashed.id)
    await world.bus.send(ReconcileAll())
    slots = sorted(r.slot for r in world.containers.running())
    assert slots == [0, 1]
    assert crashed.id not in world.containers.containers


@pytest.mark.parametrize("change", ["env", "secret"])
async def test_env_or_secret_change_replaces_start_before_stop(world: World, change: str) -> None:
    world.write()
    await world.reconcile()
    old = {r.id for r in world.containers.running()}
    mark = len(world.containers.log)
    if change == "env":
        world.write(mode="b")
    else:
        world.secrets.set("api-token", "s3cret-two")
    await world.bus.send(ReconcileAll())
    new = {r.id for r in world.containers.running()}
    assert not old & new
    assert len(new) == 2
    # never zero running replicas: each stop comes after a start of its slot
    running = len(old)
    for action, _cid in world.containers.log[mark:]:
        running += 1 if action == "start" else -1
        assert running >= 2


async def test_scaling_down_keeps_the_lowest_slots(world: World) -> None:
    world.write(replicas=3)
    await world.reconcile()
    world.write(replicas=1)
    await world.reconcile()
    assert [r.slot for r in world.containers.running()] == [0]


async def test_a_failed_image_keeps_the_old_replicas_and_is_reported_once(world: World) -> None:
    world.write()
    await world.reconcile()
    old = {r.id for r in world.containers.running()}
    world.images.failures[("api", "service.js")] = "build of Dockerfile failed: exit 1"
    world.write(mode="b")
    assert await world.reconcile() == FAILED
    assert await world.reconcile() == FAILED
    assert {r.id for r in world.containers.running()} == old
    assert world.failures() == ['service "service.js": build of Dockerfile failed: exit 1']
    world.images.failures.clear()
    assert await world.reconcile() == UNCHANGED
    assert isinstance(world.events[-1], FunctionPrepared)


async def test_a_missing_secret_keeps_replicas_and_names_only_the_reference(world: World) -> None:
    world.write()
    await world.reconcile()
    world.secrets.remove("api-token")
    world.write(mode="b")
    await world.reconcile()
    assert len(world.containers.running()) == 2
    (error,) = world.failures()
    assert error.startswith('service "service.js": secret "api-token" (for TOKEN) is not set')
    assert "s3cret" not in error


async def test_routed_service_without_traefik_network_says_so_word_for_word(world: World) -> None:
    world.write(replicas=1)
    await world.reconcile()
    world.write(replicas=1, extra="    host: api.example.com\n")
    await world.reconcile()
    assert world.failures() == [
        'service "service.js": TRAEFIK_NETWORK is required when Traefik routing is configured'
    ]
    assert len(world.containers.running()) == 1


async def test_a_missing_traefik_network_is_reported_and_never_created(tmp_path: Path) -> None:
    world = World(tmp_path, RoutingSettings(network="proxy"))
    world.write(replicas=1, extra="    host: api.example.com\n")
    await world.reconcile()
    assert world.failures() == ['service "service.js": Traefik network "proxy" does not exist']
    assert world.containers.running() == []
    world.containers.networks.add("proxy")
    await world.reconcile()
    (replica,) = world.containers.running()
    assert replica.labels["traefik.docker.network"] == "proxy"
    assert replica.labels["relay.networks"] == "proxy"


async def test_removing_host_replaces_the_routed_replica_with_an_internal_one(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, RoutingSettings(network="proxy"))
    world.containers.networks.add("proxy")
    world.write(replicas=1, extra="    host: api.example.com\n")
    await world.reconcile()
    world.write(replicas=1)
    await world.reconcile()
    (replica,) = world.containers.running()
    assert not any(k.startswith("traefik.") for k in replica.labels)


async def test_a_removed_service_and_a_removed_function_lose_their_containers(
    world: World,
) -> None:
    world.write()
    world.write(name="other")
    await world.bus.send(ReconcileAll())
    assert len(world.containers.running()) == 4
    d = world.root / "other"
    (d / "template.yaml").write_text("runtime: node24\nservices: []\n")
    await world.reconcile("other")
    assert {r.labels["relay.function"] for r in world.containers.running()} == {"api"}
    for f in (world.root / "api").iterdir():
        f.unlink()
    (world.root / "api").rmdir()
    await world.reconcile("api")
    assert world.containers.running() == []


async def test_start_sweeps_leftovers_of_a_deleted_function_but_not_other_workers(
    world: World,
) -> None:
    world.write()
    await world.reconcile()
    leftover = next(iter(world.containers.containers.values()))
    stranger = leftover.labels | {"relay.function": "gone", "relay.hostname": "worker-2"}
    gone = leftover.labels | {"relay.function": "gone"}
    from relay.domain.services import ObservedReplica  # noqa: PLC0415 - test-local

    world.containers.containers["x1"] = ObservedReplica(id="x1", labels=gone, running=True)
    world.containers.containers["x2"] = ObservedReplica(id="x2", labels=stranger, running=True)
    await world.bus.send(ReconcileAll())
    assert "x1" not in world.containers.containers
    assert "x2" in world.containers.containers


async def test_graceful_stop_removes_only_this_workers_containers(world: World) -> None:
    world.write()
    await world.reconcile()
    assert await world.services.stop_all() == 2
    assert world.containers.running() == []


async def test_state_event_shows_replicas_and_the_effective_rule(tmp_path: Path) -> None:
    world = World(tmp_path, RoutingSettings(network="proxy", host_override="localhost"))
    world.containers.networks.add("proxy")
    world.write(extra="    host: api.example.com\n    path: /v2\n")
    await world.reconcile()
    state = [e for e in world.events if isinstance(e, ServicesConverged)][-1]
    (service,) = state.services
    assert [r.state for r in service.replicas] == ["running", "running"]
    assert service.rule == "Host(`api.localhost`) && PathPrefix(`/v2`)"


async def test_a_build_only_template_needs_no_runtime(world: World) -> None:
    d = world.root / "custom"
    d.mkdir()
    (d / "Dockerfile").write_text("FROM scratch\n")
    (d / "template.yaml").write_text("services:\n  - build: Dockerfile\n    port: 8080\n")
    assert await world.reconcile("custom") == PREPARED
    (replica,) = world.containers.running()
    assert replica.labels["relay.identity"] == "Dockerfile"
    assert world.builder.prepares == []


async def test_retirement_keeps_images_service_replicas_run(world: World) -> None:
    world.write()
    await world.reconcile()
    image = world.containers.running()[0].labels["relay.image"]
    world.images.failures[("api", "service.js")] = "pull failed"
    (world.root / "api" / "service.js").write_text("// v2\n")
    await world.reconcile()
    assert image in world.builder.images["api"]
    assert world.builder.retired[-1][1]
    assert image in world.builder.retired[-1][1]


async def test_a_replacement_that_cannot_start_keeps_the_old_replica(world: World) -> None:
    world.write(replicas=1)
    await world.reconcile()
    (old,) = world.containers.running()
    world.containers.start_failures.add("service.js")
    world.write(mode="b", replicas=1)
    assert await world.reconcile() == FAILED
    assert [r.id for r in world.containers.running()] == [old.id]
    assert world.failures() == ['service "service.js": replica 0 exited at start (exit code 1)']
    state = [e for e in world.events if isinstance(e, ServicesConverged)][-1]
    assert [r.state for r in state.services[0].replicas] == ["replacing"]
    world.containers.start_failures.clear()
    await world.reconcile()
    (new,) = world.containers.running()
    assert new.id != old.id


async def test_one_failing_function_never_harms_another(world: World) -> None:
    world.write(name="good")
    world.write(name="bad")
    world.images.failures[("bad", "service.js")] = "image is missing"
    results = await world.bus.send(ReconcileAll())
    assert results == {"bad": FAILED, "good": PREPARED}
    assert {r.labels["relay.function"] for r in world.containers.running()} == {"good"}


async def test_clearing_a_routing_value_converges_its_labels_away(tmp_path: Path) -> None:
    with_tls = World(tmp_path, RoutingSettings(network="proxy", certresolver="letsencrypt"))
    with_tls.containers.networks.add("proxy")
    with_tls.write(replicas=1, extra="    host: api.example.com\n")
    await with_tls.reconcile()
    (old,) = with_tls.containers.running()
    assert any(k.endswith(".tls.certresolver") for k in old.labels)

    # a restart with TRAEFIK_CERTRESOLVER unset, on the same engine
    restarted = World(tmp_path, RoutingSettings(network="proxy"), with_tls.containers)
    await restarted.reconcile()
    (new,) = restarted.containers.running()
    assert new.id != old.id
    assert not any(".tls" in k for k in new.labels)
    assert new.labels["traefik.enable"] == "true"


async def test_a_failed_function_build_heals_replicas_and_stays_the_last_error(
    world: World,
) -> None:
    world.write()
    await world.reconcile()
    world.images.failures[("api", "service.js")] = "registry down"
    await world.reconcile()  # a service failure is reported ...
    world.images.failures.clear()
    world.builder.failures["api"] = 'function "api": function image build failed: exit 1'
    world.write(mode="b")
    crashed = world.containers.running()[0]
    world.containers.crash(crashed.id)
    assert await world.reconcile() == FAILED
    assert len(world.containers.running()) == 2  # ... healed by the serving version
    last = [e for e in world.events if isinstance(e, (FunctionPrepared, FunctionReconcileFailed))]
    assert isinstance(last[-1], FunctionReconcileFailed)
    assert last[-1].error == 'function "api": function image build failed: exit 1'


async def test_a_broken_template_keeps_its_replicas_through_full_passes(world: World) -> None:
    world.write()
    await world.reconcile()
    before = {r.id for r in world.containers.running()}
    (world.root / "api" / "template.yaml").write_text("runtime: node24\nservices: [{port: 1}]\n")
    await world.bus.send(ReconcileAll())
    await world.bus.send(ReconcileAll())
    assert {r.id for r in world.containers.running()} == before


async def test_a_restart_on_a_broken_template_keeps_the_leftover_replicas(
    world: World,
) -> None:
    world.write()
    await world.reconcile()
    before = {r.id for r in world.containers.running()}
    (world.root / "api" / "template.yaml").write_text("runtime: node24\nservices: [{port: 1}]\n")
    restarted = World(world.root, containers=world.containers)
    await restarted.bus.send(ReconcileAll())
    assert {r.id for r in restarted.containers.running()} == before
