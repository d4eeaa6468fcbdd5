"""Check a ``--json`` document against its schema file in ``docs/schemas``.

The document's own ``schema`` field (``relay.<kind>/<version>``) names the file
(``docs/schemas/<kind>.v<version>.json``), so a test cannot check a document
against the wrong shape, and a command that drops or renames its schema fails.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"
_NAME = re.compile(r"relay\.(?P<kind>[a-z][a-z0-9_.-]*)/(?P<version>[1-9][0-9]*)")


@cache
def load_schema(kind: str, version: int) -> dict[str, Any]:
    path = SCHEMAS / f"{kind}.v{version}.json"
    schema: dict[str, Any] = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def assert_matches_schema(text: str) -> dict[str, Any]:
    """Parse one command's whole stdout as one JSON document and validate it."""
    document = json.loads(text)
    assert isinstance(document, dict), f"not a JSON object: {text[:200]!r}"
    name = _NAME.fullmatch(str(document.get("schema", "")))
    assert name, f"missing or malformed 'schema' field: {document.get('schema')!r}"
    schema = load_schema(name["kind"], int(name["version"]))
    jsonschema.Draft202012Validator(schema).validate(document)
    return document
