"""``python -m tools.coverage --only TYPE --update PAGE``: the rerun types' rows replace theirs
on the page, the counts follow, every other row and the text above the table stay."""

from __future__ import annotations

import pytest

from tools.coverage import _first, main, table, traced, update


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


def test_a_cache_none_run_passes_the_option_and_keeps_its_own_table(tmp_path, monkeypatch):
    """``--cache none``: each type exported with ``rewrite export --cache none``, its table
    headed so; ``--update`` puts its rows in that table only, the kv table above (and its
    text) untouched, and a page with no table of that cache is said before any run."""
    import tools.coverage as coverage

    asked = []

    def run_one(model_type, timeout, cache):
        asked.append(cache)
        return {"type": model_type, "result": "refused (exit 2)", "why": "prefill only",
                "seconds": 2.0}

    monkeypatch.setattr(coverage, "run_one", run_one)
    kv = _page()
    none = update("\n## Prefill only\n\n" + table([], "none"), [], "none")
    assert none.startswith("\n## Prefill only\n\ntransformers ") and \
        "causal-LM model types, prefill only (`--cache none`) (`python -m tools.coverage " \
        "--cache none --table docs/COVERAGE-none.md`):" in none
    path = tmp_path / "COVERAGE.md"
    path.write_text(kv + none + "\nText after.\n")
    assert main(["--cache", "none", "--only", "llama", "--update", str(path)]) == 0
    page = path.read_text()
    assert asked == ["none"]
    assert page.startswith(kv) and page.endswith("\nText after.\n")
    assert page.count("| llama |") == 2 and "| llama | refused (exit 2) | prefill only |  | " \
        "2.0 |" in page.split("## Prefill only")[1]
    assert update(page, [], "none") == page and update(page, [], "kv") == page
    path.write_text(kv)
    with pytest.raises(SystemExit, match="no table of --cache none|a table of --cache kv only"):
        main(["--cache", "none", "--only", "gpt2", "--update", str(path)])
    assert asked == ["none"]


def test_the_export_is_run_with_the_cache_asked(monkeypatch):
    """``run_one`` builds the checkpoint (its eager check without a cache for ``none``) and
    runs ``rewrite export ... --cache none``."""
    import subprocess

    import tools.coverage as coverage

    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "max |difference| 1e-07")

    monkeypatch.setattr(coverage.subprocess, "run", run)
    row = coverage.run_one("gpt2", 10, "none")
    assert row["result"] == "converted, equal to eager"
    assert calls[0][-1] == "none" and calls[1][-2:] == ["--cache", "none"]


def test_a_long_reason_is_cut_saying_so():
    """A row's reason is the first line of a message, at most 240 characters; a cut one
    ends in an ellipsis (it read as the whole message)."""
    message = "\n  InputError: " + "x" * 300 + "\nsecond line"
    cut = _first(message)
    assert len(cut) == 240 and cut == "InputError: " + "x" * 225 + "..."
    assert _first("short\nsecond") == "short"


@pytest.mark.parametrize("model_type", ["gpt_neo", "zaya", "mamba2", "dots1", "bailing_hybrid",
                                        "kimi_linear", "hrm_text", "inkling2_text",
                                        "longcat_flash", "dbrx", "cohere_compass_text",
                                        "xmod", "qwen4_exp_text", "dory"])
def test_a_tiny_config_passes_its_familys_validators(model_type, tmp_path):
    """These families' tiny configs were refused by their own validators (or modeling code),
    so their rows read "eager unusable" for a fault of the tool: GPT-Neo's 24-layer
    attention pattern on 2 layers, ZAYA's top-1 router given top-2, Mamba-2's heads not
    filling ``hidden_size * expand``, dots1's shared experts left None by its defaults,
    Bailing-Hybrid's and Kimi-Linear's 8 expert groups and top-8 (their own field names) on
    4 experts, HRM's cache slots (one per stacked layer per cycle) not its layer count,
    Inkling 2's unpadded vocabulary of 200,058 in a vocabulary of 128, LongCat's 64-wide
    rotary part in 8-wide rotary heads; DBRX's attention without ``rope_theta`` and
    ``clip_qkv``, Cohere Compass without RoPE parameters, X-MOD without a default language
    and Qwen4-Exp without its token indexer's sizes, as their defaults leave them; Dory's
    layer counts, which its config writes doubled (attention and MLP listed apart)."""
    from tools.coverage import write_checkpoint

    assert write_checkpoint(model_type, tmp_path / model_type) is None
