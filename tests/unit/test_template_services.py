"""Template validation of ``services``: sources, port, replicas, host and path."""

from __future__ import annotations

from typing import Any

import pytest

from relay.domain.errors import TemplateError
from relay.domain.template import ServiceSpec, parse_template


def services(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"runtime": "node24", "services": list(entries)}


def problems(doc: object) -> list[str]:
    with pytest.raises(TemplateError) as caught:
        parse_template(doc)
    return caught.value.problems


def one(**fields: Any) -> ServiceSpec:
    (service,) = parse_template(services(fields)).services
    return service


def test_the_three_source_kinds_and_their_defaults() -> None:
    template = parse_template(
        services(
            {"entrypoint": "service.js", "port": 3000, "replicas": 2},
            {"build": "Dockerfile", "port": 8080},
            {"image": "ghcr.io/acme/api:1.2", "port": 9090, "replicas": 3},
        )
    )
    entry, build, image = template.services
    assert entry == ServiceSpec(kind="entrypoint", source="service.js", port=3000, replicas=2)
    assert (build.kind, build.source, build.port, build.replicas) == (
        "build",
        "Dockerfile",
        8080,
        1,
    )
    assert (image.kind, image.source, image.replicas) == ("image", "ghcr.io/acme/api:1.2", 3)
    assert entry.identity == "service.js"
    assert (entry.display, build.display, image.display) == (
        "service.js",
        "build:Dockerfile",
        "image:ghcr.io/acme/api:1.2",
    )
    assert one(image="nginx:1.27").port == 80
    assert one(image="nginx:1.27").host is None


@pytest.mark.parametrize(
    ("entry", "found"),
    [
        ({}, "has none"),
        ({"port": 80}, "has none"),
        ({"entrypoint": "a.js", "image": "nginx"}, "has entrypoint and image"),
        (
            {"entrypoint": "a.js", "build": "Dockerfile", "image": "nginx"},
            "has entrypoint and build",
        ),
    ],
)
def test_exactly_one_source(entry: dict[str, Any], found: str) -> None:
    (line,) = problems(services(entry))
    assert line.startswith("services[0]: needs exactly one of entrypoint, build or image")
    assert found in line


@pytest.mark.parametrize("kind", ["entrypoint", "build"])
@pytest.mark.parametrize("path", ["service.js", "app/main.py", "docker/Dockerfile.prod", "./a.js"])
def test_relative_source_paths_accepted(kind: str, path: str) -> None:
    assert one(**{kind: path}).source == path


@pytest.mark.parametrize("kind", ["entrypoint", "build"])
@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/abs/service.js", "relative path"),
        ("../service.js", "'..'"),
        ("app/../../x.js", "'..'"),
        ("my service.js", "whitespace"),
        ("a\tb", "whitespace"),
        ("app\\main.py", "forward slashes"),
        ("app/", "not a directory"),
        ("", "non-empty string"),
        (3, "non-empty string"),
        (None, "non-empty string"),
    ],
)
def test_relative_source_paths_rejected(kind: str, path: object, reason: str) -> None:
    (line,) = problems(services({kind: path}))
    assert line.startswith(f"services[0].{kind}: ")
    assert reason in line


@pytest.mark.parametrize(
    "ref",
    [
        "nginx",
        "nginx:1.27",
        "ghcr.io/acme/api:1.2",
        "localhost:5000/team/app:latest",
        "ghcr.io/acme/api@sha256:" + "a" * 64,
        "registry.example.com/a/b/c:v1.0-rc.1",
    ],
)
def test_image_references_accepted(ref: str) -> None:
    assert one(image=ref).source == ref


@pytest.mark.parametrize(
    "ref", ["", "nginx latest", "Nginx", "nginx:", "-nginx", "nginx@sha256:xyz", 3]
)
def test_image_references_rejected(ref: object) -> None:
    (line,) = problems(services({"image": ref}))
    assert line.startswith("services[0].image: ")


@pytest.mark.parametrize("port", [1, 80, 8080, 65535])
def test_ports_accepted(port: int) -> None:
    assert one(image="nginx", port=port).port == port


@pytest.mark.parametrize("port", [0, -1, 65536, "80", 80.0, True, None])
def test_ports_rejected(port: object) -> None:
    (line,) = problems(services({"image": "nginx", "port": port}))
    assert line.startswith("services[0].port: must be an integer from 1 to 65535")


def test_replicas_are_capped_at_100_in_one_line() -> None:
    assert one(image="nginx", replicas=100).replicas == 100
    for replicas in (101, 1_000_000_000_000):
        assert problems(services({"image": "nginx", "replicas": replicas})) == [
            f"services[0].replicas: {replicas} is over the limit of 100 replicas per service"
        ]


@pytest.mark.parametrize("replicas", [0, -1, 1.5, True, "2", None])
def test_replicas_must_be_positive_integers(replicas: object) -> None:
    (line,) = problems(services({"image": "nginx", "replicas": replicas}))
    assert line.startswith("services[0].replicas: must be a positive integer")


@pytest.mark.parametrize("host", ["api.example.com", "localhost", "a-b.c0.io", "API.Example.com"])
def test_hosts_accepted(host: str) -> None:
    assert one(image="nginx", host=host).host == host


@pytest.mark.parametrize("host", ["", None])
def test_empty_host_means_internal(host: object) -> None:
    assert one(image="nginx", host=host).host is None


@pytest.mark.parametrize(
    "host",
    ["api example.com", "-api.example.com", "api-.example.com", "api..example.com", "*.example.com",
     "api.example.com.", "http://api.example.com", "a" * 64 + ".com", "api_x.com", 3],
)  # fmt: skip
def test_hosts_rejected(host: object) -> None:
    (line,) = problems(services({"image": "nginx", "host": host}))
    assert line.startswith("services[0].host: ")


@pytest.mark.parametrize(
    ("path", "canonical"),
    [("/v2", "/v2"), ("/v2/", "/v2"), ("/", "/"), ("/a/b", "/a/b"), ("/a/b///", None)],
)
def test_paths_are_canonicalized(path: str, canonical: str | None) -> None:
    doc = services({"image": "nginx", "host": "api.example.com", "path": path})
    if canonical is None:
        assert problems(doc)[0].startswith("services[0].path: ")
    else:
        assert parse_template(doc).services[0].path == canonical


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("v2", "must start with /"),
        ("/v 2", "whitespace"),
        ("/v2?x=1", "query"),
        ("/v2#top", "fragment"),
        ("/v2\\x", "backslash"),
        ("//v2", "empty segment"),
        ("/a//b", "empty segment"),
        (2, "must be a URL path"),
    ],
)
def test_paths_rejected(path: object, reason: str) -> None:
    doc = services({"image": "nginx", "host": "api.example.com", "path": path})
    (line,) = problems(doc)
    assert line.startswith("services[0].path: ")
    assert reason in line


def test_path_requires_host() -> None:
    assert problems(services({"entrypoint": "service.js", "path": "/v2"})) == [
        'services[0]: service "service.js": path requires host'
    ]


def test_empty_path_means_host_only() -> None:
    assert one(image="nginx", host="api.example.com", path="").path is None


def test_duplicate_sources_and_routes_are_errors() -> None:
    doc = services(
        {"entrypoint": "service.js"},
        {"entrypoint": "service.js", "port": 81},
        {"image": "nginx", "host": "api.example.com"},
        {"image": "httpd", "host": "API.example.com"},
        {"image": "caddy", "host": "api.example.com", "path": "/v2"},
    )
    assert problems(doc) == [
        'services[1]: duplicate source "service.js" (also services[0])',
        'services[3].host: duplicate host and path "api.example.com" (also services[2])',
    ]


def test_unknown_service_keys_are_errors() -> None:
    (line,) = problems(services({"image": "nginx", "replica": 2}))
    assert line.startswith('services[0].replica: unknown key (did you mean "replicas"?')


@pytest.mark.parametrize("path", ["app/main.py", "main.py", "./app/main.py", "pkg/sub/run.py"])
def test_python_entrypoints_map_to_modules(path: str) -> None:
    doc = {"runtime": "python3.14", "services": [{"entrypoint": path}]}
    (service,) = parse_template(doc).services
    assert service.python_module == path.removeprefix("./").removesuffix(".py").replace("/", ".")


@pytest.mark.parametrize("path", ["app/my-server.py", "1app/main.py", "app/class.py", "a b.py"])
def test_python_entrypoints_that_cannot_be_modules_are_rejected(path: str) -> None:
    (line,) = problems({"runtime": "python3.14", "services": [{"entrypoint": path}]})
    assert line.startswith("services[0].entrypoint: ")


def test_node_entrypoints_may_have_any_file_name() -> None:
    assert one(entrypoint="my-server.mjs").source == "my-server.mjs"


def test_empty_host_with_a_path_still_requires_host() -> None:
    doc = services({"image": "nginx", "host": "", "path": "/v2"})
    assert problems(doc) == ['services[0]: service "nginx": path requires host']


INJECTION = "/x`)||Host(`victim.example.com`)||PathPrefix(`"


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        (INJECTION, "'`' at offset 2"),
        ("/x`)||Host(`victim.example.com`)||PathPrefix(`/x", "'`' at offset 2"),
        ("/x)", "')' at offset 2"),
        ("/x(", "'(' at offset 2"),
        ("/a|b", "'|' at offset 2"),
        ("/a&b", "'&' at offset 2"),
        ("/a,b", "',' at offset 2"),
        ('/a"b', "'\"' at offset 2"),
        ("/a<b", "'<' at offset 2"),
        ("/caf\u00e9", "'\u00e9' at offset 4"),
        ("/a%zz", "'%' at offset 2"),
        ("/a%2", "'%' at offset 2"),
        ("/a\x00", "U+0000 at offset 2"),
    ],
)
def test_a_path_with_rule_syntax_is_refused_naming_the_service_and_the_character(
    path: str, shown: str
) -> None:
    doc = services({"entrypoint": "service.js", "host": "api.example.com", "path": path})
    (line,) = problems(doc)
    assert line.startswith('services[0].path: service "service.js": ')
    assert f"contains {shown}: only letters, digits, " in line
    assert "\n" not in line


@pytest.mark.parametrize(
    "path", ["/v2", "/a-b_c.d~e", "/!$'*+;=:@", "/caf%C3%A9", "/users/%7Bid%7D", "/v2.1/api"]
)
def test_every_url_path_character_is_accepted(path: str) -> None:
    assert one(image="nginx", host="api.example.com", path=path).path == path


@pytest.mark.parametrize("host", ["victim.example.com`)||Host(`x", "a(b).com", "api.example.com\n"])
def test_a_host_with_rule_syntax_is_refused_naming_the_service(host: str) -> None:
    (line,) = problems(services({"entrypoint": "service.js", "host": host}))
    assert line.startswith('services[0].host: service "service.js": ')
    assert line.endswith("is not a valid hostname (e.g. api.example.com)")
