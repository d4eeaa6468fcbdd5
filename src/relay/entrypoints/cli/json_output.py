"""``--json``: one documented, versioned JSON document per read command.

Every read command that takes ``--json`` prints exactly one JSON object on stdout,
with a ``"schema"`` field naming its shape and version (``relay.<kind>/1``). The
shapes are JSON Schema files under ``docs/schemas/<kind>.v1.json``, and
``tests/unit/test_json_schemas.py`` checks each command's output against its file.
A field is only ever added within a version; removing or retyping one is a new
version. Errors stay one line on stderr with a non-zero exit, as without ``--json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from relay.entrypoints.cli.common import out

SCHEMA_VERSION = 1

JsonFlag = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document (see docs/cli.md) instead of text."),
]
"""The one ``--json`` flag every read command declares: ``as_json: JsonFlag = False``."""


def schema_name(kind: str) -> str:
    """``relay.<kind>/1``: the ``schema`` field's value for a document kind."""
    return f"relay.{kind}/{SCHEMA_VERSION}"


def emit_json(kind: str, body: Mapping[str, Any]) -> None:
    """Print ``{"schema": "relay.<kind>/1", **body}`` as one line of JSON."""
    document = {"schema": schema_name(kind), **body}
    out(json.dumps(document, ensure_ascii=False, separators=(",", ":")))
