"""Every test the failure table names exists: a renamed or deleted test must not
leave a row claiming a proof it no longer has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r"`((?:unit|integration|e2e|contract)/[\w/]+\.py)::(\w+)`")


def test_every_test_named_in_the_failure_table_exists() -> None:
    table = (ROOT / "docs" / "failure-semantics.md").read_text()
    references = REFERENCE.findall(table)
    assert len(references) > 20  # the pattern still matches how rows cite their tests
    missing = [
        f"{path}::{name}"
        for path, name in references
        if not (ROOT / "tests" / path).is_file()
        or not re.search(rf"^(async )?def {name}\(", (ROOT / "tests" / path).read_text(), re.M)
    ]
    assert missing == []
