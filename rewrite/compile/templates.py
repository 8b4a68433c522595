"""Name and domain templates: ``"{class}"``, ``"pkg.{package}"``, ``"{class}_{index}"``.

Fields: ``class`` (class name), ``qualname`` (qualified class name), ``package`` (its top
package), ``module`` (its Python module), ``path`` (module path), ``name`` (the path with
dots as underscores), ``index`` (call index), ``value`` (tag value, split components only).
"""

from __future__ import annotations

import difflib
import string

from rewrite.errors import Diagnostic, RuleError
from rewrite.ir import ModuleCall
from rewrite.lang import Span

FIELDS = ("class", "qualname", "package", "module", "path", "name", "index", "value")
DEFAULT_NAME = "{class}"
DEFAULT_DOMAIN = "pkg.{package}"


def check_template(template: str, span: Span | None) -> str:
    """Validate the fields of a template; raises :class:`RuleError` with a suggestion."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise RuleError([Diagnostic("error", f"bad template {template!r}: {e}", span)]) from None
    for _, field_name, spec, conversion in parts:
        if field_name is None:
            continue
        if field_name not in FIELDS or spec or conversion:
            close = difflib.get_close_matches(field_name, FIELDS, n=1)
            hint = f"did you mean '{{{close[0]}}}'?" if close else "fields: " + ", ".join(
                "{" + f + "}" for f in FIELDS
            )
            raise RuleError(
                [Diagnostic("error", f"unknown template field {{{field_name}}} in {template!r}",
                            span, hint)]
            )
    return template


def call_fields(call: ModuleCall) -> dict[str, str]:
    """The template fields of a module call."""
    return {
        "class": call.class_name,
        "qualname": call.cls,
        "package": call.package,
        "module": call.cls.rsplit(".", 1)[0] if "." in call.cls else call.cls,
        "path": call.path,
        "name": call.path.replace(".", "_"),
        "index": str(call.index),
        "value": "",
    }


def render(template: str, fields: dict[str, str]) -> str:
    return template.format_map(fields)


_CLASS_FIELDS = frozenset(("class", "qualname", "package", "module"))
_PATH_FIELDS = frozenset(("path", "name"))


class Renderer:
    """Renders templates for many calls, once per distinct value of the fields they use."""

    def __init__(self) -> None:
        self._uses: dict[str, tuple[bool, bool, bool]] = {}
        self._memo: dict[tuple, str] = {}

    def _fields_used(self, template: str) -> tuple[bool, bool, bool]:
        used = self._uses.get(template)
        if used is None:
            names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            used = self._uses[template] = (
                bool(names & _CLASS_FIELDS), bool(names & _PATH_FIELDS), "index" in names
            )
        return used

    def __call__(self, template: str, call: ModuleCall) -> str:
        by_class, by_path, by_index = self._fields_used(template)
        key = (template, (call.cls or call.path) if by_class else None,  # "": by its path
               call.path if by_path else None, call.index if by_index else None)
        text = self._memo.get(key)
        if text is None:
            text = self._memo[key] = render(template, call_fields(call))
        return text
