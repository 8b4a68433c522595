"""Structure locks as a user sees them: ``rewrite lock`` writes one, ``rewrite verify`` and
``rewrite diff`` say what moved (exit 1) or nothing (exit 0), bad input exits 2 with one line,
and ``rewrite.testing.assert_structure`` fails with the same diff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import rewrite

from rewrite.testing import assert_structure
from tools import models

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "tests" / "locks" / "gpt2-12.lock"
RULES = 'group class *Block domain "pkg.mymodels"\ngroup class *MLP domain "pkg.mymodels"\n'


class MLP(nn.Module):
    def __init__(self, act: nn.Module):
        super().__init__()
        self.up, self.act, self.down = nn.Linear(16, 32), act, nn.Linear(32, 16)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self, act: nn.Module, extra: bool):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(16), MLP(act)
        self.scale = nn.Parameter(torch.ones(16)) if extra else None

    def forward(self, x):
        y = x + self.mlp(self.norm(x))
        return y * self.scale if self.scale is not None else y


class Blocks(nn.Module):
    """Four blocks with a ReLU; ``sigmoid_at``: that block has a Sigmoid instead; ``extra``:
    every block reads one more parameter (its function one more input)."""

    def __init__(self, sigmoid_at: int | None = None, extra: bool = False):
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(nn.Sigmoid() if i == sigmoid_at else nn.ReLU(), extra) for i in range(4))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture(scope="module")
def blocks(tmp_path_factory) -> dict[str, Path]:
    """``rules``, and ``.pt2`` files: ``base``, ``sigmoid`` (block 2), ``extra`` (an input)."""
    folder = tmp_path_factory.mktemp("blocks")
    paths = {"rules": folder / "blocks.rules"}
    paths["rules"].write_text(RULES)
    for name, model in (("base", Blocks()), ("sigmoid", Blocks(sigmoid_at=2)),
                        ("extra", Blocks(extra=True))):
        program = torch.export.export(models.perturb(model.eval()), (torch.randn(2, 16),))
        paths[name] = folder / f"{name}.pt2"
        torch.export.save(program, str(paths[name]))
    return paths


@pytest.fixture(scope="module")
def base_lock(blocks, tmp_path_factory) -> Path:
    from rewrite.cli.main import main

    lock = tmp_path_factory.mktemp("lock") / "blocks.lock"
    assert main(["-q", "lock", str(blocks["rules"]), str(blocks["base"]), "-o", str(lock)]) == 0
    return lock


@pytest.mark.slow  # a 12-block GPT-2 in processes
def test_gpt2_lock_verifies_and_is_the_same_bytes_in_another_process(run_cli, tmp_path):
    """The 12-block GPT-2's lock is ``tests/locks/gpt2-12.lock`` byte for byte, on every
    supported torch (``make matrix`` runs this on each; made with 2.13, the same with 2.9.1),
    and again in a second process."""
    program = models.export(models.gpt2(n_layer=12))
    pt2 = tmp_path / "gpt2.pt2"
    torch.export.save(program, str(pt2))
    lock = tmp_path / "gpt2.lock"
    assert run_cli("lock", "gpt2", pt2, "-o", lock).code == 0
    assert lock.read_bytes() == COMMITTED.read_bytes(), run_cli(
        "verify", "gpt2", pt2, "--lock", COMMITTED).out
    text = lock.read_text()
    assert "[function pkg.transformers::GPT2Block]\ncall_sites = 12\nruns = 12\n" in text
    assert "[rule group class *GPT2Block]\ngroups = 12: h.0, h.1, " in text
    assert str(tmp_path) not in text and "/" + "work" not in text  # no paths
    r = run_cli("verify", "gpt2", pt2, "--lock", lock)
    assert (r.code, r.out) == (0, "")
    assert "the structure matches" in r.err
    again = tmp_path / "again.lock"
    subprocess.run([sys.executable, "-m", "rewrite", "-q", "lock", "gpt2", str(pt2), "-o",
                    str(again)], check=True, cwd=ROOT)
    assert again.read_bytes() == lock.read_bytes()


def test_a_changed_activation_names_the_new_functions_and_why(run_cli, blocks, base_lock):
    r = run_cli("verify", blocks["rules"], blocks["sigmoid"], "--lock", base_lock)
    assert r.code == 1
    assert r.out.splitlines()[1:3] == [
        "  class pkg.mymodels::Block: 1 function -> 2 (Block x3, Block_1 x1)",
        "  class pkg.mymodels::MLP: 1 function -> 2 (MLP x3, MLP_1 x1)"]
    assert "  function pkg.mymodels::MLP_1: added\n" in r.out
    assert "      + ops = Gemm 2, Sigmoid 1\n" in r.out
    assert "      why distinct: MLP_1 vs MLP: op: Sigmoid at " in r.out
    assert "  function pkg.mymodels::MLP: changed\n      runs: 4 -> 3\n" in r.out
    assert "calls: pkg.mymodels::Block 4 -> 3, pkg.mymodels::Block_1 0 -> 1" in r.out
    assert r.err.strip().endswith("accept it with --update")


def test_an_added_input_names_the_function_and_the_input(run_cli, blocks, base_lock):
    r = run_cli("verify", blocks["rules"], blocks["extra"], "--lock", base_lock)
    assert r.code == 1
    lines = r.out.splitlines()
    assert lines[1:3] == ["  function pkg.mymodels::Block: changed",
                          "      inputs: 7 -> 8, input 7: float:r1 added"]
    assert "      ops: Mul 0 -> 1" in lines
    assert not any("MLP" in line for line in lines)  # the MLP did not move


def test_a_renamed_rule_shows_as_rule_and_function_changes(run_cli, blocks, base_lock,
                                                            tmp_path):
    renamed = tmp_path / "renamed.rules"
    renamed.write_text(RULES.replace("*Block ", '*Block as "Layer" '))
    r = run_cli("verify", renamed, blocks["base"], "--lock", base_lock)
    assert r.code == 1
    for line in ('  rule group class *Block domain "pkg.mymodels": removed',
                 '  rule group class *Block as "Layer" domain "pkg.mymodels": added',
                 "  function pkg.mymodels::Block: removed",
                 "  function pkg.mymodels::Layer: added"):
        assert line in r.out.splitlines()


def test_comments_and_rule_order_do_not_move_the_lock(run_cli, blocks, base_lock, tmp_path):
    edited = tmp_path / "edited.rules"
    first, second = RULES.splitlines()
    edited.write_text(f"# my blocks\n\n{second}   # the MLP first now\n\n"
                      f"# and then\n{first.replace(' domain', '  domain')}\n")
    r = run_cli("verify", edited, blocks["base"], "--lock", base_lock)
    assert (r.code, r.out) == (0, "")


def test_two_rules_on_one_line_lock_as_two_texts(run_cli, blocks, base_lock, tmp_path):
    """Each rule's text ends where its statement ends: the two rules of ``RULES`` written on
    one line (a comment after them) lock as the two lines did."""
    one_line = tmp_path / "one-line.rules"
    one_line.write_text(" ".join(RULES.splitlines()) + "  # both\n")
    lock = tmp_path / "one-line.lock"
    assert run_cli("lock", one_line, blocks["base"], "-o", lock).code == 0
    rules = [line for line in lock.read_text().splitlines() if line.startswith("[rule ")]
    assert rules == ['[rule group class *Block domain "pkg.mymodels"]',
                     '[rule group class *MLP domain "pkg.mymodels"]']
    r = run_cli("verify", one_line, blocks["base"], "--lock", base_lock)
    assert (r.code, r.out) == (0, "")


def test_an_onnx_file_as_it_is_and_diff(run_cli, blocks, base_lock, tmp_path):
    onnx = {}
    for name in ("base", "sigmoid"):
        onnx[name] = tmp_path / f"{name}.onnx"
        assert run_cli("-q", "apply", blocks["rules"], blocks[name], "-o", onnx[name]).code == 0
    r = run_cli("verify", onnx["base"], "--lock", base_lock)  # rules are not in the file
    assert (r.code, r.out) == (0, "")
    assert run_cli("diff", onnx["base"], onnx["base"]).code == 0
    r = run_cli("diff", onnx["base"], onnx["sigmoid"])
    assert r.code == 1
    assert "  function pkg.mymodels::MLP_1: added" in r.out.splitlines()
    assert "      why distinct: MLP_1 vs MLP: op: Sigmoid at " in r.out  # read from the file
    r = run_cli("diff", blocks["base"], blocks["extra"], "--rules", blocks["rules"])
    assert r.code == 1 and "  function pkg.mymodels::Block: changed" in r.out


def test_update_rewrites_the_lock(run_cli, blocks, base_lock, tmp_path):
    lock = tmp_path / "copy.lock"
    lock.write_bytes(base_lock.read_bytes())
    r = run_cli("verify", blocks["rules"], blocks["sigmoid"], "--lock", lock, "--update")
    assert r.code == 0 and "updated" in r.err
    assert "[function pkg.mymodels::MLP_1]" in lock.read_text()
    assert run_cli("verify", blocks["rules"], blocks["sigmoid"], "--lock", lock).code == 0


@pytest.mark.parametrize("case", ["missing lock", "malformed lock", "not a lock",
                                  "missing model", "pt2 without rules", "garbage onnx"])
def test_bad_input_exits_2_with_one_line(run_cli, blocks, base_lock, tmp_path, case):
    lock, model, rules = base_lock, blocks["base"], [blocks["rules"]]
    if case == "missing lock":
        lock = tmp_path / "none.lock"
        expected = f"{lock}: no such lock file"
    elif case == "malformed lock":
        lock = tmp_path / "bad.lock"
        lines = base_lock.read_text().splitlines()
        lines[6] = "inputs: 1"
        lock.write_text("\n".join(lines))
        expected = f"{lock}:7: malformed lock: expected 'key = value', got 'inputs: 1'"
    elif case == "not a lock":
        lock = tmp_path / "notes.lock"
        lock.write_text("# a comment\nsection = 1\n")
        expected = f"{lock}:1: malformed lock: no 'format = 1' line"
    elif case == "missing model":
        model = tmp_path / "none.pt2"
        expected = f"{model}: no such file"
    elif case == "pt2 without rules":
        rules = []
        expected = f"{model}: a .pt2 is read with rules"
    else:
        rules, model = [], tmp_path / "garbage.onnx"
        model.write_bytes(b"\x08\x07 not protobuf at all \xff" * 4)
        expected = f"{model}: not a readable ONNX model ("
    r = run_cli("verify", *rules, model, "--lock", lock)
    assert (r.code, r.out) == (2, "")
    assert len(r.err.strip().splitlines()) == 1 and r.err.startswith(expected)


def test_assert_structure(blocks, base_lock, tmp_path):
    assert_structure(blocks["base"], base_lock, rules=blocks["rules"])
    assert_structure(rewrite.apply(blocks["rules"], blocks["base"]), base_lock)  # a Result
    with pytest.raises(AssertionError) as failed:
        assert_structure(blocks["sigmoid"], base_lock, rules=blocks["rules"])
    assert "  function pkg.mymodels::MLP_1: added" in str(failed.value).splitlines()
    written = tmp_path / "new.lock"
    with pytest.raises(AssertionError, match="no lock file"):
        assert_structure(blocks["base"], written, rules=blocks["rules"])
    assert_structure(blocks["base"], written, rules=blocks["rules"], update=True)
    assert written.read_bytes() == base_lock.read_bytes()
