"""Read ``template.yaml`` files: YAML decoding with size and depth caps.

YAML lives here, in an adapter, so the domain never imports a parser. A YAML syntax
error becomes a :class:`TemplateError` with one line naming ``file:line``; so do a
value PyYAML cannot construct (``2024-02-30``, an integer of more than 4,300 digits)
and a key given twice in one mapping (YAML would silently keep the last one).
Nothing else escapes: any other failure while loading one template is that
template's :class:`TemplateError`, never its caller's crash.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

from relay.domain.errors import TemplateError
from relay.domain.template import Template, parse_template

MAX_TEMPLATE_BYTES = 256 * 1024
MAX_TEMPLATE_DEPTH = 64
MAX_EXPANDED_NODES = 100_000
TEMPLATE_FILE = "template.yaml"


def load_template(path: Path) -> Template:
    """Read and validate ``path`` (a ``template.yaml``)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as exc:
        raise TemplateError([f"{path}: cannot be read ({exc.strerror or exc})"]) from exc
    if len(data) > MAX_TEMPLATE_BYTES:
        raise TemplateError([f"{path}: is larger than {MAX_TEMPLATE_BYTES // 1024} KiB"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TemplateError([f"{path}: is not UTF-8 text"]) from exc
    return load_template_text(text, str(path))


def load_template_text(text: str, source: str = TEMPLATE_FILE) -> Template:
    """Validate template YAML given as text; ``source`` names it in error lines.

    Raises :class:`TemplateError` and nothing else.
    """
    data = decode_yaml(text, source)
    try:
        return parse_template(data)
    except TemplateError:
        raise
    except Exception as exc:  # a validator bug is this template's error, no one else's
        raise TemplateError([f"{source}: cannot be validated ({type(exc).__name__})"]) from exc


def decode_yaml(text: str, source: str = TEMPLATE_FILE) -> object:
    """``yaml.safe_load`` with the size and nesting-depth caps."""
    if len(text.encode("utf-8", errors="replace")) > MAX_TEMPLATE_BYTES:
        raise TemplateError([f"{source}: is larger than {MAX_TEMPLATE_BYTES // 1024} KiB"])
    try:
        loader = _TemplateLoader(text)
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        reason = exc.problem or exc.context or "invalid YAML"
        raise TemplateError([f"{where}: invalid YAML: {reason}"]) from exc
    except yaml.YAMLError as exc:
        raise TemplateError([f"{source}: invalid YAML: {exc}"]) from exc
    except RecursionError as exc:
        raise TemplateError([f"{source}: nested too deeply"]) from exc
    except Exception as exc:  # a loader bug is this template's error, no one else's
        raise TemplateError([f"{source}: invalid YAML ({type(exc).__name__})"]) from exc
    _check_expanded_size(data, source)
    return data


class _DepthLimitedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses documents nested deeper than ``MAX_TEMPLATE_DEPTH``
    (and aliases expanding into huge structures are bounded by the size cap of the
    text plus this depth bound on composition)."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_TEMPLATE_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_TEMPLATE_DEPTH} levels", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_INT_TAG = "tag:yaml.org,2002:int"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _TemplateLoader(_DepthLimitedLoader):
    """The depth-limited SafeLoader, plus: a value it cannot construct is a located
    error (PyYAML raises a bare ``ValueError`` for ``2024-02-30`` or an integer past
    Python's 4,300-digit conversion limit, a ``KeyError`` for ``!!bool maybe``, an
    ``AttributeError`` for ``!!timestamp soon``), and so is a duplicate key."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def construct_object(self, node: yaml.Node, deep: bool = False) -> object:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # ValueError, KeyError, AttributeError, IndexError...
            raise yaml.constructor.ConstructorError(
                None, None, _unconstructable(node, exc), node.start_mark
            ) from exc

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Checked once per node, before the merge keys (``<<``) are flattened in:
        # a key a merge brings in may be overridden, a key written twice may not.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            _refuse_duplicate_keys(node)
        super().flatten_mapping(node)


def _unconstructable(node: yaml.Node, exc: Exception) -> str:
    text = node.value if isinstance(node, yaml.ScalarNode) else ""
    shown = json.dumps(text if len(text) <= 40 else text[:40] + "...")
    digits, limit = sum(ch.isdigit() for ch in text), sys.get_int_max_str_digits()
    if node.tag == _INT_TAG and digits > limit:
        return f"the integer {shown} has {digits} digits, more than the {limit} allowed"
    if node.tag == _TIMESTAMP_TAG:
        why = f" ({exc})" if isinstance(exc, ValueError) else ""
        return f"{shown} is not a valid date or time{why}; quote it to keep it as text"
    tag = node.tag.removeprefix("tag:yaml.org,2002:")
    return f"{shown} cannot be read as !!{tag} ({type(exc).__name__})"


def _refuse_duplicate_keys(node: yaml.MappingNode) -> None:
    first: dict[tuple[str, str], int] = {}
    for key_node, _value in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
            continue  # a complex key is refused later, as unhashable
        key = (key_node.tag, key_node.value)
        line = key_node.start_mark.line + 1
        if key in first:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {json.dumps(key_node.value)} (first at line {first[key]})",
                key_node.start_mark,
            )
        first[key] = line


def _check_expanded_size(data: object, source: str) -> None:
    """Aliases share objects, so a small file can stand for a huge tree (the "billion
    laughs"); validation walks the tree as if expanded, so bound that walk here."""
    budget = MAX_EXPANDED_NODES
    stack: list[tuple[object, int]] = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise TemplateError([f"{source}: expands to more than {MAX_EXPANDED_NODES} values"])
        if depth > MAX_TEMPLATE_DEPTH:
            raise TemplateError([f"{source}: nested deeper than {MAX_TEMPLATE_DEPTH} levels"])
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
            stack.extend((k, depth + 1) for k in node)
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


_FIELD_STEP = re.compile(r"\[(\d+)\]|\.?([^.\[\]]+)")


def field_line(text: str, field: str) -> int | None:
    """The 1-based line of ``field`` (a problem's path, ``events[0].pattern``) in the
    template ``text``, or of its deepest ancestor that is there (a missing key is
    reported where its parent is); ``None`` when the text does not compose as YAML.
    For ``relay function validate --format github``: an annotation on the line."""
    try:
        node: yaml.Node | None = yaml.compose(text, Loader=_DepthLimitedLoader)
    except Exception:  # noqa: BLE001 - a locator only: no line is the answer
        return None
    line = None if node is None else node.start_mark.line + 1
    for index, key in _FIELD_STEP.findall(field):
        found = _child(node, index, key)
        if found is None:
            break
        node, line = found
    return line


def _child(node: yaml.Node | None, index: str, key: str) -> tuple[yaml.Node, int] | None:
    if index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
        item = node.value[int(index)]
        return item, item.start_mark.line + 1
    if key and isinstance(node, yaml.MappingNode):
        for key_node, value in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value, key_node.start_mark.line + 1  # the key's line, as an editor
    return None
