"""``rewrite explain --json`` and ``rewrite check``: what the core engine tells a user."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

SHIPPED = sorted(p.name for p in resources.files("rewrite.library").iterdir()
                 if p.name.endswith(".rules"))


def explain_json(run_cli, rules: Path, model: Path) -> dict:
    r = run_cli("explain", rules, model, "--json")
    assert r.code == 0, r
    return json.loads(r.out)


def flatten(groups: list[dict]) -> list[dict]:
    out = []
    for g in groups:
        out.append(g)
        out.extend(flatten(g["children"]))
    return out


def test_shared_calls_are_two_groups(run_cli, tmp_path, shared_pt2):
    rules = tmp_path / "shared.rules"
    rules.write_text("group path shared\ngroup class *Linear\ngroup path nowhere\n")
    data = explain_json(run_cli, rules, shared_pt2)
    shared = [(g["id"], g["path"], g["call_index"], g["nodes"], g["rule"])
              for g in data["groups"] if g["path"] == "shared"]
    assert shared == [("shared", "shared", 0, 2, f"{rules}:1"),
                      ("shared@1", "shared", 1, 2, f"{rules}:1")]
    inner = next(g for g in data["groups"] if g["id"] == "shared@1")["children"]
    assert [(c["id"], c["function"], c["rule"]) for c in inner] == [
        ("shared@1/shared.lin@1", "Linear", f"{rules}:2")]
    assert data["warnings"] == [{"location": f"{rules}:3:1",
                                 "message": "group rule matches nothing in this model"}]
    everything = data["top_level_nodes"] + sum(g["nodes"] for g in data["groups"])
    assert everything == data["graph"]["nodes"]
    for group in flatten(data["groups"]):
        assert group["nodes"] == group["own_nodes"] + sum(c["nodes"] for c in group["children"])


def test_split_components_in_json(run_cli, tmp_path, staged_pt2):
    rules = tmp_path / "split.rules"
    rules.write_text('include "split_by_tags.rules"\ngroup class *Sub\n')
    data = explain_json(run_cli, rules, staged_pt2)
    assert [(g["id"], g["kind"], g["tag_value"], g["function"], g["domain"])
            for g in data["groups"]] == [("encode", "component", "encode", "encode", "pkg.rewrite"),
                                         ("decode", "component", "decode", "decode", "pkg.rewrite")]
    assert data["groups"][0]["rule"].endswith("split_by_tags.rules:5")
    assert [c["id"] for c in data["groups"][1]["children"]] == ["decode/mid", "decode/dec"]


def test_explain_reports_grouping_errors_at_the_rule(run_cli, tmp_path, shared_pt2):
    rules = tmp_path / "bad.rules"
    rules.write_text("# no node carries this tag\nsplit by x\n")
    r = run_cli("explain", rules, shared_pt2, "--json")
    assert r.code == 1 and r.out == ""
    assert f"{rules}:2: error: no node has the tag 'x' to split by" in r.err
    assert "Traceback" not in r.err


# --- rewrite check ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_check_accepts_every_shipped_rules_file(run_cli, name):
    path = Path(str(resources.files("rewrite.library").joinpath(name)))
    r = run_cli("check", path)
    assert r.code == 0, r
    assert r.err == ""


def test_shipped_library_has_the_documented_files():
    assert {"modularize.rules", "split_by_tags.rules", "gpt2.rules"} <= set(SHIPPED)


@pytest.mark.parametrize("text, location", [
    ("group path h.*\ngroup clas *Block\n", "2:7"),
    ("\n\n   flat path a as \"x\"\n", "3:16"),
    ('group any\ntag any with k == "v"\n', "2:17"),
    ("group path h.[9-1]\n", "1:7"),
    ('include "missing.rules"\n', "1:1"),
])
def test_check_rejects_malformed_files_with_file_line_col(run_cli, tmp_path, text, location):
    rules = tmp_path / "bad.rules"
    rules.write_text(text)
    r = run_cli("check", rules)
    assert r.code == 1, r
    assert f"{rules}:{location}: error: " in r.err
    assert "Traceback" not in r.err
