"""``explain --html``: the explain data (``--json``'s, with the ONNX part) as one HTML page.

The page is self-contained: the CSS and the script are inline, and a Content-Security-Policy
allows nothing else (no request leaves it; only that CSS and that script, by hash, run). It
is rendered with jinja2 (``templates/report.html.j2``; autoescaping on: no hand-written
escaping) and written whole or not at all.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources
from pathlib import Path
from typing import Iterable

import jinja2

import rewrite
from rewrite.errors import InputError
from rewrite.files.outputs import check_output_path, write_text_atomic

SUFFIXES = (".html", ".htm")
OPEN_ALL_UP_TO = 60
"""Trees with at most this many groups open fully; larger ones show their top level."""


def check_report_path(output: str, inputs: Iterable[str | Path]) -> Path:
    """Raise :class:`InputError` unless ``output`` is an ``.html`` file that can be written
    (see :func:`rewrite.files.outputs.check_output_path`)."""
    path = check_output_path(output, inputs)
    if path.suffix.lower() not in SUFFIXES:
        raise InputError(f"{path}: the report is an HTML page; give a name ending in .html")
    return path


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("rewrite.cli", "templates"),
        autoescape=True, trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
    )


def _asset(name: str) -> str:
    return resources.files("rewrite.cli").joinpath("templates", name).read_text("utf-8")


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def render_report(data: dict, *, title: str, summary: str) -> str:
    """The page for ``data`` (what ``explain --json`` prints after lowering to ONNX)."""
    style, script = _asset("report.css"), _asset("report.js")
    onnx = data["onnx"]
    anchors = {f["function"]: f"fn{i}" for i, f in enumerate(onnx["functions"])}
    runs = {f["function"]: f["runs"] for f in onnx["functions"]}
    groups = _count(data["groups"])
    by_class: dict[str, list[dict]] = {}
    for variant in onnx["variants"]:
        by_class.setdefault(variant["class"], []).append(variant)
    return _environment().get_template("report.html.j2").render(
        data=data, onnx=onnx, title=title, summary=summary, version=rewrite.__version__,
        anchors=anchors, runs=runs, group_count=groups, open_all=groups <= OPEN_ALL_UP_TO,
        variants=by_class,
        style=style, script=script,  # inline, unescaped (they are ours), allowed by hash
        policy=f"default-src 'none'; style-src {_sha256(style)}; script-src {_sha256(script)}; "
               "img-src 'none'; base-uri 'none'; form-action 'none'",
    )


def _count(groups: list[dict]) -> int:
    return sum(1 + _count(g["children"]) for g in groups)


def write_report(output: Path, data: dict, *, title: str, summary: str) -> None:
    """Render and write the page (whole or not at all)."""
    write_text_atomic(output, render_report(data, title=title, summary=summary))


__all__ = ["check_report_path", "render_report", "write_report"]
