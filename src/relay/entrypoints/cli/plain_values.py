"""Plain ``str`` and ``int`` option values without building a pydantic validator.

typer (0.29) coerces every parameter value through a pydantic ``TypeAdapter``,
built on first use: running any command that takes a value imported pydantic and
built a schema (a tenth of ``relay publish``'s start-up). For the values Relay's
commands take, that coercion is the identity (a text that is valid UTF-8, a
flag's ``None`` or bool) or ``int()`` of plain decimal digits. Those take the
plain path here; every other value (a sign, ``_`` separators, a huge number,
undecodable bytes, another type) goes to typer's own coercion, built on demand,
so what a command accepts and every error it prints stay exactly typer's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from typer._click import Context
from typer._coercion import RuntimeParam, build_runtime_param
from typer.core import TyperArgument, TyperOption, _TyperParameter

_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]{0,17})")  # always int(text) under pydantic too


@dataclass(frozen=True)
class _Plain(RuntimeParam):
    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        if self.annotation is str and isinstance(value, str) and _utf8(value):
            return value
        if self.annotation is bool and isinstance(value, bool):
            return value
        if self.annotation is int and not isinstance(value, bool):
            if isinstance(value, int):
                return value
            if isinstance(value, str) and _DECIMAL.fullmatch(value):
                return int(value)
        return build_runtime_param(param.type_descriptor)._coerce_value(value, param, ctx)


def _utf8(value: str) -> bool:
    try:
        value.encode()  # a lone surrogate (undecodable argv bytes) is typer's case
    except UnicodeEncodeError:
        return False
    return True


def use_plain_values(param: Any) -> None:
    """Give ``param`` the plain path when its type is a bare ``str``, ``int`` or
    ``bool`` (typer's completion flags default to ``None``, which it coerces too)."""
    if not isinstance(param, (TyperOption, TyperArgument)):
        return
    descriptor = param.type_descriptor
    info = descriptor.parameter_info
    bare = info.parser is None and info.min is None and info.max is None
    single = not param.multiple and param.nargs == 1
    if bare and single and descriptor.annotation in (str, int, bool):
        param._runtime_param = _Plain(info, descriptor.annotation)
