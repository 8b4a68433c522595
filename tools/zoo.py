"""The model zoo: rewrite on random-weight models of many architectures, checked against eager.

    make zoo                                  # or: nice .venv/bin/python -m tools.zoo
    .venv/bin/python -m tools.zoo --only llama t5 [--no-write]

For each model of :data:`tools.zoo_models.ZOO`: ``torch.export.export`` (non-strict), a plain
``torch.onnx.export`` of the program (the baseline, timed), then

* ``modularize``: ONNX passes ``onnx.checker.check_model(full_check=True)`` and equals eager
  in onnxruntime (atol 1e-4 unless the entry says why not); ``to_fx()`` equals eager;
* the blocks rule ``group class *Block``: the same checks, and every block class function is
  distinct: no two functions of the model have the same body (up to value names), so
  identical blocks share one function (``functions/blocks``); timed against the baseline;
* from ``.pt2``: the program saved with ``torch.export.save`` and both rules' checks again on
  what rewrite's loader reads from that file (column ``from .pt2``: ``ok`` or the failure).

Where torch itself cannot export or convert a model, the row says so, and rewrite's error
must name torch. Writes the table to ``tools/ZOO.md``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from attrs import frozen
from torch.utils import _pytree as pytree

from tools.feeds import feeds
from tools.zoo_models import FAST, ZOO, Entry

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tools" / "ZOO.md"
OK = "ok"


@frozen
class Row:
    name: str
    family: str
    result: str
    """``ok``, ``torch cannot export``, ``torch cannot convert``, or ``FAIL (stage)``."""
    fx_nodes: int | None = None
    functions: str = ""
    """Block functions / block calls (and all functions), for the blocks rule."""
    rewrite_s: float | None = None
    plain_s: float | None = None
    detail: str = ""
    pt2: str = ""
    """``ok``, or how the checks failed on the program read back from its ``.pt2``."""


class Failed(Exception):
    """A check failed at one stage."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"{stage}: {message}")
        self.stage, self.message = stage, message


def _first_line(e: BaseException) -> str:
    """The error's first line, or for torch.onnx's long reports their innermost cause."""
    from rewrite.errors import causes

    lines = [str(c).strip().splitlines()[0] for c in causes(e) if str(c).strip()]
    return (lines[-1] if lines else type(e).__name__)[:240]


def _tensors(value: Any) -> list[np.ndarray]:
    return [t.detach().numpy() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _check_onnx(stage: str, model, triple, want: list[np.ndarray], atol: float) -> None:
    import onnx
    import onnx_ir as ir
    import onnxruntime as ort

    proto = ir.to_proto(model)
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as e:
        raise Failed(stage, f"onnx checker: {_first_line(e)}") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    try:
        inputs = feeds(session, (triple[1], triple[2]))
    except ValueError as e:
        raise Failed("onnx inputs", str(e)) from None
    got = session.run(None, inputs)
    _compare(stage, got, want, atol)


def _compare(stage: str, got: list, want: list[np.ndarray], atol: float) -> None:
    if len(got) != len(want):
        raise Failed(stage, f"{len(got)} outputs, eager has {len(want)}")
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape:
            raise Failed(stage, f"output {k}: shape {g.shape}, eager {w.shape}")
        if w.size and not np.allclose(g, w, atol=atol, rtol=1e-4):
            raise Failed(stage, f"output {k}: max difference {np.abs(g - w).max():.2e} "
                         f"> {atol:g}")


def body_key(function) -> tuple:
    """A function's body up to value names: the types and shapes of its inputs (calls with
    other static shapes are another body in ONNX), per node its op, domain, attributes, and
    where each input comes from (a function input by position, a node output by position)."""
    where: dict[int, tuple] = {id(v): ("in", k) for k, v in enumerate(function.inputs)}
    nodes = []
    for i, node in enumerate(function):
        for j, out in enumerate(node.outputs):
            where[id(out)] = ("node", i, j)
        attrs = tuple(sorted((name, repr(getattr(a, "value", a)))
                             for name, a in node.attributes.items()))
        ins = tuple(where.get(id(v), ("outer", None)) if v is not None else None
                    for v in node.inputs)
        nodes.append((node.domain, node.op_type, node.overload, attrs, ins))
    outs = tuple(where.get(id(v)) for v in function.outputs)
    types = tuple((str(v.type), str(v.shape)) for v in function.inputs)
    return types, tuple(nodes), outs


def _block_functions(entry: Entry, model, tree) -> str:
    """``F/B``: block functions / block groups; raises if two functions share a body."""
    keys: dict[tuple, str] = {}
    for function in model.functions.values():
        key = body_key(function)
        if key in keys:
            raise Failed("blocks rule", f"functions {keys[key]} and {function.name} have the "
                         "same body (not deduplicated)")
        keys[key] = function.name
    blocks = [g for g in tree.groups() if g.rule is not None and g.rule.kind == "group"]
    names = {g.function_name for g in blocks}
    made = [f for f in model.functions.values() if any(f.name == n or f.name.startswith(n + "_")
                                                       for n in names)]
    if not blocks:
        raise Failed("blocks rule", f"no call of class {entry.block}")
    if not made:
        raise Failed("blocks rule", f"no function for the {len(blocks)} blocks")
    return f"{len(made)}/{len(blocks)}"


def check(entry: Entry, *, timing: bool = True) -> Row:
    """Build, export and check one model (see the module docstring)."""
    import rewrite

    row = dict(name=entry.name, family=entry.family)
    try:
        triple = entry.build()
    except Exception as e:
        return Row(**row, result="FAIL (build)", detail=_first_line(e))
    model, args, kwargs = triple
    with torch.no_grad():
        want = _tensors(model(*args, **kwargs))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(model, args, kwargs=kwargs)
    except Exception as e:
        return Row(**row, result="torch cannot export", detail=f"torch.export: {_first_line(e)}")
    nodes = sum(1 for n in program.graph.nodes if n.op not in ("placeholder", "output"))
    row["fx_nodes"] = nodes
    plain_s = None
    torch_failure = ""

    def plain() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(program, dynamo=True, verbose=False)

    try:
        if timing:
            plain()  # can torch convert it? (also the warm-up of the timed runs below)
    except Exception as e:
        reason = f"torch.onnx.export: {_first_line(e)}"
        try:
            rewrite.apply("modularize", program).to_onnx()
        except rewrite.InputError as mine:
            if "torch.onnx.export" not in str(mine):
                return Row(**row, result="FAIL (error message)", detail=str(mine)[:200])
            return Row(**row, result="torch cannot convert", detail=reason)
        # rewrite converts what torch.onnx.export cannot (a program with in-place ops is
        # lowered per body in torch's functional form): checked against eager below
        torch_failure = f"{reason} (rewrite converts it: checked against eager)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = rewrite.apply("modularize", program)
            _check_onnx("modularize onnx", result.to_onnx(), triple, want, entry.atol)
            with torch.no_grad():
                _compare("modularize fx", _tensors(result.to_fx()(*args, **kwargs)), want,
                         entry.atol)
            rules = rewrite.parse_rules(f"group class {entry.block}", f"{entry.name}.rules")
            blocks = rewrite.apply(rules, program)
            onnx_model = blocks.to_onnx()
            _check_onnx("blocks onnx", onnx_model, triple, want, entry.atol)
            functions = _block_functions(entry, onnx_model, blocks.tree)
            with torch.no_grad():
                _compare("blocks fx", _tensors(blocks.to_fx()(*args, **kwargs)), want,
                         entry.atol)
    except Failed as e:
        return Row(**row, result=f"FAIL ({e.stage})", detail=e.message)
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-1]
        return Row(**row, result="FAIL (error)",
                   detail=f"{type(e).__name__}: {_first_line(e)} ({Path(where.filename).name}:"
                          f"{where.lineno})")
    pt2 = from_pt2(entry, program, rules, triple, want)
    rewrite_s = None
    if timing:  # both warm (each ran above), alternating, medians of TIMING_RUNS
        def ours() -> None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                rewrite.apply(rules, program).to_onnx()

        sides = {"rewrite": ours} if torch_failure else {"rewrite": ours, "plain": plain}
        times = _timed_runs(sides, TIMING_RUNS)
        rewrite_s, plain_s = times["rewrite"], times.get("plain")
    flattened = [f.id for f in result.tree.flattened]
    detail = f"modularize flattened {', '.join(flattened)}" if flattened else ""
    if entry.why_atol:
        detail = "; ".join(filter(None, [detail, f"atol {entry.atol:g}: {entry.why_atol}"]))
    detail = "; ".join(filter(None, [detail, entry.note, torch_failure,
                                     pt2 if pt2 != OK else ""]))
    return Row(**row, result=OK, functions=functions, rewrite_s=rewrite_s, plain_s=plain_s,
               detail=detail, pt2=pt2.split(":")[0])


def from_pt2(entry: Entry, program, rules, triple, want: list[np.ndarray]) -> str:
    """The ONNX and FX checks of ``modularize`` and ``rules`` again, on the program read by
    rewrite's loader from the ``.pt2`` that ``torch.export.save`` writes of it: ``ok``, or
    ``FAIL (stage): why``."""
    import tempfile

    import rewrite

    _, args, kwargs = triple
    with tempfile.TemporaryDirectory(prefix="zoo-") as folder:
        path = Path(folder) / f"{entry.name}.pt2"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.export.save(program, str(path))
                for name, text in (("modularize", "modularize"), ("blocks", rules)):
                    result = rewrite.apply(text, path)
                    _check_onnx(f"{name} onnx from .pt2", result.to_onnx(), triple, want,
                                entry.atol)
                    with torch.no_grad():
                        _compare(f"{name} fx from .pt2", _tensors(result.to_fx()(*args, **kwargs)),
                                 want, entry.atol)
        except Failed as e:
            return f"FAIL ({e.stage}): {e.message}"
        except Exception as e:
            return f"FAIL (from .pt2): {type(e).__name__}: {_first_line(e)}"
    return OK


TIMING_RUNS = 5


def _timed_runs(sides: dict, runs: int) -> dict[str, float]:
    """Median seconds of ``runs`` calls of each side, the sides in alternating order."""
    import statistics

    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for k in range(runs):
        for name in (names if k % 2 == 0 else names[::-1]):
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else ""


def table(rows: list[Row]) -> str:
    lines = ["| model | family | FX nodes | result | from .pt2 | block functions/blocks | "
             "rewrite s | torch.onnx.export s | ratio | notes |",
             "|---|---|---:|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = f"{r.rewrite_s / r.plain_s:.2f}x" if r.rewrite_s and r.plain_s else ""
        notes = r.detail.replace("|", "\\|")
        lines.append(f"| {r.name} | {r.family} | {r.fx_nodes or ''} | {r.result} | {r.pt2} | "
                     f"{r.functions} | {_seconds(r.rewrite_s)} | {_seconds(r.plain_s)} | "
                     f"{ratio} | {notes} |")
    return "\n".join(lines)


def report(rows: list[Row], command: str) -> str:
    ok = sum(r.result == OK for r in rows)
    torch_side = [r.name for r in rows if r.result.startswith("torch cannot")]
    failed = [r.name for r in rows if r.result.startswith("FAIL")]
    from_file = [r.name for r in rows if r.pt2 == OK]
    not_from_file = [r.name for r in rows if r.result == OK and r.pt2 != OK]
    summary = (f"{ok} of {len(rows)} architectures pass; torch itself cannot export or convert "
               f"{len(torch_side)} ({', '.join(torch_side) or 'none'}); rewrite fails on "
               f"{len(failed)} ({', '.join(failed) or 'none'}). From their `.pt2` file: "
               f"{len(from_file)} of the {ok} that pass in memory"
               + (f" (not: {', '.join(not_from_file)})." if not_from_file else "."))
    return "\n".join([
        "# Model zoo", "",
        f"`{command}` on {datetime.date.today()}, {platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}.", "",
        "Random-weight models, small configs (tools/zoo_models.py), nothing downloaded. Per "
        "model: torch.export (non-strict); `modularize` and the blocks rule "
        "(`group class *Block`) to ONNX (full checker, onnxruntime equal to eager within "
        "atol 1e-4, rtol 1e-4) and to FX (equal to eager); no two ONNX functions with the "
        "same body. *from .pt2*: the same checks of both rules on the program saved with "
        "`torch.export.save` and read by rewrite's loader. *block functions/blocks*: "
        "functions made for the block class / its calls. *rewrite s*: "
        "`apply(blocks rule).to_onnx()` (it runs torch.onnx.export itself); "
        "*torch.onnx.export s*: the plain export of the same program; both warm "
        f"(each ran once before), medians of {TIMING_RUNS} alternating runs.", "",
        summary, "", table(rows), "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", help="run only these models")
    parser.add_argument("--fast", action="store_true", help="only the fast subset")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {TABLE.name}")
    args = parser.parse_args(argv)
    entries = [e for e in ZOO if (not args.only or e.name in args.only)
               and (not args.fast or e.name in FAST)]
    rows = []
    for entry in entries:
        start = time.perf_counter()
        row = check(entry)
        rows.append(row)
        print(f"{entry.name:16} {row.result:28} {row.functions:7} "
              f"{time.perf_counter() - start:6.1f}s  {row.detail[:120]}", flush=True)
    command = "python -m tools.zoo " + " ".join(argv if argv is not None else sys.argv[1:])
    text = report(rows, command.strip())
    if not args.no_write:
        TABLE.write_text(text)
        print(f"wrote {TABLE}")
    failed = any(r.result.startswith("FAIL") or r.pt2.startswith("FAIL") for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
