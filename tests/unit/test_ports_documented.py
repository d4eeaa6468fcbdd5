"""Every port of ``application/ports.py`` is accounted for in docs/testing.md ("A
contract suite per port"): its suite in the table, or why it needs none. A port
added without either is the fake-drifts-from-production gap issue 31 closed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import relay.application.ports

ROOT = Path(__file__).resolve().parents[2]


def ports() -> list[str]:
    tree = ast.parse(Path(relay.application.ports.__file__).read_text(encoding="utf-8"))
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(base) == "Protocol" for base in node.bases)
    ]


def section() -> str:
    text = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    start = text.index("### A contract suite per port")
    end = text.index("\n#", start + 1)
    return text[start:end]


def test_every_port_has_a_suite_or_a_reason() -> None:
    named = set(re.findall(r"`(\w+)`", section()))
    assert len(ports()) > 20
    assert [port for port in ports() if port not in named] == []


def test_every_suite_the_table_names_exists() -> None:
    for name in re.findall(r"`(test_\w+\.py)`", section()):
        assert (ROOT / "tests" / "contract" / name).is_file(), name
