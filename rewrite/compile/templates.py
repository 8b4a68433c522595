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
                [Diagnostic("error", f"unknown template field {{{field_name}}} in {template!r}", span, hint)]
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
