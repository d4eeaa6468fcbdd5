"""The Python bootstrap as a plain subprocess (no Docker): framing, environment,
handler kinds, and its own deadlines."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay.adapters.docker.bootstraps import bootstrap_command, bootstrap_source
from tests.unit.bootstrap_driver import (
    BootstrapProcess,
    RelaySocket,
    check_env_does_not_leak,
    request_line,
    write_app,
)

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
        check_env_does_not_leak(boot, "mod.env_then_meddle", "mod.env")
    finally:
        boot.close()


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


# --- with Relay's socket (RELAY_CHANNEL) --------------------------------------------

CHANNEL_APP = {
    "quiet.py": """
import os, subprocess, sys, threading, time
def silent(event):
    return None
def loud(event):
    print("printed", event["n"])
def raw(event):
    os.write(1, b"raw one\\n")
    os.write(2, b"raw two\\n")
    subprocess.run([sys.executable, "-c", "print('from a child')"], check=True)
def big(event):
    sys.stdout.write("y" * 300000 + "\\n")
def later(event):
    def speak():
        time.sleep(0.2)
        print("after the answer")
    threading.Thread(target=speak).start()
def boom(event):
    raise ValueError("nope")
def crash(event):
    print("last words")
    os._exit(7)
def sleep(event):
    time.sleep(60)
def close_output(event):
    os.close(1)
    os.close(2)
""",
}


class ChannelBootstrap(Bootstrap):
    """The bootstrap with ``RELAY_CHANNEL`` pointing at a socket this test listens on.

    ``err`` collects what the process wrote to stderr (its output)."""

    def __init__(self, app: Path, path: Path, **env: str) -> None:
        self.relay = RelaySocket(path)
        super().__init__(app, RELAY_CHANNEL=str(path), **env)
        self.conn = self.relay.accept()
        self.err = b""

    def send(self, handler: str, event: object = None, *, stdin: bool = False) -> str:
        self.count += 1
        nonce = f"nonce{self.count}"
        line = request_line(nonce, handler, event)
        if stdin:
            assert self.process.stdin
            self.process.stdin.write(line)
            self.process.stdin.flush()
        else:
            self.conn.sendall(line)
        return nonce

    def answer(self, nonce: str) -> dict[str, object]:
        """The next answer on the socket (it must be ``nonce``'s), once the output
        it counts has been read from stderr (read meanwhile too, as Relay does:
        the bootstrap blocks on a full stderr)."""
        assert self.process.stderr
        err_fd = self.process.stderr.fileno()
        data = b""
        while not data.endswith(b"\n"):
            ready, _, _ = select.select([self.conn.fileno(), err_fd], [], [], 10)
            assert ready, "no answer within 10 s"
            if err_fd in ready:
                self.err += os.read(err_fd, 65536)
            if self.conn.fileno() in ready:
                chunk = self.conn.recv(65536)
                assert chunk, "the bootstrap closed its socket"
                data += chunk
        marker = b"\x1erelay-end:" + nonce.encode()
        assert data.startswith(marker), data
        answer = json.loads(data[len(marker) :])
        assert isinstance(answer, dict)
        self.read_err(int(answer["out"]))
        return answer

    def read_err(self, total: int) -> None:
        assert self.process.stderr
        while len(self.err) < total:
            chunk = os.read(self.process.stderr.fileno(), 65536)
            assert chunk, "stderr ended early"
            self.err += chunk

    def close(self) -> int:
        self.relay.close()
        return super().close()


@pytest.fixture
def channel_app(tmp_path: Path) -> Path:
    return write_app(tmp_path / "quiet-app", CHANNEL_APP)


@pytest.fixture
def channel_boot(channel_app: Path, tmp_path: Path) -> Iterator[ChannelBootstrap]:
    bootstrap = ChannelBootstrap(channel_app, tmp_path / "relay.sock")
    yield bootstrap
    bootstrap.close()


def test_answers_come_on_the_socket_counting_the_output_before_them(
    channel_boot: ChannelBootstrap,
) -> None:
    first = channel_boot.send("quiet.silent")
    assert channel_boot.answer(first) == {"ok": True, "error": "", "out": 0}
    second = channel_boot.send("quiet.loud", {"n": 7})
    assert channel_boot.answer(second) == {"ok": True, "error": "", "out": 10}
    assert channel_boot.err == b"printed 7\n"
    third = channel_boot.send("quiet.boom")
    answer = channel_boot.answer(third)
    assert answer["ok"] is False
    assert answer["error"] == "ValueError: nope"
    assert channel_boot.err.startswith(b"printed 7\nTraceback")
    assert len(channel_boot.err) == answer["out"]


def test_raw_writes_and_child_processes_are_counted_in_order(
    channel_boot: ChannelBootstrap,
) -> None:
    nonce = channel_boot.send("quiet.raw")
    answer = channel_boot.answer(nonce)
    assert answer["ok"] is True
    assert channel_boot.err == b"raw one\nraw two\nfrom a child\n"
    assert answer["out"] == len(channel_boot.err)


def test_output_larger_than_a_pipe_is_all_counted(channel_boot: ChannelBootstrap) -> None:
    nonce = channel_boot.send("quiet.big")
    assert channel_boot.answer(nonce)["out"] == 300001
    assert channel_boot.err == b"y" * 300000 + b"\n"


def test_output_between_requests_counts_towards_the_next_answer(
    channel_boot: ChannelBootstrap,
) -> None:
    nonce = channel_boot.send("quiet.later")
    assert channel_boot.answer(nonce)["out"] == 0
    channel_boot.read_err(len(b"after the answer\n"))
    nonce = channel_boot.send("quiet.silent")
    assert channel_boot.answer(nonce)["out"] == len(b"after the answer\n")


def test_stdin_requests_are_answered_on_the_socket_too(channel_boot: ChannelBootstrap) -> None:
    nonce = channel_boot.send("quiet.loud", {"n": 1}, stdin=True)
    assert channel_boot.answer(nonce) == {"ok": True, "error": "", "out": 10}


def test_output_just_before_a_crash_is_kept_and_the_exit_code_too(
    channel_boot: ChannelBootstrap,
) -> None:
    channel_boot.send("quiet.crash")
    assert channel_boot.process.wait(timeout=10) == 7
    channel_boot.read_err(len(b"last words\n"))
    assert channel_boot.err == b"last words\n"


def test_the_deadline_ends_the_whole_process_by_its_signal(
    channel_app: Path, tmp_path: Path
) -> None:
    boot = ChannelBootstrap(channel_app, tmp_path / "relay.sock", RELAY_GRACE_S="0.1")
    try:
        boot.conn.sendall(request_line("n", "quiet.sleep", timeout_s=0.2))
        assert boot.process.wait(timeout=20) == -signal.SIGALRM
    finally:
        boot.close()


def test_the_bootstrap_exits_when_relay_closes_the_socket(
    channel_boot: ChannelBootstrap,
) -> None:
    channel_boot.conn.close()
    assert channel_boot.process.wait(timeout=10) == 0


def test_an_unusable_socket_is_reported_once_and_stdin_serves(channel_app: Path) -> None:
    boot = Bootstrap(channel_app, RELAY_CHANNEL=str(channel_app / "missing.sock"))
    try:
        first, _ = boot.call("quiet.silent")
        second, _ = boot.call("quiet.silent")
    finally:
        boot.close()
    assert first["ok"] is True
    assert "cannot connect to" in str(first["channel"])
    assert str(channel_app / "missing.sock") in str(first["channel"])
    assert second == {"id": "nonce2", "ok": True, "error": ""}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_handler_closing_its_output_leaves_the_relay_idle(
    channel_boot: ChannelBootstrap,
) -> None:
    nonce = channel_boot.send("quiet.close_output")
    assert channel_boot.answer(nonce)["ok"] is True
    nonce = channel_boot.send("quiet.silent")
    assert channel_boot.answer(nonce)["ok"] is True
    # the relay (the process started) saw its pipe end: it must not spin on it
    pid = channel_boot.process.pid
    before = _cpu_seconds(pid)
    time.sleep(0.5)
    assert _cpu_seconds(pid) - before < 0.25


def test_without_ctypes_every_answer_goes_through_the_relay(
    channel_app: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "no-ctypes"
    blocker.mkdir()
    (blocker / "ctypes.py").write_text("raise ImportError('no ctypes here')\n")
    boot = ChannelBootstrap(channel_app, tmp_path / "relay.sock", PYTHONPATH=str(blocker))
    try:
        first = boot.send("quiet.silent")
        assert boot.answer(first) == {"ok": True, "error": "", "out": 0}
        second = boot.send("quiet.loud", {"n": 3})
        assert boot.answer(second) == {"ok": True, "error": "", "out": 10}
        assert boot.err == b"printed 3\n"
    finally:
        boot.close()
