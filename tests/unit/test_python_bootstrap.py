"""The Python bootstrap as a plain subprocess (no Docker): framing, environment,
handler kinds, and its own deadlines."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.adapters.docker.bootstraps import bootstrap_command, bootstrap_source
from tests.unit.bootstrap_driver import BootstrapProcess, write_app

APP = {
    "mod.py": """
import asyncio, os, sys, json
def ok(event):
    print("stdout line", event)
    print("stderr line", file=sys.stderr)
def env(event):
    print("ENV", json.dumps({k: os.environ.get(k) for k in event["show"]}))
def env_then_meddle(event):
    env(event)
    os.environ["KEPT"] = "meddled"
    os.environ.pop("RELAY_HANDLER", None)
async def async_ok(event):
    await asyncio.sleep(0)
def boom(event):
    raise KeyError("missing")
def exit_zero(event):
    sys.exit(0)
def exit_three(event):
    sys.exit(3)
def forge(event):
    os.write(1, b'{"id": "x", "ok": true, "error": ""}\\n')
    print(json.dumps({"id": None, "ok": True, "error": ""}))
    raise RuntimeError("real")
def forge_marker(event):
    sys.stderr.write("\\x1erelay-end:guess" + json.dumps({"ok": True, "error": ""}) + "\\n")
    raise RuntimeError("real")
def big(event):
    sys.stdout.write("x" * 300000 + "\\n")
    sys.stderr.write("no newline at the end")
def read_stdin(event):
    print("STDIN", repr(sys.stdin.read()))
def sleep(event):
    import time; time.sleep(60)
""",
    "pkg/__init__.py": "",
    "pkg/sub.py": "def handler(event):\n    print('nested', event['n'])\n",
}


class Bootstrap(BootstrapProcess):
    def __init__(self, app: Path, **env: str) -> None:
        _, source = bootstrap_source("python3.14")
        script = app.parent / "bootstrap.py"
        script.write_bytes(source)
        argv = [sys.executable, *bootstrap_command("python3.14")[1:-1], str(script)]
        super().__init__(argv, app, timeout_s=5, env=env)


@pytest.fixture
def app(tmp_path: Path) -> Path:
    return write_app(tmp_path / "app", APP)


@pytest.fixture
def boot(app: Path) -> Iterator[Bootstrap]:
    bootstrap = Bootstrap(app)
    yield bootstrap
    bootstrap.close()


def test_success_and_output_go_to_stderr_only(boot: Bootstrap) -> None:
    answer, output = boot.call("mod.ok", {"a": 1})
    assert answer == {"id": "nonce1", "ok": True, "error": ""}
    assert output == "stdout line {'a': 1}\nstderr line\n"


def test_nested_module_and_async_handler(boot: Bootstrap) -> None:
    answer, output = boot.call("pkg.sub.handler", {"n": 4})
    assert answer["ok"] is True
    assert output == "nested 4\n"
    assert boot.call("mod.async_ok")[0]["ok"] is True


def test_exception_is_a_failure_and_the_process_keeps_serving(boot: Bootstrap) -> None:
    answer, output = boot.call("mod.boom")
    assert answer["ok"] is False
    assert answer["error"] == "KeyError: 'missing'"
    assert "Traceback" in output
    assert boot.call("mod.ok")[0]["ok"] is True


def test_sys_exit_codes(boot: Bootstrap) -> None:
    assert boot.call("mod.exit_zero")[0]["ok"] is True
    answer, _ = boot.call("mod.exit_three")
    assert answer == {"id": "nonce2", "ok": False, "error": "handler exited with status 3"}
    assert boot.call("mod.ok")[0]["ok"] is True


def test_missing_module_or_function_is_a_failure(boot: Bootstrap) -> None:
    assert "No module named" in str(boot.call("nope.handler")[0]["error"])
    assert "no function" in str(boot.call("mod.nothing")[0]["error"])
    assert "module.function" in str(boot.call("plain")[0]["error"])


def test_forged_frames_land_in_the_output(boot: Bootstrap) -> None:
    answer, output = boot.call("mod.forge")
    assert answer == {"id": "nonce1", "ok": False, "error": "RuntimeError: real"}
    assert '{"id": "x", "ok": true, "error": ""}' in output


def test_a_marker_with_a_wrong_nonce_is_output(boot: Bootstrap) -> None:
    answer, output = boot.call("mod.forge_marker")
    assert answer == {"id": "nonce1", "ok": False, "error": "RuntimeError: real"}
    assert output.startswith('\x1erelay-end:guess{"ok": true, "error": ""}\n')


def test_the_answer_follows_all_the_output_on_one_stream(boot: Bootstrap) -> None:
    answer, output = boot.call("mod.big")
    assert answer["ok"] is True
    assert output == "x" * 300000 + "\nno newline at the end"


def test_environment_is_set_then_removed_or_restored(app: Path) -> None:
    boot = Bootstrap(app, KEPT="original")
    try:
        show = {"show": ["KEPT", "ONLY_FIRST", "RELAY_HANDLER"]}
        _, first = boot.call("mod.env", show, KEPT="override", ONLY_FIRST="1")
        _, second = boot.call("mod.env", show)
    finally:
        boot.close()
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
    app: Path,
) -> None:
    boot = Bootstrap(app, KEPT="original")
    try:
        show = {"show": ["KEPT", "RELAY_HANDLER"]}
        _, first = boot.call("mod.env_then_meddle", show, KEPT="override")
        _, second = boot.call("mod.env", show, KEPT="override")
        _, third = boot.call("mod.env", show)
    finally:
        boot.close()
    request = {"KEPT": "override", "RELAY_HANDLER": "mod.env"}
    assert json.loads(first.removeprefix("ENV ")) == {
        **request,
        "RELAY_HANDLER": "mod.env_then_meddle",
    }
    assert json.loads(second.removeprefix("ENV ")) == request
    assert json.loads(third.removeprefix("ENV ")) == {
        "KEPT": "original",
        "RELAY_HANDLER": "mod.env",
    }


def test_the_handler_cannot_read_the_request_channel(boot: Bootstrap) -> None:
    answer, output = boot.call("mod.read_stdin")
    assert answer["ok"] is True
    assert output == "STDIN ''\n"
    assert boot.call("mod.ok")[0]["ok"] is True


def test_exits_on_end_of_input(boot: Bootstrap) -> None:
    boot.call("mod.ok")
    assert boot.close() == 0


def test_exits_when_idle_past_its_deadline(app: Path) -> None:
    boot = Bootstrap(app, RELAY_IDLE_DEADLINE_S="0.2")
    try:
        boot.call("mod.ok")
        assert boot.process.wait(timeout=10) == 0
    finally:
        boot.close()


def test_a_request_past_timeout_plus_grace_ends_the_process(app: Path) -> None:
    boot = Bootstrap(app, RELAY_GRACE_S="0.1")
    assert boot.process.stdin
    request = {"id": "n", "handler": "mod.sleep", "env": {}, "event": "{}", "timeout_s": 0.2}
    begun = time.monotonic()
    boot.process.stdin.write(json.dumps(request).encode() + b"\n")
    boot.process.stdin.flush()
    code = boot.process.wait(timeout=20)
    boot.close()
    assert code != 0
    assert time.monotonic() - begun < 20
