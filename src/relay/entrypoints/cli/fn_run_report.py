"""How ``relay function run`` and ``relay function invoke`` show one handler run.

Both print the same block per handler (from a ``HandlerRun`` as plain data:
``invoke`` gets it over the control socket) and ``run --json`` the same fields
(``docs/schemas/function.run.v1.json``). The return value is the JSON text the
bootstrap sent: shown as is, and parsed for ``--json`` when it is whole.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from relay.entrypoints.cli.common import out


def report_lines(run: Mapping[str, Any]) -> list[str]:
    """The text block of one handler run (no trailing blank line)."""
    lines = [f"handler: {run.get('handler', '')}"]
    if run.get("image"):
        lines.append(f"image: {run['image']}")
    output = [str(line) for line in run.get("output") or ()]
    dropped = int(run.get("output_dropped") or 0)
    lines.append("output:" if output or dropped else "output: (none)")
    lines += [f"  {line}" for line in output]
    if dropped:
        lines.append(f"  ({dropped} more line{'s' if dropped != 1 else ''} not kept)")
    if run.get("ok"):
        lines.append(f"returned: {returned_text(run)}")
    else:
        lines.append(f"error: {run.get('error', '')}")
    lines.append(f"duration: {float(run.get('duration_s') or 0.0):.3f}s")
    return lines


def returned_text(run: Mapping[str, Any]) -> str:
    result, size = run.get("result"), int(run.get("result_size") or 0)
    if result is None:
        return "(not kept: over what one command shows)" if size else "nothing"
    text = str(result)
    if size > len(text):
        return f"{text}... (cut at {len(text)} of {size} bytes)"
    return text


def print_report(run: Mapping[str, Any]) -> None:
    for line in report_lines(run):
        out(line)


def report_json(run: Mapping[str, Any]) -> dict[str, Any]:
    """The fields ``--json`` shows of one handler run."""
    result, size = run.get("result"), int(run.get("result_size") or 0)
    whole = result is not None and size <= len(str(result))
    value = _parsed(str(result)) if whole else None
    return {
        "handler": run.get("handler", ""),
        "ok": bool(run.get("ok")),
        "error": str(run.get("error") or ""),
        "duration_s": float(run.get("duration_s") or 0.0),
        "image": str(run.get("image") or ""),
        "output": [str(line) for line in run.get("output") or ()],
        "output_dropped": int(run.get("output_dropped") or 0),
        "returned": result is not None or size > 0,
        "result": value,
        "result_text": result,
        "result_truncated": result is not None and not whole,
        "result_size": size,
    }


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:  # never from a bootstrap; shown as the text it is
        return text
