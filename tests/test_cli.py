"""The command line as a user sees it: exit codes, what goes to stdout/stderr, the tree, JSON."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path


import rewrite

ROOT = Path(__file__).resolve().parents[1]
GPT2_RULES = ROOT / "rules" / "gpt2.rules"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


# --- basics ----------------------------------------------------------------------------------


def test_version(run_cli):
    r = run_cli("--version")
    assert r.code == 0
    assert r.out.startswith(f"rewrite {rewrite.__version__} (torch ")


def test_no_command_prints_help_and_exits_2(run_cli):
    r = run_cli()
    assert r.code == 2
    assert "usage: rewrite" in r.err and "check" in r.err and "exit codes" in r.err


def test_usage_error_exits_2_with_one_line(run_cli):
    r = run_cli("explain", GPT2_RULES)
    assert r.code == 2
    assert r.err.splitlines()[-1] == (
        "rewrite explain: error: the following arguments are required: MODEL"
    )


def test_check_ok_and_quiet(run_cli):
    r = run_cli("check", GPT2_RULES)
    assert (r.code, r.err) == (0, "")
    assert r.out.strip() == f"{GPT2_RULES}: ok (6 rules)"
    assert run_cli("check", GPT2_RULES, "-q").out == ""  # -q after the command too
    assert run_cli("-q", "check", GPT2_RULES).out == ""


def test_check_counts_included_files(run_cli, tmp_path):
    rules = tmp_path / "mine.rules"
    rules.write_text('include "gpt2.rules"\nflat class *Linear\n')
    r = run_cli("check", rules)
    assert r.code == 0
    assert r.out.strip() == f"{rules}: ok (7 rules from 2 files)"


def test_check_bad_rules_exit_1_with_diagnostics(run_cli, tmp_path):
    rules = tmp_path / "bad.rules"
    rules.write_text("group class *Block\ngroup clas *Attention\n")
    r = run_cli("check", rules)
    assert r.code == 1
    assert r.out == ""
    lines = r.err.splitlines()
    assert lines[0].startswith(f"{rules}:2:7: error: unknown selector 'clas'")
    assert lines[1:4] == ["    group clas *Attention", "          ^", "  did you mean 'class'?"]
    assert "Traceback" not in r.err


def test_check_library_name(run_cli):
    r = run_cli("check", "llama")
    assert r.code == 0 and ": ok (6 rules)" in r.out


def test_quiet_and_verbose_are_exclusive(run_cli):
    assert run_cli("-q", "-v", "check", GPT2_RULES).code == 2


# --- explain -----------------------------------------------------------------------------------


def test_explain_tree(run_cli, gpt2_pt2):
    r = run_cli("explain", GPT2_RULES, gpt2_pt2)
    assert r.code == 0, r
    lines = r.out.splitlines()
    assert lines[0] == f"{gpt2_pt2} by {GPT2_RULES}: GPT2Model: 162 nodes, 28 module calls"
    assert lines[1].split() == ["group", "class", "nodes", "function", "rule"]
    rows = {line.split()[0].lstrip("├└─│ "): line.split() for line in lines[2:-1]}
    rows.update({line.split()[1]: line.split() for line in lines[2:-1] if line[0] in "├└"})
    assert rows["h.0"] == ["h.0", "GPT2Block", "40", "pkg.transformers::GPT2Block",
                           "gpt2.rules:7"]
    assert rows["h.1.attn"] == ["├──", "h.1.attn", "GPT2Attention", "21",
                                "pkg.transformers::GPT2Attention", "gpt2.rules:8"]
    assert rows["h.1.mlp"][:2] == ["└──", "h.1.mlp"]
    assert rows["wpe"][3:] == ["pkg.torch::Embedding_wpe", "gpt2.rules:10"]
    assert re.fullmatch(r"9 groups, 6 function names; \d+ of \d+ operations outside any group",
                        lines[-1])
    # the shipped file has a `flat class *Dropout`, which the export keeps: no warnings
    assert r.err == ""


def test_explain_on_a_narrow_terminal_wraps_instead_of_cutting(run_cli, gpt2_pt2, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self: True))
    r = run_cli("explain", GPT2_RULES, gpt2_pt2, "-q")
    assert r.code == 0
    lines = ANSI.sub("", r.out).splitlines()
    assert "…" not in r.out
    assert max(len(line) for line in lines[1:-1]) <= 60  # title and summary lines never wrap
    words = " ".join(line.strip("│├└─ ") for line in lines).split()
    at = words.index("h.0.attn")
    assert words[at:at + 7] == ["h.0.attn", "GPT2Attention", "21", "nodes", "->",
                                "pkg.transformers::GPT2Attention", "gpt2.rules:8"]


def test_explain_depth_counts_hidden_groups(run_cli, gpt2_pt2):
    r = run_cli("explain", GPT2_RULES, gpt2_pt2, "--depth", "1")
    assert r.code == 0
    assert "h.0 (+2 nested)" in r.out
    assert "h.0.attn" not in r.out
    assert run_cli("explain", GPT2_RULES, gpt2_pt2, "--depth", "0").code == 2


def test_explain_json_keeps_its_keys(run_cli, gpt2_pt2):
    r = run_cli("explain", GPT2_RULES, gpt2_pt2, "--json")
    assert r.code == 0
    data = json.loads(r.out)
    assert {"graph", "groups", "top_level_nodes", "warnings", "model", "rules"} <= set(data)
    assert data["version"] == rewrite.__version__
    assert data["graph"] == {"kind": "fx", "root_class":
                             "transformers.models.gpt2.modeling_gpt2.GPT2Model", "nodes": 162,
                             "module_calls": 28}
    block = next(g for g in data["groups"] if g["id"] == "h.0")
    assert {"id", "kind", "path", "class", "call_index", "tag_value", "rule", "function",
            "domain", "nodes", "own_nodes", "children"} <= set(block)
    assert block["rule"].endswith("gpt2.rules:7")  # file:line, as the rules were loaded
    assert (block["function"], block["nodes"]) == ("GPT2Block", 40)
    assert [c["id"] for c in block["children"]] == ["h.0/h.0.attn", "h.0/h.0.mlp"]


def test_explain_verbose_shows_qualified_classes_and_timings(run_cli, gpt2_pt2):
    r = run_cli("-v", "explain", GPT2_RULES, gpt2_pt2)
    assert r.code == 0
    assert "transformers.models.gpt2.modeling_gpt2.GPT2Block" in r.out
    assert re.search(rf"reading {re.escape(str(gpt2_pt2))} and grouping it: \d+\.\ds", r.err)


def test_warnings_on_stderr_and_quiet_drops_them(run_cli, gpt2_pt2, tmp_path):
    rules = tmp_path / "some.rules"
    rules.write_text("group class *GPT2Block\ngroup class *NoSuchThing\n")
    r = run_cli("explain", rules, gpt2_pt2)
    assert r.code == 0
    assert r.err.splitlines()[0] == (
        f"{rules}:2:1: warning: group rule matches nothing in this model")
    assert "NoSuchThing" not in r.out
    quiet = run_cli("explain", rules, gpt2_pt2, "--quiet")
    assert quiet.code == 0 and quiet.err == "" and quiet.out == r.out


def test_diagnostics_are_not_wrapped_on_a_narrow_terminal(run_cli, gpt2_pt2, tmp_path,
                                                          monkeypatch):
    rules = tmp_path / ("a-rather-long-file-name-" * 3 + ".rules")
    rules.write_text("group class *GPT2Block\n" + "group class *NoSuchThingAtAll" + "X" * 60 + "\n")
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setattr("rich.console.Console.is_terminal", property(lambda self: True))
    r = run_cli("explain", rules, gpt2_pt2)
    assert r.code == 0
    lines = re.split(r"[\r\n]", ANSI.sub("", r.err))  # no colours, no spinner frames
    warning = f"{rules}:2:1: warning: group rule matches nothing in this model"
    assert warning in lines
    assert lines[lines.index(warning) + 1] == "    group class *NoSuchThingAtAll" + "X" * 60


def test_internal_errors_are_reported_as_bugs(run_cli, gpt2_pt2, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("boom\nsecond line")

    monkeypatch.setattr(rewrite, "apply", broken)
    r = run_cli("explain", GPT2_RULES, gpt2_pt2)
    assert r.code == 3
    assert r.err.splitlines() == [
        "rewrite: internal error: ValueError: boom",
        "  this is a bug in rewrite; rerun with --verbose for the traceback and report it",
    ]
    verbose = run_cli("explain", GPT2_RULES, gpt2_pt2, "-v")
    assert verbose.code == 3 and "Traceback" in verbose.err


# --- with the backends -------------------------------------------------------------------------


def test_explain_onnx_shows_functions_and_call_counts(run_cli, gpt2_pt2):
    r = run_cli("explain", GPT2_RULES, gpt2_pt2, "--onnx", "--json", "-q")
    assert r.code == 0, r
    groups = {}
    stack = list(json.loads(r.out)["groups"])
    while stack:
        g = stack.pop()
        groups[g["id"]] = g
        stack.extend(g["children"])
    assert (groups["h.0"]["onnx_function"], groups["h.0"]["onnx_calls"]) == (
        "pkg.transformers::GPT2Block", 2)
    assert groups["h.1/h.1.attn"]["onnx_calls"] == 2
    assert groups["ln_f"]["onnx_calls"] == 1


def test_tree_with_calls_hook(gpt2_program):
    """What ``explain --onnx`` prints: the function made and its call sites, or why none."""
    from rewrite.cli.render import FunctionUse, render_tree
    from rich.console import Console

    tree = rewrite.apply(GPT2_RULES, gpt2_program).tree
    calls = {"h.0": FunctionUse("pkg.transformers::GPT2Block", 2),
             "h.1": FunctionUse("pkg.transformers::GPT2Block", 2), "ln_f": None}
    console = Console(width=300, record=True, file=io.StringIO())
    console.print(render_tree(tree, calls=calls))
    lines = console.export_text().splitlines()
    rows = {line.split()[0]: line for line in lines[1:] if line.strip()}
    assert "GPT2Block x2" in rows["h.1"]
    assert "(inlined)" in rows["ln_f"]
    assert "(not in the ONNX graph)" in rows["wpe"]
    assert "function (ONNX) x call sites" in lines[0]


def test_apply_onnx(run_cli, gpt2_pt2, tmp_path):
    import onnx

    out = tmp_path / "gpt2.onnx"
    r = run_cli("apply", GPT2_RULES, gpt2_pt2, "-o", out, "-v")
    assert r.code == 0, r
    assert r.out == ""
    assert r.err.splitlines()[-1] == f"wrote {out}"
    # -v: what each group became
    assert re.search(r"^h\.1 .* pkg\.transformers::GPT2Block x2 ", r.err, re.M)
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    assert {f.name for f in model.functions} >= {"GPT2Block", "GPT2Attention", "GPT2MLP"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.onnx"]


def test_apply_python(run_cli, gpt2_pt2, gpt2_model, tmp_path):
    import ast

    out = tmp_path / "gpt2.py"
    r = run_cli("apply", GPT2_RULES, gpt2_pt2, "-o", out, "-q")
    assert (r.code, r.err) == (0, "")
    text = out.read_text()
    classes = {node.name for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ClassDef)}
    layers = gpt2_model[0].config.n_layer
    # one class per group: each block, its attention and MLP, the embeddings and final norm
    assert {f"h_{i}" for i in range(layers)} | {"attn", "mlp", "wte", "wpe", "ln_f"} <= classes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2.py"]


def test_system_errors_are_input_errors(run_cli, gpt2_pt2, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/models/weights.bin")

    monkeypatch.setattr(rewrite, "apply", refuse)
    r = run_cli("explain", GPT2_RULES, gpt2_pt2)
    assert (r.code, r.err) == (2, "/models/weights.bin: Permission denied\n")
