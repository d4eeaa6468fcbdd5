"""The deployment files agree with the package they ship (Dockerfile, the locks,
compose.dev.yaml). The real proof is tests/e2e/test_compose_deploy.py; these catch drift
in seconds."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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


def test_compose_mounts_the_socket_only_into_the_proxy_and_publishes_no_port() -> None:
    services = yaml.safe_load((ROOT / "compose.dev.yaml").read_text())["services"]
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
