"""The one error rule (docs/ARCHITECTURE.md, "Errors: one rule"): a library's verdict on the
input is exit 2, a library's crash exit 3 naming the library and its version, and a failure in
rewrite's own code exit 3 as a bug, even where torch.export traces that code; causes stay
chained for ``--verbose``. Each case is run through the command a user runs."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from tests import checkpoints


def _function_of(module: types.ModuleType, source: str) -> types.FunctionType:
    """A function compiled as if it were written in ``module`` (its frames name that module):
    a stand-in for a bug in that module's own code, without editing the installed file."""
    code = compile(source, module.__file__, "exec").co_consts[0]
    return types.FunctionType(code, vars(module))


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return checkpoints.write("llama", tmp_path_factory.mktemp("ckpt") / "llama")


def test_a_bug_in_rewrites_traced_forward_is_exit_3_not_the_models(llama, tmp_path, run_cli,
                                                                     monkeypatch):
    """``decode_forward`` is rewrite's code that torch.export traces: a shape error raised
    there is rewrite's bug (exit 3, "internal error"), not "torch.export could not export"."""
    from rewrite.exporting.checkpoint import cache

    broken = _function_of(cache, "def cache_keyword(model):\n"
                                 "    import torch\n"
                                 "    if 'forward' in vars(model):  # torch.export traces\n"
                                 "        return torch.ones(2) @ torch.ones(3)\n"
                                 "    return 'cache'\n")
    monkeypatch.setattr(cache, "cache_keyword", broken)
    r = run_cli("export", llama, "-o", tmp_path / "out.onnx")
    assert r.code == 3, r.err
    assert "internal error" in r.err and "this is a bug in rewrite" in r.err
    assert "torch.export could not export" not in r.err
    assert not list(tmp_path.iterdir())


def test_what_torch_export_rejects_in_the_model_is_exit_2(tmp_path, run_cli):
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # control flow on data: torch.export's verdict on the model
                return x + 1
            return x - 1

    import rewrite

    with pytest.raises(rewrite.InputError, match="torch.export could not export "
                                                 "DataDependent") as e:
        rewrite.export(DataDependent(), (torch.ones(2),), rules="modularize")
    assert e.value.__cause__ is not None  # torch's own exception, for --verbose


def test_a_crash_inside_torch_export_is_exit_3_naming_torch_and_its_version(monkeypatch):
    """An AttributeError raised by torch.export's own code (simulated: a function whose frames
    are torch.export's) is torch's bug, not the input's: a LibraryError, exit 3."""
    import torch.export as torch_export

    import rewrite
    from rewrite.errors import LibraryError

    crash = _function_of(torch_export, "def export(*args, **kwargs):\n"
                                       "    return None.graph\n")
    monkeypatch.setattr(torch.export, "export", crash)
    with pytest.raises(LibraryError) as e:
        rewrite.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),), rules="modularize")
    assert e.value.exit_code == 3
    assert f"torch.export {torch.__version__} failed exporting Linear" in str(e.value)
    assert isinstance(e.value.__cause__, AttributeError)


def test_a_pt2_that_torch_cannot_read_keeps_its_cause(tmp_path, gpt2_pt2, run_cli):
    """Refusals of a .pt2 chain what torch raised (``-v`` shows it): no ``from None``."""
    from rewrite.errors import InputError
    from rewrite.frontends.pt2.program import load_pt2
    import zipfile

    broken = tmp_path / "broken.pt2"
    with zipfile.ZipFile(gpt2_pt2) as src, zipfile.ZipFile(broken, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("models/model.json"):
                data = data.replace(b'"graph_module"', b'"graph_mod"', 1)
            dst.writestr(info, data, compress_type=zipfile.ZIP_STORED)
    with pytest.raises(InputError) as e:
        load_pt2(broken)
    assert e.value.__cause__ is not None
    r = run_cli("explain", "gpt2", broken, "-v")
    assert r.code == 2 and "Traceback" in r.err
