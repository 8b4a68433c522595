"""The test suite on every supported torch release: ``make matrix``.

    python3 tools/matrix.py [--versions 2.9.1 2.14.1 ...] [--pin onnx==1.17 ...] [--label L]
                            [--table docs/MATRIX.md] [--drop] [--no-probe]

For each torch version, one venv under ``.matrix/`` (ignored by git): torch installed first
with that exact version (so nothing later picks another), then ``pip install -e
'.[test,bench]'`` (with ``--pin``: those requirements too, e.g. the declared lower bounds of
onnx, onnx-ir, onnxscript, onnxruntime). In it:

1. the whole suite, slow tests included (``pytest -q -n auto --dist loadfile``, as ``make
   test-all`` runs it, under ``nice``): passed / failed / errors / skipped;
2. a probe (``--no-probe`` to leave it out): a 48-block GPT-2 ``.pt2`` saved with that torch
   (``tools.models.bench_gpt2``), then ``rewrite apply -v rules/gpt2.rules`` on it, one process
   as a user runs it: wall time, which ONNX lowering ran (``per-body``, or ``flat`` with the
   reason ``rewrite`` printed), and how the ``.pt2`` loaded (``mapped``: the weights are views
   of the file; ``torch.export.load``: the fallback when this torch's serialization differs).

Results go to ``.matrix/results/<label>.json`` (label: the torch version, or ``--label``);
the table of every result there is written to ``--table`` (default ``docs/MATRIX.md``).
A test that fails is run once more on its own; passing then, it counts as passed and is
printed and listed as flaky (with the first traceback). Exits 1 if a suite failed. ``--drop``
deletes each venv after its run (each CUDA build of torch is ~5 GB). Only the standard library: this
runs outside the venvs it makes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / ".matrix"
RESULTS = MATRIX / "results"
VERSIONS = ("2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
XDIST = ("-n", "auto", "--dist", "loadfile")
"""pytest-xdist's options, as ``make test-all`` gives them (the Makefile's PYTEST)."""
BLOCKS = 48


def _run(cmd: list[str], log: Path, **kwargs) -> float:
    """Run ``cmd`` (output appended to ``log``); its wall time in seconds."""
    start = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=True, cwd=ROOT,
                       **kwargs)
    return time.perf_counter() - start


def install(venv: Path, torch: str, pins: list[str]) -> dict[str, float]:
    """The venv with ``torch`` (first), then the package; install times (cached in the venv)."""
    stamp = venv / ".installed.json"
    if stamp.is_file():
        return json.loads(stamp.read_text())
    shutil.rmtree(venv, ignore_errors=True)
    log = venv.parent / f"{venv.name}.install.log"
    log.unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run(pip + ["--upgrade", "pip"], log)
    times = {"torch": _run(["nice"] + pip + [f"torch=={torch}"], log)}
    # torch named again: pip must keep it (a torch outside pyproject's range is an error)
    times["package"] = _run(["nice"] + pip + ["-e", ".[test,bench]", f"torch=={torch}", *pins],
                            log)
    stamp.write_text(json.dumps(times))
    return times


def versions_in(venv: Path) -> dict[str, str]:
    """The installed versions of the packages the table names."""
    code = ("import importlib.metadata as m, json; print(json.dumps({n: m.version(n) for n in "
            "('torch', 'onnx', 'onnx-ir', 'onnxscript', 'onnxruntime', 'transformers')}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def _node_id(classname: str, name: str) -> str:
    """pytest's node id of a junit test case (``tests.test_x.TestK`` ->
    ``tests/test_x.py::TestK``)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        if (ROOT / Path(*parts[:cut])).with_suffix(".py").is_file():
            return "::".join(["/".join(parts[:cut]) + ".py", *parts[cut:], name])
    return f"{classname}::{name}"


def _pytest(venv: Path, log: Path, report: Path, tests: list[str]) -> dict | None:
    """``pytest -q`` (on ``tests``, or the whole suite) in ``venv``: counts, failing tests
    (node ids) with their tracebacks, skips; None when pytest wrote no report."""
    report.unlink(missing_ok=True)
    with log.open("a") as out:
        subprocess.run(["nice", str(venv / "bin" / "python"), "-m", "pytest", "-q", *XDIST,
                        "-p", "no:cacheprovider", f"--junitxml={report}", *tests],
                       stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if not report.is_file():
        return None
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures, skips, details, kinds, passed = [], [], [], [], []
    for case in ET.parse(report).getroot().iter("testcase"):
        node = _node_id(case.get("classname", ""), case.get("name", ""))
        tags = {child.tag for child in case}
        for kind in ("error", "failure"):
            if kind in tags:
                counts["errors" if kind == "error" else "failed"] += 1
                failures.append(node)
                kinds.append("errors" if kind == "error" else "failed")
                found = case.find(kind)
                details.append(f"{node}\n{found.text or found.get('message')}")
                break
        else:
            if "skipped" in tags:
                counts["skipped"] += 1
                skips.append(f"{node}: {case.find('skipped').get('message', '')}")
            else:
                counts["passed"] += 1
                passed.append(node)
    return {**counts, "failures": failures, "skips": skips, "details": details,
            "kinds": kinds, "passed_ids": passed}


def suite(venv: Path, label: str, tests: list[str] | None = None) -> dict:
    """The whole suite in ``venv``: counts, failing tests, wall time. A test that fails is
    run once more on its own: if it passes then, it counts as passed and is listed as
    *flaky* with the first run's traceback (printed, and in the table's notes)."""
    log = RESULTS / f"{label}.pytest.log"
    log.unlink(missing_ok=True)
    start = time.perf_counter()
    result = _pytest(venv, log, RESULTS / f"{label}.junit.xml", tests or [])
    if result is None:
        return {"seconds": time.perf_counter() - start, "passed": 0, "failed": 0,
                "errors": 1, "skipped": 0, "flaky": [], "details": [],
                "failures": ["pytest did not run: see " + str(log.relative_to(ROOT))]}
    result["flaky"] = []
    if result["failures"]:
        again = _pytest(venv, log, RESULTS / f"{label}.again.junit.xml", result["failures"])
        if again is not None:
            first = list(zip(result.pop("failures"), result.pop("details"),
                             result.pop("kinds")))
            result["failures"], result["details"] = [], []
            for node, detail, kind in first:
                if node not in again["passed_ids"]:
                    result["failures"].append(node)
                    result["details"].append(detail)
                else:
                    result["flaky"].append(detail)
                    result[kind] -= 1
                    result["passed"] += 1
    result.pop("passed_ids", None)
    result.pop("kinds", None)
    return {"seconds": time.perf_counter() - start, **result}


PROBE = """
import sys
import torch
from tools.models import bench_gpt2
model, args, kwargs = bench_gpt2(int(sys.argv[1]), 32)
torch.export.save(torch.export.export(model, args, kwargs=kwargs), sys.argv[2])
"""


def probe(venv: Path, label: str) -> dict:
    """``rewrite apply -v`` on the 48-block GPT-2 saved with this torch: wall time, lowering
    path, how the ``.pt2`` loaded."""
    pt2 = venv / f"gpt2-{BLOCKS}.pt2"
    onnx = venv / f"gpt2-{BLOCKS}.onnx"
    log = RESULTS / f"{label}.probe.log"
    log.unlink(missing_ok=True)
    if not pt2.is_file():
        try:
            _run([str(venv / "bin" / "python"), "-c", PROBE, str(BLOCKS), str(pt2)], log)
        except subprocess.CalledProcessError:
            return {"seconds": None, "path": "GPT-2 export failed (see the probe log)",
                    "loader": "-"}
    start = time.perf_counter()
    done = subprocess.run([str(venv / "bin" / "rewrite"), "apply", "-v", "rules/gpt2.rules",
                           str(pt2), "-o", str(onnx)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "400"})
    seconds = time.perf_counter() - start
    text = done.stdout + done.stderr
    with log.open("a") as out:
        out.write(text)
    onnx.unlink(missing_ok=True)
    flat = re.search(r"lowered the flat program[^:]*: per-body lowering is not possible: (.*)",
                     text)
    if done.returncode != 0:
        path = f"failed (exit {done.returncode})"
    elif flat:
        path = f"flat ({flat.group(1).strip()})"
    elif "each distinct body once" in text:
        path = "per-body"
    elif "torch.onnx.export (" in text:
        path = "flat"
    else:
        path = "?"
    fallback = re.search(r"loaded with torch\.export\.load", text)
    return {"seconds": seconds, "path": path,
            "loader": "torch.export.load (fallback)" if fallback else "mapped"}


def run_one(torch: str, pins: list[str], label: str, with_probe: bool, drop: bool) -> dict:
    venv = MATRIX / f"torch-{label}"
    print(f"[{label}] installing torch=={torch} {' '.join(pins)}", flush=True)
    times = install(venv, torch, pins)
    result = {"label": label, "torch": torch, "pins": pins, "install": times,
              "versions": versions_in(venv)}
    print(f"[{label}] running the suite", flush=True)
    result["suite"] = suite(venv, label)
    s = result["suite"]
    print(f"[{label}] {s['passed']} passed, {s['failed']} failed, {s['errors']} errors, "
          f"{s['skipped']} skipped in {s['seconds']:.0f} s", flush=True)
    for detail in s["details"]:  # a CI log shows what failed, not only how many
        print(f"[{label}] FAILED {detail[-6000:]}", flush=True)
    for detail in s["flaky"]:
        print(f"[{label}] FLAKY (failed, then passed when run again) {detail[-6000:]}",
              flush=True)
    if with_probe:
        result["probe"] = probe(venv, label)
        print(f"[{label}] rewrite apply: {result['probe']}", flush=True)
    (RESULTS / f"{label}.json").write_text(json.dumps(result, indent=1))
    if drop:
        shutil.rmtree(venv)
    return result


def _key(result: dict) -> tuple:
    return (tuple(int(p) for p in result["torch"].split(".")), bool(result["pins"]))


def table(results: list[dict]) -> str:
    """The markdown table of ``results``."""
    lines = [
        "| torch | suite: passed / failed / errors / skipped | ONNX lowering (default) "
        f"| `rewrite apply` on the {BLOCKS}-block GPT-2 | `.pt2` loader | onnx / onnx-ir / "
        "onnxscript / onnxruntime | install (torch + rest) / suite time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=_key):
        s, p, v, t = r["suite"], r.get("probe"), r["versions"], r["install"]
        seconds = f"{p['seconds']:.1f} s" if p and p["seconds"] is not None else "-"
        name = v["torch"] + (f" (pinned: {', '.join(r['pins'])})" if r["pins"] else "")
        lines.append(
            f"| {name} | {s['passed']} / {s['failed']} / {s['errors']} / {s['skipped']} "
            f"| {p['path'] if p else '-'} | {seconds} "
            f"| {p['loader'] if p else '-'} "
            f"| {v['onnx']} / {v['onnx-ir']} / {v['onnxscript']} / {v['onnxruntime']} "
            f"| {t['torch']:.0f} + {t['package']:.0f} s / {s['seconds']:.0f} s |")
    notes = []
    for r in sorted(results, key=_key):
        for name in r["suite"]["failures"]:
            notes.append(f"- {r['label']}: failed or error: `{name}`")
        for detail in r["suite"].get("flaky", []):
            notes.append(f"- {r['label']}: flaky (failed, passed when run again): "
                         f"`{detail.splitlines()[0]}`")
        for name in r["suite"].get("skips", []):
            notes.append(f"- {r['label']}: skipped: `{name}`")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def write(path: Path) -> None:
    """Write the table of every result in ``.matrix/results`` into ``path`` (between the
    markers, or the whole file if it has none)."""
    results = [json.loads(p.read_text()) for p in RESULTS.glob("*.json")]
    begin, end = "<!-- matrix:begin -->", "<!-- matrix:end -->"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = f"{begin}\nWritten {when} by `make matrix`.\n\n{table(results)}{end}"
    text = path.read_text() if path.is_file() else ""
    if begin in text and end in text:
        text = text[:text.index(begin)] + body + text[text.index(end) + len(end):]
    else:
        text = body + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    parser.add_argument("--pin", action="append", default=[],
                        help="one more requirement for the venv (e.g. onnx==1.17)")
    parser.add_argument("--label", help="the venv's and result's name (default: the version)")
    parser.add_argument("--table", type=Path, default=ROOT / "docs" / "MATRIX.md")
    parser.add_argument("--drop", action="store_true", help="delete each venv after its run")
    parser.add_argument("--no-probe", action="store_true")
    parser.add_argument("--install-only", action="store_true",
                        help="make the venvs, run nothing (to install while a suite runs)")
    args = parser.parse_args(argv)
    if args.label and len(args.versions) > 1:
        parser.error("--label names one venv: give one version")
    RESULTS.mkdir(parents=True, exist_ok=True)
    ok = True
    for version in args.versions:
        if args.install_only:
            install(MATRIX / f"torch-{args.label or version}", version, args.pin)
            continue
        try:
            result = run_one(version, args.pin, args.label or version, not args.no_probe,
                             args.drop)
        except subprocess.CalledProcessError as e:  # pip could not install this release
            label = args.label or version
            log = MATRIX / f"torch-{label}.install.log"
            tail = "".join(log.read_text().splitlines(keepends=True)[-8:]) if log.is_file() else ""
            print(f"[{label}] {' '.join(map(str, e.cmd))} failed (exit {e.returncode}); "
                  f"the end of {log.relative_to(ROOT)}:\n{tail}", flush=True)
            ok = False
            continue
        ok = ok and result["suite"]["failed"] == result["suite"]["errors"] == 0
        write(args.table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
