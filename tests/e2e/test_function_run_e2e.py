"""``relay function run`` end to end: the real CLI builds a Python and a Node
function's image on the real Docker engine and runs one handler once, with no
broker and no worker: a success (output, return value, env and secret), an
exception, a timeout, and a return value past the bound."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from relay.domain.execution import RESULT_MAX_BYTES
from tests.e2e.harness import run_relay
from tests.json_schemas import assert_matches_schema
from tests.testbed import DockerEngine

pytestmark = pytest.mark.e2e

TEMPLATE = """\
runtime: {runtime}
events:
  - handler: jobs.ok
    pattern: {{kind: [ok]}}
  - handler: jobs.boom
    pattern: {{kind: [boom]}}
  - handler: jobs.slow
    pattern: {{kind: [slow]}}
    timeout: 1s
  - handler: jobs.big
    pattern: {{kind: [big]}}
env:
  GREETING: hello
secrets:
  TOKEN: run-token
"""

PYTHON = f"""\
import os, sys, time

def ok(event):
    print("to stdout", event["n"])
    print("to stderr", file=sys.stderr)
    return {{"greeting": os.environ["GREETING"], "token": os.environ["TOKEN"],
            "message": os.environ["RELAY_MESSAGE_ID"][:4]}}

def boom(event):
    print("about to fail")
    raise ValueError("no luck")

def slow(event):
    time.sleep(30)

def big(event):
    return "x" * {RESULT_MAX_BYTES * 2}
"""

NODE = f"""\
export function ok(event) {{
  console.log('to stdout', event.n);
  console.error('to stderr');
  return {{ greeting: process.env.GREETING, token: process.env.TOKEN,
           message: process.env.RELAY_MESSAGE_ID.slice(0, 4) }};
}}
export function boom() {{ console.log('about to fail'); throw new Error('no luck'); }}
export async function slow() {{ await new Promise((r) => setTimeout(r, 30000)); }}
export function big() {{ return 'x'.repeat({RESULT_MAX_BYTES * 2}); }}
"""

RUNTIMES = {"python3.14": ("jobs.py", PYTHON), "node24": ("jobs.mjs", NODE)}


@pytest.fixture(params=sorted(RUNTIMES))
def function(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Path:
    runtime = request.param
    module, source = RUNTIMES[runtime]
    directory = tmp_path / f"run-{runtime.rstrip('0123456789.')}-{unique}"
    directory.mkdir()
    (directory / "template.yaml").write_text(TEMPLATE.format(runtime=runtime))
    (directory / module).write_text(source)
    return directory


@pytest.fixture
def env(tmp_path: Path, unique: str, docker_engine: DockerEngine) -> dict[str, str]:
    docker_engine.require_image("python:3.14-slim")
    docker_engine.require_image("node:24-alpine")
    state = tmp_path / "state"
    values = {"RELAY_STATE_DIR": str(state), "RELAY_HOSTNAME": f"host-{unique}"}
    stored = run_relay(["secret", "set", "run-token"], values, stdin="s3cret")
    assert stored.returncode == 0, stored.stderr
    return values


def relay_run(function: Path, env: dict[str, str], *args: str, stdin: str | None = None) -> Any:
    return run_relay(["function", "run", str(function), *args], env, stdin=stdin, timeout=300)


def document(result: Any) -> dict[str, Any]:
    return assert_matches_schema(result.stdout)


def test_a_success_shows_output_return_value_duration_and_image(
    function: Path, env: dict[str, str]
) -> None:
    ran = relay_run(function, env, "jobs.ok", "--event", '{"kind": "ok", "n": 7}')
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "handler: jobs.ok"
    assert lines[1].startswith(f"image: relay-fn-{function.name}:")
    assert "  to stdout 7" in lines
    assert "  to stderr" in lines
    returned = next(line for line in lines if line.startswith("returned: "))
    value = json.loads(returned.removeprefix("returned: "))
    # the template's env and its secret from the local store; a run's own message id
    assert value == {"greeting": "hello", "token": "s3cret", "message": "run-"}
    assert lines[-1].startswith("duration: ")
    # --json, the event on stdin (--file -): one document, the same facts
    again = relay_run(function, env, "jobs.ok", "--file", "-", "--json", stdin='{"n": 8}')
    assert again.returncode == 0, again.stderr
    doc = document(again)
    assert (doc["ok"], doc["result"]["token"], doc["result_truncated"]) == (True, "s3cret", False)
    assert doc["output"] == ["to stdout 8", "to stderr"]
    assert doc["image"] == lines[1].removeprefix("image: ")
    assert "does not match the pattern" in again.stderr  # said, then run anyway


def test_an_exception_is_exit_1_with_its_error_and_output(
    function: Path, env: dict[str, str]
) -> None:
    ran = relay_run(function, env, "jobs.boom", "--event", '{"kind": "boom"}', "--json")
    assert ran.returncode == 1, ran.stderr
    doc = document(ran)
    assert doc["ok"] is False
    assert doc["error"].startswith(f'function "{function.name}" handler "jobs.boom": ')
    assert "no luck" in doc["error"]
    assert doc["output"][0] == "about to fail"
    assert (doc["returned"], doc["result_text"]) == (False, None)


def test_a_timeout_is_exit_1_and_leaves_no_container(
    function: Path, env: dict[str, str]
) -> None:
    ran = relay_run(function, env, "jobs.slow", "--event", '{"kind": "slow"}')
    assert ran.returncode == 1, ran.stderr
    assert "error: " in ran.stdout
    assert "timed out after 1s" in ran.stdout
    client = docker.from_env()
    try:
        left = [
            c for c in client.containers.list(all=True, sparse=True,
                                               filters={"label": "relay.type=execution"})
            # sparse: the listing's own labels (a sparse container has no Config)
            if str((c.attrs.get("Labels") or {}).get("relay.hostname", "")).startswith(
                env["RELAY_HOSTNAME"]
            )
        ]
    finally:
        client.close()
    assert left == []


def test_a_return_value_past_the_bound_is_cut_and_says_so(
    function: Path, env: dict[str, str]
) -> None:
    ran = relay_run(function, env, "jobs.big", "--event", '{"kind": "big"}', "--json")
    assert ran.returncode == 0, ran.stderr
    doc = document(ran)
    assert doc["result_truncated"] is True
    assert doc["result"] is None
    assert len(doc["result_text"]) == RESULT_MAX_BYTES
    assert doc["result_size"] == RESULT_MAX_BYTES * 2 + 2
    text = relay_run(function, env, "jobs.big", "--event", '{"kind": "big"}')
    assert f"(cut at {RESULT_MAX_BYTES} of {RESULT_MAX_BYTES * 2 + 2} bytes)" in text.stdout


def test_usage_and_lookup_errors_are_one_line(function: Path, env: dict[str, str]) -> None:
    unknown = relay_run(function, env, "jobs.nope", "--event", "{}")
    assert unknown.returncode == 1
    assert unknown.stderr == (
        f'relay: function "{function.name}" has no handler "jobs.nope" '
        "(its handlers: jobs.big, jobs.boom, jobs.ok, jobs.slow)\n"
    )
    bad = relay_run(function, env, "jobs.ok", "--event", "[1]")
    assert bad.returncode == 2
    assert bad.stderr.startswith("relay: --event: event must be a JSON object")
    missing = relay_run(function, {**env, "RELAY_STATE_DIR": env["RELAY_STATE_DIR"] + "-none"},
                        "jobs.ok", "--event", '{"kind": "ok"}')
    assert missing.returncode == 1
    assert missing.stderr == (
        'relay: secret "run-token" (for TOKEN) is not set; set it with '
        "`relay secret set run-token`\n"
    )
