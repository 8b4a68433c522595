"""Shared fixtures: exported models are built once per session (export is the slow part)."""

from __future__ import annotations

import pytest
import torch

from tests import models


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
def staged_model():
    return models.staged()


@pytest.fixture(scope="session")
def staged_program(staged_model):
    return models.export(staged_model, preserve_meta=True)
