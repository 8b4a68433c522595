"""Every package of the source tree is listed in pyproject.toml (or a built wheel lacks it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "rewrite").rglob("__init__.py")
    }
    assert on_disk - listed == set()
    mapped = config["package-dir"]
    assert (ROOT / mapped["rewrite.grammar"] / "rules.lark").is_file()
    assert any((ROOT / mapped["rewrite.library"]).glob("*.rules"))
