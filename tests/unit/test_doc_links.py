"""The guide pages link to files and headings that exist.

The tutorial, troubleshooting index, concepts and upgrading pages are mostly links
into the reference pages and runbooks; a renamed heading there must fail here, not
leave a reader at the top of a long page. Anchors follow GitHub's rule: the heading
lower-cased, punctuation other than ``-`` and ``_`` dropped, spaces made ``-``.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    REPO / "README.md",
    *(REPO / "docs" / name for name in
      ("tutorial.md", "troubleshooting.md", "concepts.md", "upgrading.md")),
]  # fmt: skip
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(title: str) -> str:
    text = title.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = _FENCE.sub("", path.read_text())
    return frozenset(anchor(m["title"]) for m in _HEADING.finditer(text))


def links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text())
    return [m["target"] for m in _LINK.finditer(text) if "://" not in m["target"]]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    found = links(page)
    assert found
    for target in found:
        file_part, _, fragment = target.partition("#")
        path = (page.parent / file_part).resolve() if file_part else page
        assert path.exists(), f"{page.name}: {target} names no file"
        if fragment and path.suffix == ".md":
            assert fragment in anchors(path), f"{page.name}: {target} names no heading"


def test_the_anchor_rule_matches_githubs_on_known_headings() -> None:
    assert anchor("Backup and restore") == "backup-and-restore"
    assert anchor("Runbook: an event did not run") == "runbook-an-event-did-not-run"
    assert anchor("Editor support: the JSON Schema") == "editor-support-the-json-schema"
    assert anchor("On the embedded broker: `compose.embedded.yaml`") == (
        "on-the-embedded-broker-composeembeddedyaml"
    )
