"""The broker is chosen once: the entrypoints ask ``open_admin_broker`` (or the
worker's ``open_broker``) and never branch on ``broker.embedded`` themselves,
except where the settings are parsed (issue 31, "done when")."""

from __future__ import annotations

from pathlib import Path

import relay.entrypoints

ROOT = Path(relay.entrypoints.__file__).parent


def test_entrypoints_branch_on_the_broker_in_one_place_at_most() -> None:
    places = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "broker.embedded" in line
    ]
    assert len(places) <= 1, places
