"""``rewrite explain RULES MODEL --html OUT.html``, opened in a real headless browser
(Chromium over DevTools, ``tools/browser.py``): what a person sees (the group tree, expanding,
collapsing and filtering it, the functions, the totals, why a class got more than one
function), that the page asks for nothing over the network, and that bad input leaves no
file behind."""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir
import pytest
import torch

from tests.test_why_distinct import SHAPE, applied, variants  # noqa: F401 (a fixture)

ROWS = """[...document.querySelectorAll('#groups .g')].map(g => {
  const row = g.tagName === 'DETAILS' ? g.querySelector(':scope > summary') : g;
  return {id: g.dataset.id, cells: [...row.children].map(c => c.innerText.trim()),
          visible: row.checkVisibility()};
})"""
TABLE = """[...document.querySelectorAll('#function-table tbody tr')].map(
  r => [...r.children].map(c => c.innerText.trim()))"""
VARIANTS = """[...document.querySelectorAll('tr.variant')].map(r => ({
  function: r.dataset.function, cells: [...r.children].map(c => c.innerText.trim()),
  reason: r.nextElementSibling.innerText.trim(), visible: r.checkVisibility()}))"""


def report(run_cli, rules, model, out: Path) -> dict:
    """Write the report; return the data ``--json`` printed in the same run."""
    r = run_cli("explain", rules, model, "--html", out, "--json")
    assert r.code == 0, r
    assert out.is_file()
    return json.loads(r.out)


def walk(groups: list[dict], parents: tuple = ()):
    for group in groups:
        yield group, parents
        yield from walk(group["children"], (*parents, group["id"]))


def expected_row(group: dict) -> list[str]:
    """The cells of a group's row, from ``--json`` (the tree ``explain`` prints)."""
    if group["kind"] == "component":
        key, cls = group["tag_value"], f"split {group['tag_value']}"
    else:
        key = group["path"] + (f"@{group['call_index']}" if group["call_index"] else "")
        cls = group["class"].rsplit(".", 1)[-1]
    function = (f"{group['onnx_function']} x{group['onnx_calls']}" if group["onnx_function"]
                else "(inlined)")
    return [key, cls, str(group["nodes"]), function, group["rule"].rsplit("/", 1)[-1]]


def flat_nodes(model: ir.Model, graph) -> int:
    """Nodes of ``graph`` with every function call inlined."""
    total = 0
    for node in graph:
        function = model.functions.get((node.domain, node.op_type, node.overload))
        total += flat_nodes(model, function) if function is not None else 1
    return total


def assert_offline(page, path: Path) -> None:
    """The page made one request (itself, from disk), logged no error or CSP violation."""
    assert page.requests == [path.resolve().as_uri()]
    assert page.console == []


def test_gpt2_report(browser, run_cli, gpt2_pt2, tmp_path):
    out = tmp_path / "gpt2.html"
    data = report(run_cli, "gpt2", gpt2_pt2, out)
    page = browser.open(out)
    assert_offline(page, out)
    groups = list(walk(data["groups"]))
    assert len(groups) <= 60  # small trees open fully

    rows = page.evaluate(ROWS)
    assert [r["id"] for r in rows] == [g["id"] for g, _ in groups]
    for row, (group, _) in zip(rows, groups):
        assert row["cells"] == expected_row(group)
        assert row["visible"]
    assert page.evaluate("document.getElementById('matches').innerText") == \
        f"{len(groups)} groups"

    page.evaluate("document.getElementById('collapse').click()")
    shown = [r["id"] for r in page.evaluate(ROWS) if r["visible"]]
    assert shown == [g["id"] for g in data["groups"]]
    page.evaluate("document.querySelector('details.g > summary').click()")  # open one
    first = next(g for g in data["groups"] if g["children"])  # h.0: wte, wpe have none
    shown = [r["id"] for r in page.evaluate(ROWS) if r["visible"]]
    order = [g["id"] for g, _ in groups]
    assert shown == sorted({g["id"] for g in data["groups"]} | {c["id"] for c in first["children"]},
                           key=order.index)

    page.evaluate("document.getElementById('search').focus()")  # type as a person does
    page.send("Input.insertText", text="MLP")
    hits = [g["id"] for g, _ in groups if "mlp" in " ".join(
        str(g[k] or "") for k in ("path", "id", "class", "onnx_function")).lower()]
    assert hits
    expected = set(hits) | {p for g, parents in groups if g["id"] in hits for p in parents}
    rows = page.evaluate(ROWS)
    assert {r["id"] for r in rows if r["visible"]} == expected
    assert page.evaluate("document.getElementById('matches').innerText") == \
        f"{len(hits)} of {len(groups)} groups match"

    onnx_model, calls = applied(run_cli, "gpt2", gpt2_pt2, tmp_path)
    table = page.evaluate(TABLE)
    assert {row[0]: int(row[2]) for row in table} == calls
    for row in table:
        domain, name = row[1], row[0]
        assert int(row[4]) == len(onnx_model.functions[(domain, name, "")])
    assert page.evaluate("document.getElementById('flat').innerText") == \
        f"{flat_nodes(onnx_model, onnx_model.graph):,}"
    assert page.evaluate("document.getElementById('in-functions').innerText") == \
        f"{sum(len(f) for f in onnx_model.functions.values()):,}"
    assert page.evaluate("document.getElementById('main-graph').innerText") == \
        f"{len(onnx_model.graph):,}"
    assert page.evaluate("document.querySelector('#why').innerText").endswith(
        "Every class was lowered to one function.")
    assert page.evaluate(VARIANTS) == []
    page.close()


def test_one_op_variants(browser, run_cli, variants, tmp_path):  # noqa: F811
    out = tmp_path / "one_op.html"
    data = report(run_cli, variants["rules"], variants["one_op"], out)
    page = browser.open(out)
    assert_offline(page, out)
    shown = {v["function"].split("::")[1]: v for v in page.evaluate(VARIANTS)}
    assert set(shown) == {"MLP_1", "Block_1"}
    mlp = shown["MLP_1"]
    assert mlp["visible"]
    function, kind, this, first = mlp["cells"]
    assert function.split("\n")[0].endswith("::MLP_1 x1")
    assert function.split("\n")[1].startswith("vs ") and function.endswith("::MLP x3")
    assert kind == "op"
    assert this.split("\n")[0] == "Tanh" and "tanh" in this.split("\n")[1].lower()
    assert first.split("\n")[0] == "Relu" and "relu" in first.split("\n")[1].lower()
    assert mlp["reason"].startswith("MLP_1 vs MLP: op: Tanh at ")
    block = shown["Block_1"]
    assert block["cells"][1] == "a different group subtree"
    assert block["cells"][2].startswith("calls ") and "::MLP_1" in block["cells"][2]
    assert block["cells"][2].endswith("at blocks.2/blocks.2.mlp")
    assert block["cells"][3].startswith("calls ") and block["cells"][3].split("\n")[0] \
        .endswith("::MLP")
    reasons = {v["function"]: v["reason"] for v in data["onnx"]["variants"]}
    assert {v["function"]: v["reason"] for v in shown.values()} == reasons

    rows = {r["id"]: r["cells"] for r in page.evaluate(ROWS)}
    assert rows["blocks.2"][3].endswith("::Block_1 x1")
    assert rows["blocks.2/blocks.2.mlp"][3].endswith("::MLP_1 x1")
    assert rows["blocks.0"][3].endswith("::Block x3")
    classes = page.evaluate("""[...document.querySelectorAll('#classes tbody tr')].map(
        r => [r.children[0].innerText, r.children[3].innerText])""")
    assert sorted((c.split("::")[1], int(n)) for c, n in classes) == [
        ("Block", 2), ("Linear", 1), ("MLP", 2)]
    page.close()


def test_input_shape_variants(browser, run_cli, variants, tmp_path):  # noqa: F811
    out = tmp_path / "two_shapes.html"
    report(run_cli, variants["rules"], variants["two_shapes"], out)
    page = browser.open(out)
    assert_offline(page, out)
    shown = {v["function"].split("::")[1]: v for v in page.evaluate(VARIANTS)}
    assert set(shown) == {"Block_1", "MLP_1", "Linear_1"}
    full = "float[" + ",".join(map(str, SHAPE)) + "]"
    short = f"float[{SHAPE[0]},2,{SHAPE[2]}]"
    for variant in shown.values():
        _, kind, this, first = variant["cells"]
        assert kind.startswith("shape of ")
        assert this.split("\n")[0] == short and first.split("\n")[0] == full
        assert this.split("\n")[1].startswith("at ") and first.split("\n")[1].startswith("at ")
    rows = {r["id"]: r["cells"] for r in page.evaluate(ROWS)}
    assert rows["blocks.1"][3].endswith("::Block_1 x1")
    assert rows["blocks.0"][3].endswith("::Block x2") and rows["blocks.2"][3].endswith(
        "::Block x2")
    page.close()


def test_lifted_scalars_per_call(browser, run_cli, tmp_path):
    from tools import models

    model, args, _ = models.settings()  # four blocks: eps and scale differ
    pt2 = tmp_path / "settings.pt2"
    torch.export.save(torch.export.export(model, args), str(pt2))
    rules = tmp_path / "norm.rules"
    rules.write_text("group class *NormBlock\n")
    out = tmp_path / "settings.html"
    report(run_cli, rules, pt2, out)
    page = browser.open(out)
    assert_offline(page, out)
    table = page.evaluate(TABLE)
    assert [row[0] for row in table] == ["NormBlock"]
    attributes = table[0][5].split("\n")
    eps = next(a for a in attributes if a.startswith("epsilon:"))
    for value, calls in ((1e-05, "blocks.0, blocks.2"), (1e-06, "blocks.1"),
                         (0.001, "blocks.3")):
        assert f"{value} x{calls.count(',') + 1} ({calls})" in eps, eps
    scale = next(a for a in attributes if not a.startswith("epsilon:"))
    for value, calls in ((0.5, "blocks.0, blocks.1"), (0.25, "blocks.2"), (2.0, "blocks.3")):
        assert f"{value} x{calls.count(',') + 1} ({calls})" in scale, scale
    page.close()


def test_checks_can_fail(browser, run_cli, gpt2_pt2, tmp_path):
    """The offline checks see a request and a blocked script when there is one."""
    out = tmp_path / "gpt2.html"
    report(run_cli, "gpt2", gpt2_pt2, out)
    text = out.read_text()
    tampered = tmp_path / "tampered.html"  # the script changed: its hash no longer matches
    tampered.write_text(text.replace('"use strict";', '"use strict"; ', 1))
    page = browser.open(tampered)
    assert any("Content Security Policy" in m for m in page.console), page.console
    assert page.evaluate("document.getElementById('matches').innerText") == ""
    page.close()
    remote = tmp_path / "remote.html"
    remote.write_text('<!DOCTYPE html><img src="http://127.0.0.1:9/x.png">')
    page = browser.open(remote)
    assert "http://127.0.0.1:9/x.png" in page.requests
    page.close()


# --- bad input ---------------------------------------------------------------------------------


def refused(run_cli, folder: Path, *argv) -> str:
    """Exit 2, one line on stderr, nothing on stdout, no file left in ``folder``."""
    before = sorted(p.name for p in folder.iterdir())
    r = run_cli("explain", *argv)
    assert r.code == 2, r
    assert r.out == "" and "Traceback" not in r.err
    assert len(r.err.splitlines()) == 1, r.err
    assert sorted(p.name for p in folder.iterdir()) == before
    return r.err.strip()


def test_unwritable_report_path(run_cli, gpt2_pt2, tmp_path):
    missing = tmp_path / "nowhere" / "r.html"
    assert refused(run_cli, tmp_path, "gpt2", gpt2_pt2, "--html", missing) == (
        f"{missing}: cannot write there: folder {missing.parent} does not exist")
    assert refused(run_cli, tmp_path, "gpt2", gpt2_pt2, "--html", tmp_path).startswith(
        f"{tmp_path}: is a directory")
    assert refused(run_cli, tmp_path, "gpt2", gpt2_pt2, "--html", tmp_path / "r.txt") == (
        f"{tmp_path / 'r.txt'}: the report is an HTML page; give a name ending in .html")


def test_report_over_the_model_is_refused(run_cli, gpt2_pt2, tmp_path):
    model = tmp_path / "m.pt2"
    model.write_bytes(gpt2_pt2.read_bytes())
    assert "refusing to overwrite it" in refused(run_cli, tmp_path, "gpt2", model, "--html",
                                                 model)
    assert model.read_bytes() == gpt2_pt2.read_bytes()


def test_failing_model_writes_no_report(run_cli, tmp_path):
    model = tmp_path / "broken.pt2"
    model.write_bytes(b"PK\x03\x04 not really a zip archive")
    message = refused(run_cli, tmp_path, "gpt2", model, "--html", tmp_path / "r.html")
    assert message.startswith(f"{model}: ")


@pytest.mark.parametrize("flag", ["--onnx", "--json"])
def test_other_flags_beside_html(run_cli, variants, tmp_path, flag):  # noqa: F811
    out = tmp_path / "r.html"
    r = run_cli("explain", variants["rules"], variants["one_op"], "--html", out, flag)
    assert r.code == 0, r
    assert out.is_file() and "Block_1 vs Block: " in out.read_text()
    if flag == "--json":
        assert json.loads(r.out)["onnx"]["variants"]
    else:
        assert "why distinct (2 classes lowered to more than one function):" in r.out


def test_grouping_error_writes_no_report(run_cli, shared_pt2, tmp_path):
    rules = tmp_path / "bad.rules"
    rules.write_text("split by x\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run_cli("explain", rules, shared_pt2, "--html", tmp_path / "r.html")
    assert r.code == 1 and r.out == "" and "Traceback" not in r.err
    assert f"{rules}:1: error: no node has the tag 'x' to split by" in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


class _Attention(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2), dim=-1)
        return self.o(weights @ self.v(x))


class _MLP(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc, self.act, self.proj = (torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                        torch.nn.Linear(2 * width, width))

    def forward(self, x):
        return self.proj(self.act(self.fc(x)))


class _Layer(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.ln_1, self.attn = torch.nn.LayerNorm(width), _Attention(width)
        self.ln_2, self.mlp = torch.nn.LayerNorm(width), _MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _Stack(torch.nn.Module):
    """48 GPT-2-shaped layers: 12 module calls each, like a 48-block GPT-2 modularized."""

    def __init__(self, layers: int = 48, width: int = 8):
        super().__init__()
        self.h = torch.nn.ModuleList(_Layer(width) for _ in range(layers))

    def forward(self, x):
        for layer in self.h:
            x = layer(x)
        return x


@pytest.mark.slow  # a tree of thousands of groups
def test_large_tree_is_small_and_opens_folded(browser, run_cli, tmp_path):
    """580 groups (the size of a 48-block GPT-2 under modularize.rules): the page stays under
    2 MB and opens with the top level shown, every group one click away."""
    torch.manual_seed(0)
    pt2 = tmp_path / "stack.pt2"
    torch.export.save(torch.export.export(_Stack().eval(), (torch.randn(2, 4, 8),)), str(pt2))
    out = tmp_path / "stack.html"
    data = report(run_cli, "modularize", pt2, out)
    groups = list(walk(data["groups"]))
    assert len(groups) == 48 * 12
    assert out.stat().st_size < 2_000_000
    page = browser.open(out)
    assert_offline(page, out)
    rows = page.evaluate(ROWS)
    assert len(rows) == len(groups)
    assert [r["id"] for r in rows if r["visible"]] == [g["id"] for g in data["groups"]]
    page.evaluate("document.getElementById('expand').click()")
    assert all(r["visible"] for r in page.evaluate(ROWS))
    (why,) = [v for v in data["onnx"]["totals"]["classes"] if v["name"] == "_Layer"]
    assert (why["calls"], len(why["functions"])) == (48, 1)
    page.close()
