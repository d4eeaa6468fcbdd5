"""``relay function inspect``'s Services block, byte for byte, from a state row."""

from __future__ import annotations

from relay.entrypoints.cli.fn_catalog import render_inspect

ROW = {
    "name": "api",
    "runtime": "node24",
    "status": "ready",
    "services": [
        {"entrypoint": "app/service.js", "port": 3000, "replicas": 2, "host": "api.example.com"},
        {"build": "docker/Dockerfile.prod", "port": 8080, "replicas": 1},
        {"image": "ghcr.io/acme/api:1.2", "port": 9090, "replicas": 3},
    ],
    "service_state": {
        "app/service.js": {
            "replicas": ["running", "replacing"],
            "rule": "Host(`api.example.com`)",
        },
        "ghcr.io/acme/api:1.2": {
            "replicas": ["running", "missing", "missing"],
            "error": 'service "ghcr.io/acme/api:1.2": replica 1 exited at start (exit code 1)',
        },
    },
}


def _services(lines: list[str]) -> list[str]:
    start = lines.index("Services:")
    end = lines.index("Stats:")
    return lines[start:end]


def test_the_spec_block_then_replica_states_rules_and_errors() -> None:
    assert _services(render_inspect(ROW, {}, None, 0.0)) == [
        "Services:",
        "  app/service.js                port=3000 replicas=2",
        "    replicas: running replacing",
        "    rule: Host(`api.example.com`)",
        "  build:docker/Dockerfile.prod  port=8080 replicas=1",
        "  image:ghcr.io/acme/api:1.2    port=9090 replicas=3",
        "    replicas: running missing missing",
        '    error: service "ghcr.io/acme/api:1.2": replica 1 exited at start (exit code 1)',
    ]


def test_defaults_are_shown_when_the_row_has_none() -> None:
    row = {"name": "x", "status": "ready", "services": [{"image": "nginx:1.27"}]}
    assert _services(render_inspect(row, {}, None, 0.0)) == [
        "Services:",
        "  image:nginx:1.27  port=80 replicas=1",
    ]
    assert "Image:           -" in render_inspect(row, {}, None, 0.0)
