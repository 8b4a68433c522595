"""Shared fixtures: exported and lowered models are built once per session (export and
lowering are the slow part), so once per pytest-xdist worker: a session fixture lives here,
never imported into test modules (each module importing it would build its own copy)."""

from __future__ import annotations

import pytest
import torch

import rewrite
from rewrite.backends.onnx import lower
from tests.onnx_fixtures import BERT_RULES, GPT2_RULES, LLAMA_RULES, MODULARIZE
from tools import models


@pytest.fixture(scope="session")
def gpt2_model():
    return models.gpt2()


@pytest.fixture(scope="session")
def gpt2_program(gpt2_model):
    return models.export(gpt2_model)


@pytest.fixture(scope="session")
def gpt2_pt2(gpt2_program, tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2") / "gpt2.pt2"
    torch.export.save(gpt2_program, str(path))
    return path


@pytest.fixture(scope="session")
def shared_model():
    return models.shared_and_list()


@pytest.fixture(scope="session")
def shared_program(shared_model):
    return models.export(shared_model)


@pytest.fixture(scope="session")
def shared_pt2(shared_program, tmp_path_factory):
    path = tmp_path_factory.mktemp("shared") / "shared.pt2"
    torch.export.save(shared_program, str(path))
    return path


@pytest.fixture(scope="session")
def llama_model():
    return models.llama()


@pytest.fixture(scope="session")
def llama_program(llama_model):
    return models.export(llama_model)


@pytest.fixture(scope="session")
def bert_model():
    return models.bert()


@pytest.fixture(scope="session")
def bert_program(bert_model):
    return models.export(bert_model)


@pytest.fixture(scope="session")
def staged_model():
    return models.staged()


@pytest.fixture(scope="session")
def staged_program(staged_model):
    return models.export(staged_model, preserve_meta=True)


@pytest.fixture(scope="session")
def staged_pt2(staged_program, tmp_path_factory):
    path = tmp_path_factory.mktemp("staged") / "staged.pt2"
    torch.export.save(staged_program, str(path))
    return path


# --- the same, lowered to ONNX (torch.onnx.export: seconds per model) ---------------------------


@pytest.fixture(scope="session")
def gpt2_lowered(gpt2_program):
    result = rewrite.apply(GPT2_RULES, gpt2_program)
    return result, lower(result)


@pytest.fixture(scope="session")
def llama_lowered(llama_program):
    result = rewrite.apply(LLAMA_RULES, llama_program)
    return result, lower(result)


@pytest.fixture(scope="session")
def bert_lowered(bert_program):
    result = rewrite.apply(BERT_RULES, bert_program)
    return result, lower(result)


@pytest.fixture(scope="session")
def shared_lowered(shared_program):
    result = rewrite.apply(MODULARIZE, shared_program)
    return result, lower(result)


# --- CLI -------------------------------------------------------------------------------------


class CliRun:
    """What one in-process ``rewrite`` run printed and returned."""

    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"CliRun(code={self.code}, out={self.out[:300]!r}, err={self.err[:600]!r})"


@pytest.fixture
def run_cli(capsys):
    """``run_cli("explain", rules, model)``: run ``rewrite`` in-process; a :class:`CliRun`."""
    from rewrite.cli.main import main

    def run(*argv) -> CliRun:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse: --version, --help, usage errors
            code = e.code if isinstance(e.code, int) else 0
        captured = capsys.readouterr()
        return CliRun(code, captured.out, captured.err)

    return run


# --- rewrite suggest: more model families -----------------------------------------------------


@pytest.fixture(scope="session")
def resnet_model():
    return models.resnet()


@pytest.fixture(scope="session")
def resnet_program(resnet_model):
    return models.export(resnet_model)


@pytest.fixture(scope="session")
def two_kinds_model():
    return models.two_block_kinds()


@pytest.fixture(scope="session")
def two_kinds_program(two_kinds_model):
    return models.export(two_kinds_model)


# --- a real browser (explain --html) -----------------------------------------------------------


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium over DevTools (``tools/browser.py``): Debian's package, which
    ``make browser`` installs (CI runs it); where it is missing, the test is skipped with the
    reason. A test never installs anything."""
    from tools.browser import Browser, find_chromium

    executable, why = find_chromium()
    if executable is None:
        pytest.skip(why)
    started = Browser(executable)
    yield started
    started.close()
