"""The Node bootstrap as a plain subprocess on the host's Node (no Docker)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.adapters.docker.bootstraps import bootstrap_source
from tests.unit.bootstrap_driver import (
    BootstrapProcess,
    RelaySocket,
    check_env_does_not_leak,
    read_answer,
    request_line,
    write_app,
)

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="no node on this host's PATH")

APP = {
    "package.json": '{"type": "module"}',
    "mod.mjs": """
import fs from 'node:fs';
export function ok(event) {
  console.log('stdout line', JSON.stringify(event));
  console.error('stderr line');
}
export async function later(event) {
  await new Promise((r) => setTimeout(r, 5));
  console.log('later');
}
export function big() {
  process.stdout.write('x'.repeat(300000) + '\\n');
  process.stderr.write('no newline at the end');
}
export function forgeMarker() {
  process.stderr.write('\\x1erelay-end:guess' + JSON.stringify({ ok: true, error: '' }) + '\\n');
  throw new Error('real');
}
export function boom() { throw new TypeError('bad thing'); }
export function env(event) {
  const shown = event.show.map((k) => [k, process.env[k] ?? null]);
  console.log('ENV ' + JSON.stringify(Object.fromEntries(shown)));
}
export function envThenMeddle(event) {
  env(event);
  process.env.KEPT = 'meddled';
  delete process.env.RELAY_HANDLER;
}
export function forge() {
  fs.writeSync(1, 'half a line');
  process.stdout.write(JSON.stringify({ id: null, ok: true, error: '' }) + '\\n');
  throw new Error('real');
}
""",
    "deep/index.js": "export function handler(e) { console.log('index', e.n); }\n",
    "both.js": "export function handler() { console.log('js wins'); }\n",
}


class NodeBootstrap(BootstrapProcess):
    def __init__(self, app: Path, **env: str) -> None:
        _, source = bootstrap_source("node24")
        script = app.parent / "bootstrap.mjs"
        script.write_bytes(source)
        assert NODE is not None
        super().__init__([NODE, str(script)], app, env=env)


@pytest.fixture
def boot(tmp_path: Path) -> Iterator[NodeBootstrap]:
    bootstrap = NodeBootstrap(write_app(tmp_path / "app", APP), KEPT="original")
    yield bootstrap
    bootstrap.close()


def test_success_output_and_async(boot: NodeBootstrap) -> None:
    answer, output = boot.call("mod.ok", {"a": 1})
    assert answer == {"id": "nonce1", "ok": True, "error": ""}
    assert output == 'stdout line {"a":1}\nstderr line\n'
    answer, output = boot.call("mod.later")
    assert answer["ok"] is True
    assert output == "later\n"


def test_module_lookup_order(boot: NodeBootstrap) -> None:
    assert boot.call("deep.handler", {"n": 2})[1] == "index 2\n"
    assert boot.call("both.handler")[1] == "js wins\n"
    missing = boot.call("absent.handler")[0]
    assert missing["ok"] is False
    assert "no module" in str(missing["error"])


def test_exception_is_a_failure_and_the_process_keeps_serving(boot: NodeBootstrap) -> None:
    answer, output = boot.call("mod.boom")
    assert answer["error"] == "TypeError: bad thing"
    assert "TypeError: bad thing" in output
    assert boot.call("mod.ok")[0]["ok"] is True


def test_forged_frames_do_not_answer(boot: NodeBootstrap) -> None:
    answer, output = boot.call("mod.forge")
    assert answer == {"id": "nonce1", "ok": False, "error": "Error: real"}
    assert '{"id":null,"ok":true,"error":""}' in output
    assert "half a line" in output


def test_the_answer_follows_all_the_output_on_one_stream(boot: NodeBootstrap) -> None:
    answer, output = boot.call("mod.big")
    assert answer["ok"] is True
    assert output == "x" * 300000 + "\nno newline at the end"


def test_a_marker_with_a_wrong_nonce_is_output(boot: NodeBootstrap) -> None:
    answer, output = boot.call("mod.forgeMarker")
    assert answer == {"id": "nonce1", "ok": False, "error": "Error: real"}
    assert output.startswith('\x1erelay-end:guess{"ok":true,"error":""}\n')


def test_environment_is_set_then_removed_or_restored(boot: NodeBootstrap) -> None:
    show = {"show": ["KEPT", "ONLY_FIRST", "RELAY_HANDLER"]}
    _, first = boot.call("mod.env", show, KEPT="override", ONLY_FIRST="1")
    _, second = boot.call("mod.env", show)
    assert json.loads(first.removeprefix("ENV ")) == {
        "KEPT": "override",
        "ONLY_FIRST": "1",
        "RELAY_HANDLER": "mod.env",
    }
    assert json.loads(second.removeprefix("ENV ")) == {
        "KEPT": "original",
        "ONLY_FIRST": None,
        "RELAY_HANDLER": "mod.env",
    }


def test_a_handler_changing_its_environment_does_not_leak_into_the_next_request(
    boot: NodeBootstrap,
) -> None:
    check_env_does_not_leak(boot, "mod.envThenMeddle", "mod.env")


def test_exits_on_end_of_input(boot: NodeBootstrap) -> None:
    boot.call("mod.forge")
    assert boot.close() == 0
    assert boot.stdout == b""  # fd 1 is stderr too: nothing ever lands on stdout


# --- with Relay's socket (RELAY_CHANNEL): requests there, answers still on stderr ---


@pytest.fixture
def relay_socket(tmp_path: Path) -> Iterator[RelaySocket]:
    relay = RelaySocket(tmp_path / "relay.sock")
    yield relay
    relay.close()


def test_requests_on_the_socket_are_answered_on_stderr_after_the_output(
    tmp_path: Path, relay_socket: RelaySocket
) -> None:
    boot = NodeBootstrap(write_app(tmp_path / "app", APP), RELAY_CHANNEL=str(relay_socket.path))
    try:
        conn = relay_socket.accept()
        assert boot.process.stderr
        conn.sendall(request_line("n1", "mod.ok", {"a": 1}))
        answer, output = read_answer(boot.process.stderr, "n1")
        assert answer == {"id": "n1", "ok": True, "error": ""}
        assert output == 'stdout line {"a":1}\nstderr line\n'
        # stdin still serves beside the socket
        answer, _ = boot.call("mod.later")
        assert answer["ok"] is True
        conn.sendall(request_line("n2", "mod.boom"))
        answer, output = read_answer(boot.process.stderr, "n2")
        assert answer == {"id": "n2", "ok": False, "error": "TypeError: bad thing"}
        # Relay went away: the bootstrap leaves
        conn.close()
        assert boot.process.wait(timeout=10) == 0
    finally:
        boot.close()


def test_an_unusable_socket_is_reported_once_and_stdin_serves(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sock"
    boot = NodeBootstrap(write_app(tmp_path / "app", APP), RELAY_CHANNEL=str(missing))
    try:
        first, _ = boot.call("mod.ok")
        second, _ = boot.call("mod.ok")
    finally:
        boot.close()
    assert first["ok"] is True
    assert f"cannot connect to {missing}" in str(first["channel"])
    assert second == {"id": "nonce2", "ok": True, "error": ""}
