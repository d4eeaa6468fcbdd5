"""Discovery: the functions directory as a list of candidate functions.

Each direct subdirectory is a candidate named after the directory; it is a
function once it holds a ``template.yaml``. Names are not judged here (the
reconciler validates and reports them), except that hidden directories such as
``.git`` are never candidates. Nothing here writes into the functions directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from relay.adapters.fs.templates import TEMPLATE_FILE, load_template
from relay.application.ports import DiscoveredFunction
from relay.domain.template import Template


def scan(functions_dir: Path) -> list[DiscoveredFunction]:
    """Every non-hidden direct subdirectory, sorted by name. Raises ``OSError``
    when the functions directory itself is missing or unreadable: that is not the
    same as "no functions" and must never remove what serves."""
    entries = list(os.scandir(functions_dir))
    found: list[DiscoveredFunction] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            is_dir = entry.is_dir()  # follows a symlinked function directory
        except OSError:
            continue
        if is_dir:
            directory = Path(entry.path)
            found.append(
                DiscoveredFunction(
                    name=entry.name,
                    directory=str(directory),
                    has_template=(directory / TEMPLATE_FILE).is_file(),
                )
            )
    return sorted(found, key=lambda f: f.name)


class FsFunctionSource:
    """The ``FunctionSource`` port over a local functions directory."""

    def __init__(self, functions_dir: Path) -> None:
        self.functions_dir = functions_dir

    def scan(self) -> list[DiscoveredFunction]:
        return scan(self.functions_dir)

    def directory_of(self, name: str) -> str:
        return str(self.functions_dir / name)

    def load_template(self, directory: str) -> Template | None:
        path = Path(directory) / TEMPLATE_FILE
        if not path.is_file():
            return None
        return load_template(path)
