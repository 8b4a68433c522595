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


def test_torch_is_a_supported_range_not_a_pin():
    """A user with another supported torch keeps it: the requirement is a range that the
    releases we support satisfy, including the one the private APIs were checked with."""
    from packaging.requirements import Requirement
    from packaging.version import Version

    import torch

    from rewrite._private.torch_programs import CHECKED_WITH

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [torch_requirement] = [r for r in map(Requirement, dependencies) if r.name == "torch"]
    specifier = torch_requirement.specifier
    assert all(s.operator not in ("==", "===", "~=") for s in specifier), specifier
    for supported in ("2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.13.0", "2.14.1",
                      "2.15.0",
                      *CHECKED_WITH):
        assert specifier.contains(supported), (supported, specifier)
    assert specifier.contains(Version(torch.__version__).base_version)  # the one installed here
    assert not specifier.contains("2.8.0")  # before torch.onnx's metadata and dynamo=True export


def test_onnxruntime_is_asked_for_from_the_release_that_reads_the_exports_opset():
    """Every extra naming onnxruntime asks for the release the export's check names
    (:data:`rewrite.exporting.verify.MIN_ONNXRUNTIME`): older ones refuse opset 23."""
    from packaging.requirements import Requirement

    from rewrite.exporting.verify import MIN_ONNXRUNTIME

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    bounds = {str(r.specifier) for group in extras.values() for r in map(Requirement, group)
              if r.name == "onnxruntime"}
    assert bounds == {f">={MIN_ONNXRUNTIME}"}
