"""Fuzz model files: mutated real exports end in a valid, equal model or a clear refusal.

    .venv/bin/python -m tools.fuzz_models --cases 2000 --seed 0

Starts from real small exports (GPT-2, Llama, BERT and a hand-written model with a shared
submodule, as ``.onnx`` from ``torch.onnx.export(dynamo=True)``, the GPT-2 also already
outlined by ``rewrite``, and GPT-2 / the shared model / a model with stage tags as ``.pt2``),
built once into a cache
folder. Each case mutates one of them (:mod:`tools.model_mutations`: a node removed, an edge
to a missing value, garbage or mismatched ``name_scopes`` / ``class_hierarchy`` metadata, a
function with the name rewrite wants, truncation, byte flips, malformed ``nn_module_stack``
entries in a ``.pt2``...) and runs ``rewrite apply RULES MODEL -o out.onnx`` in-process, with
one of the shipped rule files. The contract, per exit code:

* 0: ``out.onnx`` passes ``onnx.checker.check_model(full_check=True)`` and computes what the
  input computes in onnxruntime (eager PyTorch for a ``.pt2``) within 1e-4; the input itself
  passed the checker (an invalid input must be refused, never "fixed" silently). A mutated
  input that passes the checker but does not run in onnxruntime leaves nothing to compare
  with: such outputs are counted apart (``compared``) and the tests bound their share;
* 1 or 2: a short message on stderr (no traceback), no output file (nor a temporary one);
* anything else (3: an internal error, or an exception escaping ``main``): a finding.

The input is never changed. Prints the cases, the outcomes per exit code and mutation, the
time, and each finding; exits 1 if there was any. ``tests/test_fuzz_models.py`` runs a subset.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import io
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import numpy as np
from attrs import frozen

from tools.feeds import feeds
from tools.model_mutations import mutate_onnx, mutate_pt2
from tools.ort_worker import CRASHED, OrtWorker

RULES = ("modularize", "gpt2", "llama", "bert", "split_by_tags")
PT2_BASES = {"gpt2": "gpt2", "shared": "shared_and_list", "staged": "staged"}
"""The models also fuzzed as ``.pt2`` (name -> builder in ``tools.models``); ``staged`` only as
``.pt2``: its regions carry a stage tag, so ``split_by_tags`` cases reach splitting."""
MAX_MESSAGE_LINES = 6
TOLERANCE = 1e-4
TRACE = False


@frozen
class Base:
    """A real export the cases start from, and what it computes."""

    name: str
    path: Path
    feeds: dict
    """onnxruntime inputs by name (the same values, positionally, for a ``.pt2``)."""
    expected: tuple = ()
    """Eager outputs (``.pt2`` only)."""


@frozen
class Outcome:
    code: int
    mutation: str
    finding: str | None = None
    message: str = ""
    """The first line rewrite printed on a refusal."""
    base: str = ""
    rules: str = ""
    compared: bool = False
    """Exit 0 and the output computed what the input (or eager) computes; False when the
    mutated input itself does not run in onnxruntime (the output only passed the checker)."""


# --- the starting models ---------------------------------------------------------------------


def build_bases(folder: Path, names: tuple[str, ...] | None = None) -> list[Base]:
    """Export the starting models into ``folder`` (reused when already there)."""
    import torch

    from tools import models

    made = {"gpt2": models.gpt2, "llama": models.llama, "bert": models.bert,
            "shared": models.shared_and_list, "staged": models.staged}
    bases = []
    for name, make in made.items():
        if names is not None and name not in names and f"{name}.pt2" not in names:
            continue
        model, args, kwargs = make()
        # staged: regions tagged with a stage (split_by_tags splits it), as a .pt2 only
        program = models.export((model, args, kwargs), preserve_meta=name == "staged")
        if (names is None or name in names) and name != "staged":
            path = folder / f"{name}.onnx"
            if not path.exists():
                _export_onnx(program, path)
            bases.append(Base(name, path, feeds(path, args)))
            if name == "gpt2":
                bases.append(_outlined(path, folder / "gpt2_outlined.onnx", args))
        if (names is None or f"{name}.pt2" in names) and name in PT2_BASES:
            path = folder / f"{name}.pt2"
            if not path.exists():
                torch.export.save(program, str(path))
            with torch.no_grad():
                expected = torch.utils._pytree.tree_leaves(model(*args, **kwargs))
            bases.append(Base(f"{name}.pt2", path, {}, tuple(t.numpy() for t in expected)))
    return bases


def _export_onnx(program, path: Path) -> None:
    """torch.onnx.export's file, its stack traces' source paths made relative to their
    import root: the same bytes wherever the checkout lies, so that a seed picks the same
    byte to flip in CI as here (an absolute path once moved a flip into a trace in CI only)."""
    import torch

    from rewrite.backends.onnx.finishing import make_portable

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        onnx_program = torch.onnx.export(program, dynamo=True, verbose=False)
    make_portable(onnx_program.model)
    onnx_program.save(str(path))


def _outlined(flat: Path, path: Path, args) -> Base:
    """GPT-2 already outlined by rewrite: a model that has local functions."""
    if not path.exists():
        code, err = run_cli(["apply", "gpt2", str(flat), "-o", str(path)])
        assert code == 0, err
    return Base("gpt2_outlined", path, feeds(path, args))


# --- one case --------------------------------------------------------------------------------


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``rewrite ARGV`` in-process: exit code and stderr."""
    from rewrite.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 0
    return code, err.getvalue()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_case(base: Base, rng: random.Random, folder: Path) -> Outcome:
    """Mutate ``base`` into ``folder``, run ``rewrite apply`` on it, check the contract."""
    for leftover in folder.iterdir():
        _remove(leftover)
    suffix = base.path.suffix
    model = folder / f"input{suffix}"
    if suffix == ".onnx":
        mutation = mutate_onnx(base.path.read_bytes(), rng, model)
    else:
        mutation = mutate_pt2(base.path, rng, model)
    rules = rng.choice(RULES)
    if base.name == "staged.pt2" and rng.random() < 0.5:
        rules = "split_by_tags"  # its stage tags: the split is made, not refused
    if TRACE:
        print(f"case: {base.name} {mutation} {rules}", file=sys.stderr, flush=True)
    out = folder / "out.onnx"
    before = _digest(model)
    try:
        code, err = run_cli(["-q", "apply", rules, str(model), "-o", str(out)])
    except Exception as e:  # noqa: BLE001 - escaping main is the finding
        return Outcome(-1, mutation, f"{type(e).__name__} escaped main: {e}")
    what = f"{base.name} {mutation} {rules}: exit {code}"
    problem, compared = None, False
    if _digest(model) != before:
        problem = "the input was changed"
    elif code == 0:
        problem, compared = _checked_output(base, model, out)
    elif code in (1, 2):
        problem = _check_refusal(err, folder, model)
    else:
        problem = f"exit {code}: {err.strip()[:600]}"
    first = err.strip().splitlines()[0] if code and err.strip() else ""
    return Outcome(code, mutation, f"{what}: {problem}" if problem else None, first,
                   base.name, rules, compared)


def _remove(path: Path) -> None:
    if path.is_dir():
        import shutil

        shutil.rmtree(path)
    else:
        path.unlink()


def _check_refusal(err: str, folder: Path, model: Path) -> str | None:
    lines = err.strip().splitlines()
    if not lines:
        return "refused without a message"
    if "Traceback" in err:
        return f"traceback: {err[:600]}"
    if len(lines) > MAX_MESSAGE_LINES:
        return f"{len(lines)} lines of message: {err[:600]}"
    left = sorted(p.name for p in folder.iterdir() if p != model)
    if left:
        return f"left files behind: {left}"
    return None


def _check_output(base: Base, model: Path, out: Path) -> str | None:
    """What is wrong with the output of an exit 0 (None: nothing)."""
    return _checked_output(base, model, out)[0]


def _checked_output(base: Base, model: Path, out: Path) -> tuple[str | None, bool]:
    """(what is wrong with the output of an exit 0, whether it was compared with the
    input's or eager's outputs)."""
    import onnx

    if not out.exists():
        return "exit 0 without an output file", False
    try:
        onnx.checker.check_model(str(out), full_check=True)
    except Exception as e:  # noqa: BLE001
        return f"output fails the checker: {_first(e)}", False
    if base.path.suffix == ".onnx":
        try:
            onnx.checker.check_model(str(model), full_check=True)
        except Exception as e:  # noqa: BLE001
            return f"exit 0 on an input the checker refuses ({_first(e)})", False
        expected = _run(model, base.feeds)
        if expected is None or expected is CRASHED:  # valid, not runnable: counted, reported
            return None, False
    else:
        expected = list(base.expected)
    try:
        inputs = base.feeds or _pt2_feeds(out, base)
    except ValueError as e:  # the output's inputs are not the program's
        return f"output inputs: {e}", False
    got = _run(out, inputs)
    if got is None or got is CRASHED:
        return f"output does not run in onnxruntime ({'it crashed' if got else 'refused'})", False
    return _compare(expected, got), True


def _pt2_feeds(out: Path, base: Base) -> dict:
    from tools import models

    return feeds(out, getattr(models, PT2_BASES[base.name.removesuffix(".pt2")])()[1])


def _run(path: Path, inputs: dict):
    """Outputs of ``path`` in onnxruntime (a child process), None if it does not run, or
    ``CRASHED``."""
    global _WORKER
    if _WORKER is None:
        _WORKER = OrtWorker()
    return _WORKER.run(path, inputs)


_WORKER: OrtWorker | None = None


def _compare(expected: list, got: list) -> str | None:
    if len(expected) != len(got):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (a, b) in enumerate(zip(expected, got)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"output {i}: shape {b.shape}, expected {a.shape}"
        if not np.allclose(a, b, atol=TOLERANCE, rtol=TOLERANCE, equal_nan=True):
            return f"output {i} differs by {float(np.nanmax(np.abs(a - b)))}"
    return None


def _first(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


# --- the run ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _bases_in(cache: str | None, names: tuple[str, ...] | None) -> Iterator[list[Base]]:
    if cache:
        Path(cache).mkdir(parents=True, exist_ok=True)
        yield build_bases(Path(cache), names)
        return
    with tempfile.TemporaryDirectory(prefix="fuzz-models-") as tmp:
        yield build_bases(Path(tmp), names)


def fuzz(bases: list[Base], cases: int, seed: int, pt2_share: float = 0.05
         ) -> list[Outcome]:
    """Run ``cases`` seeded cases over ``bases`` (``pt2_share`` of them on a ``.pt2``)."""
    rng = random.Random(seed)
    onnx_bases = [b for b in bases if b.path.suffix == ".onnx"]
    pt2_bases = [b for b in bases if b.path.suffix == ".pt2"]
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="fuzz-case-") as tmp:
        folder = Path(tmp)
        for _ in range(cases):
            use_pt2 = pt2_bases and (not onnx_bases or rng.random() < pt2_share)
            base = rng.choice(pt2_bases if use_pt2 else onnx_bases)
            outcomes.append(run_case(base, random.Random(rng.random()), folder))
    return outcomes


def report(outcomes: list[Outcome], seconds: float, messages: bool = False) -> int:
    codes = collections.Counter(o.code for o in outcomes)
    by_mutation: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for o in outcomes:
        by_mutation[o.mutation.split(":")[0]][o.code] += 1
    findings = [o.finding for o in outcomes if o.finding]
    shown = ", ".join(f"exit {c}: {n}" for c, n in sorted(codes.items()))
    compared = sum(o.compared for o in outcomes)
    print(f"cases: {len(outcomes)} in {seconds:.0f} s ({seconds / max(len(outcomes), 1):.2f} s "
          f"per case); {shown}; findings: {len(findings)}")
    print(f"exit 0 compared with the input (or eager): {compared} of {codes[0]}; the rest passed "
          "the checker, their mutated input does not run in onnxruntime")
    for mutation in sorted(by_mutation):
        counts = by_mutation[mutation]
        print(f"  {mutation:22} " + ", ".join(f"{c}: {n}" for c, n in sorted(counts.items())))
    if messages:
        seen = set()
        for o in outcomes:
            key = (o.mutation.split(":")[0], o.code)
            if o.message and key not in seen:
                seen.add(key)
                print(f"  e.g. {key[0]} exit {o.code}: {o.message[:160]}")
    for finding in findings[:50]:
        print(f"FINDING {finding}")
    return 1 if findings else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", help="folder for the exported models (default: temporary)")
    parser.add_argument("--pt2-share", type=float, default=0.05,
                        help="share of the cases on a .pt2 (slower: torch.onnx.export)")
    parser.add_argument("--trace", action="store_true", help="print each case before it runs")
    parser.add_argument("--messages", action="store_true",
                        help="print one refusal message per mutation and exit code")
    args = parser.parse_args(argv)
    global TRACE
    TRACE = args.trace
    with _bases_in(args.cache, None) as bases:
        start = time.perf_counter()
        outcomes = fuzz(bases, args.cases, args.seed, args.pt2_share)
        return report(outcomes, time.perf_counter() - start, args.messages)


__all__ = ["Base", "Outcome", "build_bases", "fuzz", "report", "run_case"]

if __name__ == "__main__":
    sys.exit(main())
