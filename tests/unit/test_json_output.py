"""The shared ``--json`` emitter: one line, one object, its schema named first."""

from __future__ import annotations

import json

import pytest

from relay.entrypoints.cli.json_output import emit_json, schema_name


def test_a_document_names_its_kind_and_version_first(capsys: pytest.CaptureFixture[str]) -> None:
    emit_json("health", {"status": "ok", "note": "é"})
    text = capsys.readouterr().out
    assert text.count("\n") == 1
    document = json.loads(text)
    assert list(document) == ["schema", "status", "note"]
    assert document == {"schema": "relay.health/1", "status": "ok", "note": "é"}
    assert schema_name("dlq.ls") == "relay.dlq.ls/1"
