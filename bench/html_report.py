"""``rewrite explain --html`` on a 48-block GPT-2: the page's size and how fast it opens.

    .venv/bin/python -m bench.html_report                 # 48 blocks, 5 loads
    .venv/bin/python -m bench.html_report --blocks 12 48 --rules gpt2 --loads 9

Per depth: a random-weight GPT-2 (the demo's: ``examples/demo.py``, ``transformers``, nothing
downloaded) exported with ``torch.export`` and saved; ``rewrite explain RULES MODEL --html
OUT.html`` run as a user runs it, with ``rules/gpt2.rules`` (blocks, attention, MLP) and
``rules/modularize.rules`` (every module call a group: ~580 groups at 48 blocks) (its wall time is
reported, not the target); then the page is opened ``--loads`` times in a fresh tab of headless
Chromium (Debian's, driven over DevTools: ``tools/browser.py``) and the browser's own navigation
timing is read: ``loadEventEnd`` (the page parsed, laid out, its script run), and the time a filter
of the tree takes (typing ``attn``: the script and the layout it causes). Targets: under 2 MB, opens
in under 1 s (the median).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tools.browser import Browser, find_chromium

ROOT = Path(__file__).resolve().parent.parent
SIZE_TARGET = 2_000_000
OPEN_TARGET_MS = 1000.0


def _demo():
    spec = importlib.util.spec_from_file_location("demo", ROOT / "examples" / "demo.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def export(folder: Path, blocks: int) -> Path:
    """The demo GPT-2 with ``blocks`` blocks, exported and saved."""
    model, ids, kwargs = _demo().build_gpt2(blocks)
    pt2 = folder / f"gpt2-{blocks}.pt2"
    torch.export.save(torch.export.export(model, (ids,), kwargs=kwargs), str(pt2))
    return pt2


def report(pt2: Path, rules: str) -> tuple[Path, float]:
    """``rewrite explain RULES MODEL --html``; (page, seconds)."""
    page = pt2.with_name(f"{pt2.stem}-{rules}.html")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rewrite", "-q", "explain", rules, str(pt2),
                    "--html", str(page)], check=True, stdout=subprocess.DEVNULL)
    return page, time.perf_counter() - start


FILTER = """(() => {
  const search = document.getElementById('search');
  const start = performance.now();
  search.value = 'attn'; search.dispatchEvent(new Event('input'));
  document.body.getBoundingClientRect();  // the layout the filter caused
  return performance.now() - start;
})()"""


def open_times(browser: Browser, page: Path, loads: int
               ) -> tuple[list[float], list[float], int, list[str]]:
    """``loadEventEnd`` (ms) per load, filtering the tree (ms) per load, the rows, and every
    request the loads made."""
    times, filters, requests, rows = [], [], [], 0
    for _ in range(loads):
        tab = browser.open(page)
        times.append(tab.evaluate(
            "performance.getEntriesByType('navigation')[0].loadEventEnd"))
        rows = tab.evaluate("document.querySelectorAll('#groups .g').length")
        filters.append(tab.evaluate(FILTER))
        requests.extend(tab.requests)
        tab.close()
    return times, filters, rows, requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[48])
    parser.add_argument("--rules", nargs="+", default=["gpt2", "modularize"])
    parser.add_argument("--loads", type=int, default=5)
    args = parser.parse_args(argv)
    chromium, why = find_chromium()
    if chromium is None:
        print(f"skipped: {why}")
        return 1
    ok = True
    lines = [f"{'blocks':>6}  {'rules':>10}  {'groups':>6}  {'size':>9}  {'open (median)':>13}"
             f"  {'open (max)':>10}  {'filter':>7}  {'explain --html':>14}  requests"]
    with tempfile.TemporaryDirectory() as tmp:
        browser = Browser(chromium)
        try:
            for blocks in args.blocks:
                pt2 = export(Path(tmp), blocks)
                for rules in args.rules:
                    page, seconds = report(pt2, rules)
                    times, filters, rows, requests = open_times(browser, page, args.loads)
                    size = page.stat().st_size
                    median = statistics.median(times)
                    others = [u for u in requests if u != page.resolve().as_uri()]
                    ok &= size < SIZE_TARGET and median < OPEN_TARGET_MS and not others
                    lines.append(f"{blocks:>6}  {rules:>10}  {rows:>6}  {size / 1e3:>7.0f}kB  "
                                 f"{median:>10.0f} ms  {max(times):>7.0f} ms  "
                                 f"{statistics.median(filters):>4.0f} ms  "
                                 f"{seconds:>12.1f} s  {len(others)} besides the page")
        finally:
            browser.close()
    print("\n".join(lines))
    print(f"targets: under {SIZE_TARGET / 1e6:.0f} MB, opens in under {OPEN_TARGET_MS:.0f} ms "
          f"(Chromium's loadEventEnd, median of {args.loads} loads): "
          + ("met" if ok else "NOT met"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
