"""The deployment files agree with the package they ship (Dockerfile, the locks,
compose.dev.yaml, compose.embedded.yaml) and with each other. The real proof is
tests/e2e/test_compose_deploy.py and test_compose_embedded.py; these catch drift in
seconds."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", re.MULTILINE)


def _pins(path: Path) -> dict[str, str]:
    return {m[1].lower(): m[2] for m in PIN.finditer(path.read_text())}


def test_the_image_labels_the_package_version() -> None:
    with (ROOT / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert f"ARG RELAY_VERSION={version}\n" in (ROOT / "Dockerfile").read_text()


def test_the_runtime_lock_is_the_full_lock_without_the_test_tools() -> None:
    full = _pins(ROOT / "requirements.lock")
    runtime = _pins(ROOT / "requirements-runtime.lock")
    assert runtime, "requirements-runtime.lock lists nothing: run scripts/lock"
    assert {name: full.get(name) for name in runtime} == runtime  # same pins
    assert not {"pytest", "mypy", "ruff", "hypothesis"} & runtime.keys()


COMPOSE_FILES = ("compose.dev.yaml", "compose.embedded.yaml")


def _services(name: str) -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load((ROOT / name).read_text())["services"]
    return services


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_compose_mounts_the_socket_only_into_the_proxy_and_publishes_no_port(name: str) -> None:
    services = _services(name)
    with_socket = {
        name
        for name, service in services.items()
        if any("docker.sock" in str(v) for v in service.get("volumes", []))
    }
    assert with_socket == {"socket-proxy"}
    assert all(str(v).endswith(":ro") for v in services["socket-proxy"]["volumes"])
    assert not [name for name, service in services.items() if "ports" in service]


def test_relays_direct_directory_is_mounted_at_the_same_path_it_has_on_the_host() -> None:
    # compose's ${VAR:-default} with its default, as `docker-compose config` would
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", (ROOT / "compose.dev.yaml").read_text())
    relay = yaml.safe_load(text)["services"]["relay"]
    (direct,) = [
        e.split("=", 1)[1] for e in relay["environment"] if e.startswith("RELAY_DIRECT_DIR=")
    ]
    same_path = [v.split(":")[0] for v in relay["volumes"] if v.split(":")[0] == v.split(":")[1]]
    assert direct == "/run/relay-sockets/relay-dev/containers"
    assert [p for p in same_path if direct.startswith(p + "/")], (direct, relay["volumes"])


def test_the_embedded_stack_has_no_redis_and_keeps_its_broker_file_on_the_volume() -> None:
    services = _services("compose.embedded.yaml")
    assert set(services) == {"socket-proxy", "relay"}
    relay = services["relay"]
    env = dict(e.split("=", 1) for e in relay["environment"])
    assert env["RELAY_BROKER"] == "sqlite"
    assert "REDIS_URI" not in env
    assert "redis" not in relay["depends_on"]
    (data,) = [v.split(":")[1] for v in relay["volumes"] if v.startswith("relay-data:")]
    assert env["RELAY_BROKER_PATH"].startswith(data + "/")


def test_the_embedded_stack_has_the_proxy_and_the_hardening_of_the_redis_one() -> None:
    dev, embedded = _services("compose.dev.yaml"), _services("compose.embedded.yaml")
    assert embedded["socket-proxy"] == dev["socket-proxy"]
    # everything of relay's but what names the broker and the fast-path directory,
    # and the default hostname (test_the_two_stacks_default_to_different_hostnames)
    differ = {"environment", "volumes", "depends_on", "hostname"}
    assert {k: v for k, v in embedded["relay"].items() if k not in differ} == {
        k: v for k, v in dev["relay"].items() if k not in differ
    }
    shared = {"DOCKER_HOST", "REDIS_STREAM", "REDIS_GROUP"}
    assert [e for e in embedded["relay"]["environment"] if e.split("=")[0] in shared] == [
        e for e in dev["relay"]["environment"] if e.split("=")[0] in shared
    ]
    assert embedded["relay"]["volumes"][0] == dev["relay"]["volumes"][0]  # /functions


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_the_healthcheck_gives_relay_health_dockers_default_time(name: str) -> None:
    # relay health is a Python CLI that may wait out its Redis connect timeout (5 s)
    # after a start that alone took 6 s on a loaded host; 5 s flapped to unhealthy there
    timeout = _services(name)["relay"]["healthcheck"]["timeout"]
    assert re.fullmatch(r"\d+s", timeout)
    assert int(timeout[:-1]) >= 30, timeout
    dockerfile = (ROOT / "Dockerfile").read_text()
    (image_timeout,) = re.findall(r"HEALTHCHECK .*--timeout=(\d+)s", dockerfile)
    assert int(image_timeout) >= 30


def _default_hostname(name: str) -> str:
    relay = _services(name)["relay"]
    found = re.fullmatch(r"\$\{RELAY_HOSTNAME:-([^}]+)\}", relay["hostname"])
    assert found, relay["hostname"]
    return found.group(1)


def test_the_two_stacks_default_to_different_hostnames() -> None:
    """Issue 35.12: service containers (and execution containers' orphan sweep) are
    scoped by the worker's hostname, so the dev and embedded stacks on one engine
    must not share one by default, or each would stop the other's containers."""
    assert _default_hostname("compose.dev.yaml") == "relay-dev"
    assert _default_hostname("compose.embedded.yaml") == "relay-embedded"
