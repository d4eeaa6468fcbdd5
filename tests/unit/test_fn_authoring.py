"""The helpers behind ``relay function validate`` / ``match``, without a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from relay.entrypoints.cli.fn_authoring import explain_matches
from relay.entrypoints.cli.fn_loading import PathNotFound, discover, load

TEMPLATE = "runtime: python3.14\nevents:\n  - handler: a.b\n    pattern: {t: [x]}\n"


def make(root: Path, name: str, text: str = TEMPLATE) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    (directory / "template.yaml").write_text(text)
    (directory / "a.py").write_text("def b(event):\n    pass\n")  # TEMPLATE's module
    return directory


def test_discover_a_function_directory_a_template_file_and_a_functions_directory(
    tmp_path: Path,
) -> None:
    one = make(tmp_path, "one")
    make(tmp_path, "two")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("")
    assert discover(one) == [("one", one)]
    assert discover(one / "template.yaml") == [("one", one)]
    assert discover(tmp_path) == [("one", one), ("two", tmp_path / "two")]


@pytest.mark.parametrize("what", ["missing", "file", "empty"])
def test_discover_refuses_paths_without_functions(tmp_path: Path, what: str) -> None:
    target = tmp_path / "x"
    if what == "file":
        target.write_text("")
    elif what == "empty":
        target.mkdir()
    with pytest.raises(PathNotFound):
        discover(target)


def test_load_collects_name_template_and_source_problems(tmp_path: Path) -> None:
    good = load("good", make(tmp_path, "good"))
    assert good.problems == ()
    assert good.template is not None
    bad = load("Bad", make(tmp_path, "Bad", "runtime: node24\nevents:\n  - handler: x.y\n"))
    assert bad.template is None
    assert bad.problems[0].startswith('invalid function name "Bad"')
    assert "events[0].pattern: is required (a map of field conditions)" in bad.problems


def test_explain_matches_lines(tmp_path: Path) -> None:
    loaded = [
        load("fn", make(tmp_path, "fn")),
        load("broken-one", make(tmp_path, "broken-one", "runtime: nope\n")),
    ]
    assert explain_matches(loaded, {"t": "x"}, 0.0) == [
        "match  fn          a.b",
        "skip   broken-one  invalid template (run: relay function validate)",
        "1 of 1 event rule matched",
    ]
    assert explain_matches(loaded[:1], {"t": "y"}, 0.0) == [
        'no     fn  a.b: pattern.t: "y" is not one of ["x"]',
        "0 of 1 event rule matched",
    ]


PY_RULES = (
    "runtime: python3.14\nevents:\n"
    "  - handler: events.created.handler\n    pattern: {t: [x]}\n"
    "  - handler: jobs.handler\n    pattern: {t: [y]}\n"
)
NODE_RULES = PY_RULES.replace("python3.14", "node24")


@pytest.mark.parametrize(
    ("template", "looked_for"),
    [
        (PY_RULES, "events/created.py, events/created/__init__.py"),
        (NODE_RULES, "events/created.mjs, events/created.js"),
    ],
)
def test_a_handler_module_that_does_not_exist_is_a_problem_in_both_runtimes(
    tmp_path: Path, template: str, looked_for: str
) -> None:
    directory = tmp_path / "fn"
    directory.mkdir()
    (directory / "template.yaml").write_text(template)
    loaded = load("fn", directory)
    assert loaded.template is None
    [problem] = loaded.problems  # the first missing module; the build refuses the same way
    assert problem.startswith("handler module 'events.created' not found (looked for ")
    assert looked_for in problem


def test_python_modules_may_be_files_of_a_namespace_package_or_packages(tmp_path: Path) -> None:
    directory = tmp_path / "fn"
    (directory / "events").mkdir(parents=True)  # no __init__.py: a namespace package
    (directory / "template.yaml").write_text(PY_RULES)
    (directory / "events" / "created.py").write_text("def handler(event):\n    pass\n")
    (directory / "jobs").mkdir()
    (directory / "jobs" / "__init__.py").write_text("def handler(event):\n    pass\n")
    assert load("fn", directory).problems == ()
    (directory / ".gitignore").write_text("jobs/\n")  # not in the image: not importable there
    [problem] = load("fn", directory).problems
    assert problem.startswith("handler module 'jobs' not found")
