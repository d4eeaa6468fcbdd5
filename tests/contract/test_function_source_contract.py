"""The FunctionSource contract, on the in-memory fake and on a functions directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from relay.adapters.fs.discovery import FsFunctionSource
from relay.application.ports import DiscoveredFunction, FunctionSource
from relay.domain.errors import TemplateError
from tests.fakes import InMemoryFunctionSource

VALID = """\
runtime: python3.14
events:
  - handler: events.created.handler
    pattern:
      event_name: [INSERT]
"""


class Bed:
    source: FunctionSource

    def add(self, name: str, template: str | None) -> None:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError

    def lose_root(self) -> None:
        raise NotImplementedError


class MemoryBed(Bed):
    def __init__(self) -> None:
        self.fake = InMemoryFunctionSource()
        self.source = self.fake

    def add(self, name: str, template: str | None) -> None:
        self.fake.functions[name] = template

    def delete(self, name: str) -> None:
        del self.fake.functions[name]

    def lose_root(self) -> None:
        self.fake.missing = True


class FsBed(Bed):
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self.source = FsFunctionSource(root)

    def add(self, name: str, template: str | None) -> None:
        directory = self.root / name
        directory.mkdir()
        (directory / "main.py").write_text("def handler(event, context): pass\n")
        if template is not None:
            (directory / "template.yaml").write_text(template)

    def delete(self, name: str) -> None:
        shutil.rmtree(self.root / name)

    def lose_root(self) -> None:
        shutil.rmtree(self.root)


@pytest.fixture(params=["memory", "fs"])
def bed(request: pytest.FixtureRequest, tmp_path: Path) -> Bed:
    return MemoryBed() if request.param == "memory" else FsBed(tmp_path / "functions")


def test_an_empty_directory_has_no_candidates(bed: Bed) -> None:
    assert bed.source.scan() == []


def test_scan_lists_candidates_sorted_and_says_which_have_a_template(bed: Bed) -> None:
    for name, template in (("zeta", VALID), ("alpha", None), ("Mid_Name", VALID)):
        bed.add(name, template)
    found = bed.source.scan()
    assert [(f.name, f.has_template) for f in found] == [
        ("Mid_Name", True), ("alpha", False), ("zeta", True)]
    assert all(f.directory == bed.source.directory_of(f.name) for f in found)
    assert all(isinstance(f, DiscoveredFunction) for f in found)


def test_a_hidden_directory_is_never_a_candidate(bed: Bed) -> None:
    bed.add(".git", VALID)
    bed.add("fn", VALID)
    assert [f.name for f in bed.source.scan()] == ["fn"]


def test_load_template_validates_and_absent_means_none(bed: Bed) -> None:
    bed.add("fn", VALID)
    bed.add("bare", None)
    template = bed.source.load_template(bed.source.directory_of("fn"))
    assert template is not None
    assert template.runtime == "python3.14"
    assert [e.handler for e in template.events] == ["events.created.handler"]
    assert bed.source.load_template(bed.source.directory_of("bare")) is None
    assert bed.source.load_template(bed.source.directory_of("never-there")) is None


def test_a_directory_gone_after_the_scan_loads_as_none(bed: Bed) -> None:
    bed.add("fn", VALID)
    [found] = bed.source.scan()
    bed.delete("fn")
    assert bed.source.load_template(found.directory) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("runtime: [unclosed\n", "{directory}/template.yaml:"),  # names the file
        ("runtime: cobol\n", "runtime"),
        ("runtime: python3.14\nruntime: node24\n", "runtime"),
    ],
)
def test_an_invalid_template_raises_one_template_error(bed: Bed, text: str, expected: str) -> None:
    bed.add("fn", text)
    with pytest.raises(TemplateError) as raised:
        bed.source.load_template(bed.source.directory_of("fn"))
    assert raised.value.problems
    assert expected.format(directory=bed.source.directory_of("fn")) in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_functions_directory_is_an_error_not_an_empty_list(bed: Bed) -> None:
    bed.add("fn", VALID)
    bed.lose_root()
    with pytest.raises(FileNotFoundError):
        bed.source.scan()
