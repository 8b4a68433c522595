"""Bad models, bad output paths and grouping errors, as the command line reports them.

Every refusal: the documented exit code (2 unusable input, 1 grouping error), a one-line
reason naming the path (or ``file:line`` of the rule and the nodes), no traceback, no output
file (nor a temporary one) left behind, and the input unchanged.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import rewrite

ROOT = Path(__file__).resolve().parents[1]
GPT2_RULES = ROOT / "rules" / "gpt2.rules"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def assert_refused(r, code: int, first_line: str) -> None:
    """Exit ``code``, one line on stderr that starts with ``first_line``, nothing on stdout."""
    assert r.code == code, r
    assert r.out == "", r
    assert "Traceback" not in r.err
    lines = r.err.splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith(first_line), r.err


@pytest.fixture
def work(tmp_path, gpt2_pt2):
    """A folder with a copy of the GPT-2 program; returns (folder, model path)."""
    model = tmp_path / "gpt2.pt2"
    model.write_bytes(gpt2_pt2.read_bytes())
    return tmp_path, model


def apply_refused(run_cli, folder: Path, model: Path, output: Path, code: int, message: str,
                  rules: Path = GPT2_RULES):
    """``apply`` is refused: the message, no new file in ``folder``, the model unchanged."""
    before, model_digest = listing(folder), digest(model) if model.is_file() else None
    r = run_cli("apply", rules, model, "-o", output)
    assert_refused(r, code, message)
    assert listing(folder) == before
    if model_digest is not None:
        assert digest(model) == model_digest
    return r


# --- bad models --------------------------------------------------------------------------------


def _truncated(src: Path, dst: Path) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])
    return dst


def _foreign_zip(dst: Path) -> Path:
    with zipfile.ZipFile(dst, "w") as archive:
        archive.writestr("notes/readme.txt", "not a program")
    return dst


def _torch_save(dst: Path) -> Path:
    torch.save({"weight": torch.ones(2)}, dst)
    return dst


def with_program(src: Path, dst: Path, edit) -> Path:
    """A copy of the ``.pt2`` ``src`` whose program JSON is ``edit(json_text)`` (every other
    entry as it is, stored uncompressed: torch.export.save's layout)."""
    with zipfile.ZipFile(src) as archive, zipfile.ZipFile(dst, "w") as out:
        for info in archive.infolist():
            data = archive.read(info)
            if info.filename.endswith("/models/model.json"):
                data = edit(data.decode()).encode()
            out.writestr(info, data, compress_type=info.compress_type)
    return dst


def _unreadable_stack(src: Path, dst: Path) -> Path:
    """A node's ``nn_module_stack`` torch cannot split into (key, path, class) triples."""
    def edit(text: str) -> str:
        new = re.sub(r'"nn_module_stack": "[^"]*"', '"nn_module_stack": "h.0;h"', text, count=1)
        assert new != text
        return new
    return with_program(src, dst, edit)


BAD_MODELS = {  # file name: the reason printed after "<path>: "
    "truncated.pt2": "not a .pt2 archive (truncated, or not written by torch.export.save)",
    "foreign.pt2": "not a torch.export.save archive (no archive_format entry)",
    "saved.pt2": "a torch.save file, not a torch.export.save program",
    "empty.pt2": "empty file",
    "folder.pt2": "is a directory, expected a .pt2 or .onnx file",
    "missing.pt2": "no such file",
    "model.bin": "unknown model type '.bin'; expected .pt2",
    "noext": "unknown model type '(no extension)'",
    "junk.onnx": "not a readable ONNX model (",
    "corrupt.pt2": "torch.export.load cannot read it (a node of ",
}


def make_bad_model(name: str, folder: Path, good: Path) -> Path:
    """The bad model ``name`` of :data:`BAD_MODELS` in ``folder``; ``good`` is a valid .pt2."""
    path = folder / name
    if name == "truncated.pt2":
        _truncated(good, path)
    elif name == "foreign.pt2":
        _foreign_zip(path)
    elif name == "corrupt.pt2":
        _unreadable_stack(good, path)
    elif name == "saved.pt2":
        _torch_save(path)
    elif name == "empty.pt2":
        path.touch()
    elif name == "folder.pt2":
        path.mkdir()
    elif name == "model.bin":
        path.write_bytes(good.read_bytes())
    elif name == "noext":
        path.write_text("x")
    elif name == "junk.onnx":
        path.write_bytes(b"\x08\x07garbage" * 50)
    return path


@pytest.mark.parametrize("name", sorted(BAD_MODELS))
def test_bad_model_explain(run_cli, tmp_path, gpt2_pt2, name):
    model = make_bad_model(name, tmp_path, gpt2_pt2)
    r = run_cli("explain", GPT2_RULES, model)
    assert_refused(r, 2, f"{model}: {BAD_MODELS[name]}")


@pytest.mark.parametrize("name", ["truncated.pt2", "junk.onnx", "missing.pt2"])
def test_bad_model_apply_writes_nothing(run_cli, tmp_path, gpt2_pt2, name):
    model = make_bad_model(name, tmp_path, gpt2_pt2)
    apply_refused(run_cli, tmp_path, model, tmp_path / "out.onnx", 2,
                  f"{model}: {BAD_MODELS[name]}")


def test_truncated_onnx(run_cli, tmp_path, tiny_onnx):
    model = tmp_path / "cut.onnx"
    data = tiny_onnx.read_bytes()
    model.write_bytes(data[: len(data) * 2 // 3])
    apply_refused(run_cli, tmp_path, model, tmp_path / "out.onnx", 2,
                  f"{model}: not a readable ONNX model (")


def test_library_raises_input_error(tmp_path, gpt2_pt2):
    with pytest.raises(rewrite.InputError, match="not a .pt2 archive"):
        rewrite.apply(GPT2_RULES, make_bad_model("truncated.pt2", tmp_path, gpt2_pt2))


def test_real_process_prints_one_line(tmp_path):
    """``python -m rewrite`` as a user runs it: torch.export.load logs a traceback when it fails;
    it must not reach the terminal."""
    model = _foreign_zip(tmp_path / "foreign.pt2")
    proc = subprocess.run(
        [sys.executable, "-m", "rewrite", "explain", str(GPT2_RULES), str(model)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"{model}: {BAD_MODELS['foreign.pt2']}")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr


# --- a program without module structure ---------------------------------------------------------


class Plain(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2 + 1


@pytest.fixture(scope="module")
def plain_pt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("plain") / "plain.pt2"
    torch.export.save(torch.export.export(Plain(), (torch.randn(2, 4),)), str(path))
    return path


def test_no_module_stacks_works_with_a_warning(run_cli, plain_pt2):
    r = run_cli("explain", GPT2_RULES, plain_pt2)
    assert r.code == 0, r
    assert r.err.splitlines()[0] == (
        f"warning: {plain_pt2}: no module structure: no node carries nn_module_stack metadata, "
        "so group and flat rules have nothing to match and the result stays flat (tag and split "
        "rules still apply); export an nn.Module with torch.export.export to keep it"
    )
    assert "(no groups)" in r.out


def test_no_module_stacks_warns_from_the_library_too(plain_pt2):
    result = rewrite.apply(rewrite.load_rules("modularize"), plain_pt2)
    first = result.warnings[0]
    assert first.severity == "warning" and first.span is None
    assert first.message.startswith("no module structure: no node carries nn_module_stack")
    assert result.explain()["warnings"][0]["message"] == first.message


def test_no_module_stacks_apply(run_cli, plain_pt2, tmp_path):
    out = tmp_path / "plain.onnx"
    r = run_cli("apply", "modularize", plain_pt2, "-o", out)
    assert r.code == 0, r
    assert "no module structure" in r.err
    import numpy as np
    import onnx

    from tests.onnx_fixtures import run_onnx

    onnx.checker.check_model(str(out), full_check=True)
    x = torch.randn(2, 4)
    (got,) = run_onnx(str(out), (x,))
    np.testing.assert_allclose(got, Plain()(x).numpy(), atol=1e-6)


# --- bad output paths ---------------------------------------------------------------------------


def test_output_under_a_regular_file(run_cli, work):
    folder, model = work
    blocker = folder / "notes.txt"
    blocker.write_text("a file, not a folder")
    out = blocker / "out.onnx"
    apply_refused(run_cli, folder, model, out, 2,
                  f"{out}: cannot write there: {blocker} is a file, not a folder")
    assert blocker.read_text() == "a file, not a folder"


def test_output_in_a_missing_folder(run_cli, work):
    folder, model = work
    out = folder / "no" / "such" / "out.onnx"
    apply_refused(run_cli, folder, model, out, 2,
                  f"{out}: cannot write there: folder {out.parent} does not exist")


def test_output_is_the_input(run_cli, work):
    folder, model = work
    apply_refused(run_cli, folder, model, model, 2,
                  f"{model}: output path is the input {model}; refusing to overwrite it")


def test_output_is_the_input_onnx(run_cli, tmp_path, tiny_onnx):
    model = tmp_path / "tiny.onnx"
    model.write_bytes(tiny_onnx.read_bytes())
    spelled = tmp_path / "sub" / ".." / "tiny.onnx"
    (tmp_path / "sub").mkdir()
    apply_refused(run_cli, tmp_path, model, spelled, 2, f"{spelled}: output path is the input")


def test_output_is_a_hard_link_to_the_input(run_cli, work):
    folder, model = work
    link = folder / "same.onnx"
    link.hardlink_to(model)
    apply_refused(run_cli, folder, model, link, 2, f"{link}: output path is the input")


def test_output_is_the_rules_file(run_cli, work):
    folder, model = work
    rules = folder / "my.rules"
    rules.write_text("group class *GPT2Block\n")
    apply_refused(run_cli, folder, model, rules, 2, f"{rules}: output path is the input",
                  rules=rules)


def test_output_is_a_folder(run_cli, work):
    folder, model = work
    out = folder / "out.onnx"
    out.mkdir()
    apply_refused(run_cli, folder, model, out, 2, f"{out}: is a directory")


def test_output_is_a_device(run_cli, work):
    folder, model = work
    apply_refused(run_cli, folder, model, Path("/dev/null"), 2,
                  "/dev/null: exists and is not a regular file; refusing to replace it")
    assert Path("/dev/null").is_char_device()


def test_output_unknown_type(run_cli, work):
    folder, model = work
    out = folder / "out.txt"
    apply_refused(run_cli, folder, model, out, 2, f"{out}: unknown output type '.txt'; use .onnx")


def test_output_written_atomically(tmp_path):
    """A writer that fails half-way leaves neither the output nor a temporary file."""
    from rewrite.files.outputs import atomic_path

    out = tmp_path / "out.onnx"
    out.write_text("previous result")

    with pytest.raises(KeyboardInterrupt), atomic_path(out) as tmp:
        tmp.write_text("half")
        raise KeyboardInterrupt
    assert out.read_text() == "previous result"
    assert listing(tmp_path) == ["out.onnx"]


def test_output_mode_is_not_the_private_temp_mode(tmp_path):
    from rewrite.files.outputs import write_text_atomic

    out = tmp_path / "new.py"
    write_text_atomic(out, "x = 1\n")
    umask = os.umask(0)
    os.umask(umask)
    # what open() would make (0o666 less the umask), not the private 0o600 of a temp file
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


# --- grouping errors -----------------------------------------------------------------------------


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        h = h * 2
        return torch.relu(h)


class Interleaved(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blk = Inner()

    def forward(self, x):
        return self.blk(x) + 1


@pytest.fixture(scope="module")
def interleaved_pt2(tmp_path_factory):
    """``blk`` calls lin, mul, relu; the mul is re-labelled as another module's (as when an
    optimizer or a hand-edited program interleaves modules), so grouping ``blk`` alone would
    need data to leave the group and come back: a cycle."""
    program = torch.export.export(Interleaved().eval(), (torch.randn(2, 4),))
    mul = next(n for n in program.graph.nodes if n.target == torch.ops.aten.mul.Tensor)
    root = {k: v for k, v in mul.meta["nn_module_stack"].items() if v[0] == ""}
    mul.meta["nn_module_stack"] = {**root, "other": ("other", "tests.Other")}
    path = tmp_path_factory.mktemp("interleaved") / "interleaved.pt2"
    torch.export.save(program, str(path))
    return path


def test_cycle_names_rule_and_nodes(run_cli, tmp_path, interleaved_pt2):
    rules = tmp_path / "cycle.rules"
    rules.write_text("# blk alone cannot be outlined\ngroup path blk\n")
    before = listing(tmp_path)
    r = run_cli("apply", rules, interleaved_pt2, "-o", tmp_path / "out.onnx")
    assert r.code == 1, r
    assert "Traceback" not in r.err
    first, nodes = r.err.splitlines()[:2]
    assert first.startswith(f"{rules}:2: error: group blk cannot be outlined")
    assert nodes.startswith("  nodes involved: ")
    assert {"mul", "relu"} <= set(nodes.removeprefix("  nodes involved: ").split(", "))
    assert listing(tmp_path) == before
    assert run_cli("explain", rules, interleaved_pt2).code == 1


def test_flattening_the_other_way_resolves_the_cycle(run_cli, tmp_path, interleaved_pt2):
    rules = tmp_path / "ok.rules"
    rules.write_text("group path blk.lin\n")
    assert run_cli("explain", rules, interleaved_pt2).code == 0


def test_split_order_against_the_data_flow(run_cli, tmp_path, staged_pt2):
    rules = tmp_path / "split.rules"
    rules.write_text('include "gpt2.rules"\nsplit by stage order "decode", "encode"\n')
    r = run_cli("explain", rules, staged_pt2, "-q")
    assert r.code == 1, r
    first, nodes = r.err.splitlines()
    assert first.startswith(f"{rules}:2: error: the split order contradicts the data flow: ")
    assert nodes.startswith("  nodes involved: ")
    ok = tmp_path / "ok.rules"
    ok.write_text('split by stage order "encode", "decode"\n')
    assert run_cli("explain", ok, staged_pt2).code == 0


def test_split_order_missing_a_value(run_cli, tmp_path, staged_pt2):
    rules = tmp_path / "split.rules"
    rules.write_text('split by stage order "encode"\n')
    r = run_cli("explain", rules, staged_pt2)
    assert r.code == 1
    assert r.err.startswith(f"{rules}:1: error: node ")
    assert "which the split order does not list ('encode')" in r.err


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    """A small valid ONNX model (not from torch.onnx: no module metadata)."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
        initializer=[helper.make_tensor("unused", TensorProto.FLOAT, [64], [0.5] * 64)],
    )
    path = tmp_path_factory.mktemp("tiny") / "tiny.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_split_by_a_tag_no_node_has(run_cli, tmp_path, gpt2_pt2):
    r = run_cli("explain", "split_by_tags", gpt2_pt2)
    assert r.code == 1
    assert r.err.splitlines() == [f"{_split_file('split_by_tags')}:5: error: no node has the tag "
                                  "'stage' to split by"]


def test_reserved_onnx_domain_names_the_rule(run_cli, tmp_path, gpt2_pt2):
    rules = tmp_path / "domain.rules"
    rules.write_text('group class *GPT2MLP domain "ai.onnx"\n')
    before = listing(tmp_path)
    r = run_cli("apply", rules, gpt2_pt2, "-o", tmp_path / "out.onnx", "-q")
    assert r.code == 1, r
    assert r.err.startswith(
        f"{rules}:1: error: group h.0.mlp: function domain 'ai.onnx' is reserved")
    assert listing(tmp_path) == before


def _split_file(name: str) -> str:
    """How a shipped rules file is named in diagnostics (relative to the working folder)."""
    return rewrite.load_rules(name).split.origin.rsplit(":", 1)[0]


def test_onnx_without_module_metadata_works_with_a_warning(run_cli, tmp_path, tiny_onnx):
    model = tmp_path / "tiny.onnx"
    model.write_bytes(tiny_onnx.read_bytes())
    before = digest(model)
    r = run_cli("apply", "modularize", model, "-o", tmp_path / "out.onnx")
    assert r.code == 0, r
    assert r.err.startswith(f"warning: {model}: no module structure: no node carries torch.onnx "
                            "module metadata (pkg.torch.onnx.name_scopes)")
    assert digest(model) == before
    assert listing(tmp_path) == ["out.onnx", "tiny.onnx"]


# --- bad rules files ------------------------------------------------------------------------------


def test_unusable_rules_file_is_an_input_error(run_cli, tmp_path, gpt2_pt2):
    cases = {
        tmp_path / "missing.rules": "no such rules file",
        tmp_path: "is a directory, expected a .rules file",
    }
    for rules, reason in cases.items():
        for argv in (("check", rules), ("explain", rules, gpt2_pt2)):
            assert_refused(run_cli(*argv), 2, f"{rules}: {reason}")


def test_rules_file_that_is_not_utf8_is_an_error_at_the_first_bad_byte(run_cli, tmp_path,
                                                                        gpt2_pt2):
    """Latin-1 text (an editor's default) in a UTF-8 file: where, as far as the line decodes."""
    rules = tmp_path / "latin1.rules"
    rules.write_bytes("group class *GPT2Block\nflat path h.0  # caf\u00e9\n".encode("latin-1"))
    for argv in (("check", rules), ("explain", rules, gpt2_pt2), ("apply", rules, gpt2_pt2,
                                                                   "-o", tmp_path / "out.onnx")):
        r = run_cli(*argv)
        assert r.code == 1, r
        assert r.err.splitlines() == [
            f"{rules}:2:21: error: not UTF-8 text: invalid continuation byte 0xe9",
            "    flat path h.0  # caf",
            "    " + " " * 20 + "^",
            "  save the file as UTF-8",
        ]
    assert listing(tmp_path) == ["latin1.rules"]
    binary = tmp_path / "binary.rules"
    binary.write_bytes(b"\xef\xbb\xbf\xff\xfe\x00group any")  # after a BOM, the first byte
    r = run_cli("check", binary)
    assert r.code == 1
    assert r.err.splitlines()[0] == f"{binary}:1:1: error: not UTF-8 text: invalid start byte 0xff"


def test_missing_include_is_a_rules_error_at_the_include(run_cli, tmp_path):
    rules = tmp_path / "main.rules"
    rules.write_text('group class *X\ninclude "nowhere.rules"\n')
    r = run_cli("check", rules)
    assert r.code == 1
    assert r.err.splitlines()[0] == (
        f"{rules}:2:1: error: cannot include 'nowhere.rules': no such rules file")


def test_rules_file_with_bom_and_crlf(run_cli, tmp_path):
    """Saved by a Windows editor: a UTF-8 byte-order mark and CRLF line ends are fine."""
    rules = tmp_path / "windows.rules"
    rules.write_bytes(b"\xef\xbb\xbfgroup class *GPT2Block\r\nflat class *Dropout\r\n")
    r = run_cli("check", rules)
    assert (r.code, r.err) == (0, ""), r
    bad = tmp_path / "bad.rules"
    bad.write_bytes(b"\xef\xbb\xbfgroup class *GPT2Block\r\ngroup clas *X\r\n")
    r = run_cli("check", bad)
    assert r.code == 1
    assert r.err.splitlines()[:3] == [
        f"{bad}:2:7: error: unknown selector 'clas'; a selector is path, class, op, a tag test "
        '(key == "value", key != "value", has key), any, not, or (...)',
        "    group clas *X",
        "          ^",
    ]
