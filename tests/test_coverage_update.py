"""``python -m tools.coverage --only TYPE --update PAGE``: the rerun types' rows replace theirs
on the page, the counts follow, every other row and the text above the table stay."""

from __future__ import annotations

from tools.coverage import main, table, traced, update


def _page() -> str:
    rows = [{"type": "llama", "result": "converted, equal to eager",
             "why": "max |difference| 3e-07", "trace": "per layer", "seconds": 20.1},
            {"type": "roberta", "result": "disagrees with eager (not written)",
             "why": "logits (prefill) differs", "seconds": 8.8}]
    return "# Coverage\n\nSome text.\n\n" + table(rows)


def test_a_rerun_row_replaces_its_own_and_the_counts_follow():
    rerun = {"type": "roberta", "result": "converted, equal to eager",
             "why": "max |difference| 4e-07", "trace": "whole: a | b", "seconds": 15.3,
             "code": 0}
    page = update(_page(), [rerun])
    assert page.startswith("# Coverage\n\nSome text.\n\n")
    assert "- converted, equal to eager: 2\n" in page and "disagrees" not in page
    assert ("| llama | converted, equal to eager | max \\|difference\\| 3e-07 | per layer | "
            "20.1 |") in page
    assert ("| roberta | converted, equal to eager | max \\|difference\\| 4e-07 | "
            "whole: a \\| b | 15.3 |") in page
    assert update(page, []) == page  # rows read back as written


def test_the_option_writes_the_page(tmp_path, monkeypatch):
    import tools.coverage as coverage

    rerun = {"type": "roberta", "result": "converted, equal to eager", "why": "fine",
             "seconds": 1.0}
    monkeypatch.setattr(coverage, "run_one", lambda model_type, timeout, cache: rerun)
    path = tmp_path / "COVERAGE.md"
    path.write_text(_page())
    assert main(["--only", "roberta", "--update", str(path)]) == 0
    assert "| roberta | converted, equal to eager | fine |  | 1.0 |" in path.read_text()


def test_a_page_of_four_columns_reads_back_without_the_trace():
    old = ("transformers 5.24.0, 1 causal-LM model types:\n\n| model type | result | why | "
           "seconds |\n|---|---|---|---|\n| gpt2 | converted, equal to eager | fine | 9.1 |\n")
    assert "| gpt2 | converted, equal to eager | fine |  | 9.1 |" in update(old, [])


def test_the_trace_column_says_what_the_export_said():
    assert traced("torch.export: 2 of 3 layers traced (XLayer x2), 1 recorded") == "per layer"
    assert traced("torch.export: 2 of 3 layers traced (X x2)\ntorch.export traces every "
                  "layer: the per-layer model disagreed") == \
        "whole: the per-layer model disagreed"
    assert traced("refused before any export") == ""
