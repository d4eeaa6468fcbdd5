"""Both bootstraps send the handler's return value, bounded, in their answer
(plain subprocesses, no Docker; the socket answer path in the Python one too)."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from relay.adapters.docker.bootstraps import bootstrap_command, bootstrap_source
from relay.domain.execution import RESULT_MAX_BYTES
from tests.unit.bootstrap_driver import BootstrapProcess, write_app

NODE = shutil.which("node")
BIG = RESULT_MAX_BYTES + 100

PY_APP = f"""
import asyncio
def plain(event):
    return {{"echo": event, "n": 1}}
async def later(event):
    await asyncio.sleep(0)
    return [1, "two"]
def nothing(event):
    print("said")
def accented(event):
    return "caf\\u00e9"
def strange(event):
    return {{1, 2}}
def big(event):
    return "x" * {BIG}
def boom(event):
    raise ValueError("no value")
"""

NODE_APP = f"""
export function plain(event) {{ return {{ echo: event, n: 1 }}; }}
export async function later() {{ await null; return [1, 'two']; }}
export function nothing() {{ console.log('said'); }}
export function accented() {{ return 'caf\\u00e9'; }}
export function strange() {{ return 10n; }}
export function big() {{ return 'x'.repeat({BIG}); }}
export function boom() {{ throw new Error('no value'); }}
"""


class Watched(BootstrapProcess):
    """Asks for the return value, as ``relay function run``/``invoke`` do."""

    def call(
        self,
        handler: str,
        event: object = None,
        *,
        extra: Mapping[str, object] | None = None,
        **env: str,
    ) -> tuple[dict[str, object], str]:
        return super().call(handler, event, extra={"want_result": True, **(extra or {})}, **env)


def _python(tmp_path: Path) -> BootstrapProcess:
    app = write_app(tmp_path / "app", {"mod.py": PY_APP})
    _, source = bootstrap_source("python3.14")
    script = tmp_path / "bootstrap.py"
    script.write_bytes(source)
    argv = [sys.executable, *bootstrap_command("python3.14")[1:-1], str(script)]
    return Watched(argv, app, timeout_s=5)


def _node(tmp_path: Path) -> BootstrapProcess:
    if NODE is None:
        pytest.skip("no node on this host's PATH")
    app = write_app(tmp_path / "app", {"mod.mjs": NODE_APP})
    _, source = bootstrap_source("node24")
    script = tmp_path / "bootstrap.mjs"
    script.write_bytes(source)
    return Watched([NODE, str(script)], app, timeout_s=5)


@pytest.fixture(params=["python", "node"])
def boot(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BootstrapProcess]:
    process = _python(tmp_path) if request.param == "python" else _node(tmp_path)
    yield process
    process.close()


def test_delivery_does_not_ask_and_gets_no_value(boot: BootstrapProcess) -> None:
    answer, _ = boot.call("mod.plain", {"a": 1}, extra={"want_result": False})
    assert answer == {"id": "nonce1", "ok": True, "error": ""}


def test_a_json_return_value_is_sent_as_its_text(boot: BootstrapProcess) -> None:
    answer, _ = boot.call("mod.plain", {"a": 1})
    assert answer["ok"] is True
    assert json.loads(str(answer["result"])) == {"echo": {"a": 1}, "n": 1}
    assert "result_size" not in answer
    answer, _ = boot.call("mod.later")
    assert json.loads(str(answer["result"])) == [1, "two"]


def test_returning_nothing_sends_no_result(boot: BootstrapProcess) -> None:
    answer, output = boot.call("mod.nothing")
    assert answer == {"id": "nonce1", "ok": True, "error": ""}
    assert output == "said\n"


def test_the_text_is_ascii_and_what_is_not_json_is_shown_as_a_string(
    boot: BootstrapProcess,
) -> None:
    answer, _ = boot.call("mod.accented")
    assert answer["result"] == '"caf\\u00e9"'
    answer, _ = boot.call("mod.strange")
    assert isinstance(json.loads(str(answer["result"])), str)  # a repr / String()


def test_a_return_value_past_the_bound_is_cut_with_its_full_size(
    boot: BootstrapProcess,
) -> None:
    answer, _ = boot.call("mod.big")
    result = str(answer["result"])
    assert len(result) == RESULT_MAX_BYTES
    assert result.startswith('"xxx')
    assert answer["result_size"] == BIG + 2  # the quotes


def test_a_failure_carries_no_result(boot: BootstrapProcess) -> None:
    answer, _ = boot.call("mod.boom")
    assert answer["ok"] is False
    assert "result" not in answer


@pytest.mark.parametrize("name", ["python_bootstrap.py", "node_bootstrap.mjs"])
def test_each_bootstrap_repeats_the_domain_bound(name: str) -> None:
    # the bootstraps are standalone files: the bound is written in them again
    text = (Path(sys.modules["relay.adapters.docker.bootstraps"].__file__ or "").parent / name)
    found = re.search(r"RESULT_MAX_BYTES = (\d+) \* 1024", text.read_text())
    assert found is not None
    assert int(found.group(1)) * 1024 == RESULT_MAX_BYTES
