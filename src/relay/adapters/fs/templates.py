"""Read ``template.yaml`` files: YAML decoding with size and depth caps.

YAML lives here, in an adapter, so the domain never imports a parser. A YAML syntax
error becomes a :class:`TemplateError` with one line naming ``file:line``.
"""

from __future__ import annotations

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
    """Validate template YAML given as text; ``source`` names it in error lines."""
    return parse_template(decode_yaml(text, source))


def decode_yaml(text: str, source: str = TEMPLATE_FILE) -> object:
    """``yaml.safe_load`` with the size and nesting-depth caps."""
    if len(text.encode("utf-8", errors="replace")) > MAX_TEMPLATE_BYTES:
        raise TemplateError([f"{source}: is larger than {MAX_TEMPLATE_BYTES // 1024} KiB"])
    try:
        loader = _DepthLimitedLoader(text)
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
