"""How ``function run`` and ``function invoke`` show a handler run: the text block
and the ``relay.function.run/1`` document (checked against its schema)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from relay.application.invoke import INVOKE_SHOWN_BUDGET, HandlerRun
from relay.domain.execution import CapturedOutput, InvocationResult
from relay.entrypoints.cli.fn_run_report import report_json, report_lines
from tests.json_schemas import assert_matches_schema


def shown(**fields: Any) -> dict[str, Any]:
    result = InvocationResult(**{"ok": True, "duration_s": 0.25, "image": "relay-fn-f:1", **fields})
    run: dict[str, Any] = msgspec.to_builtins(HandlerRun.of("mod.handler", result))
    return run


def document(run: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps({"schema": "relay.function.run/1", "function": "f", **report_json(run)})
    return assert_matches_schema(text)


def test_a_success_with_output_and_a_value() -> None:
    run = shown(output=("hello", "world"), result='{"a": 1}', result_size=8)
    assert report_lines(run) == [
        "handler: mod.handler",
        "image: relay-fn-f:1",
        "output:",
        "  hello",
        "  world",
        'returned: {"a": 1}',
        "duration: 0.250s",
    ]
    doc = document(run)
    assert (doc["returned"], doc["result"], doc["result_truncated"]) == (True, {"a": 1}, False)


def test_nothing_returned_and_nothing_printed() -> None:
    run = shown()
    assert "output: (none)" in report_lines(run)
    assert "returned: nothing" in report_lines(run)
    doc = document(run)
    assert (doc["returned"], doc["result"], doc["result_text"]) == (False, None, None)


def test_a_cut_value_says_so_and_is_not_parsed() -> None:
    run = shown(result='"xxxx', result_size=20000, output_dropped=3, output=("a",))
    lines = report_lines(run)
    assert 'returned: "xxxx... (cut at 5 of 20000 bytes)' in lines
    assert "  (3 more lines not kept)" in lines
    doc = document(run)
    assert (doc["result"], doc["result_text"], doc["result_truncated"]) == (None, '"xxxx', True)


def test_a_failure_shows_its_error_line() -> None:
    error = 'function "f" handler "mod.handler": ValueError: boom'
    run = shown(ok=False, error=error)
    assert f"error: {error}" in report_lines(run)
    assert not any(line.startswith("returned") for line in report_lines(run))
    assert document(run)["ok"] is False


def test_past_the_commands_budget_output_and_value_are_dropped_not_kept() -> None:
    big = InvocationResult(ok=True, output=("x" * 1000,) * 3, result="1", result_size=1)
    run = HandlerRun.of("mod.h", big)
    assert run.within(INVOKE_SHOWN_BUDGET) is run
    cut = run.within(100)
    assert (cut.output, cut.output_dropped, cut.result, cut.result_size) == ((), 3, None, 1)
    assert "returned: (not kept: over what one command shows)" in report_lines(
        msgspec.to_builtins(cut)
    )


def test_captured_output_keeps_lines_up_to_its_bound_then_counts() -> None:
    capture = CapturedOutput(max_bytes=10)
    for line in ("abcd", "efgh", "ij", "k"):  # 5 + 5 fill it; then nothing slips in
        capture.add(line)
    assert (capture.lines, capture.dropped) == (["abcd", "efgh"], 2)
