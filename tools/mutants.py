"""Mutation checks: deliberate wiring bugs that the test suite must catch.

    .venv/bin/python -m tools.mutants                 # every mutant, its tests
    .venv/bin/python -m tools.mutants --list          # the mutants and their patches
    .venv/bin/python -m tools.mutants stand-in-outputs --tests tests/test_onnx_standins.py

Each mutant is a one-place edit of the package (a text replacement that must match exactly
once). It is applied to a temporary copy of the repository (never to this tree), and the
mutant's tests run there (``PYTHONPATH`` and the working directory point at the copy, so
``import rewrite`` and subprocesses load the mutant). The table printed says, per mutant, which
tests failed; a mutant no test catches makes the exit code 1.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attrs import frozen

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".venv", ".git", "out", "__pycache__", ".pytest_cache",
                              ".hypothesis", "*.egg-info", "demo-out", "*.onnx", "*.onnx.data")


@frozen
class Mutant:
    name: str
    bug: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]

    def apply(self, root: Path) -> None:
        file = root / self.path
        text = file.read_text()
        if text.count(self.old) != 1:
            raise SystemExit(f"{self.name}: the text to replace occurs {text.count(self.old)} "
                             f"times in {self.path} (the code moved: update the mutant)")
        file.write_text(text.replace(self.old, self.new))

    def patch(self) -> str:
        text = (ROOT / self.path).read_text()
        mutated = text.replace(self.old, self.new)
        return "".join(difflib.unified_diff(text.splitlines(True), mutated.splitlines(True),
                                            f"a/{self.path}", f"b/{self.path}", n=1))


NUMERIC = ("tests/test_onnx_models.py", "tests/test_onnx_perbody.py",
           "tests/test_onnx_standins.py", "tests/test_onnx_decompose.py",
           "tests/test_onnx_input.py", "tests/test_onnx_repeats.py")

PUBLISHING = ("tests/test_publish_kill.py", "tests/test_output_pairs.py")

MUTANTS = (
    Mutant(
        "fx-call-weight",
        "per body: a repeated body's later calls are passed the first call's weights",
        "rewrite/backends/onnx/lowering/_invoke_subgraph.py",
        "(getter, plan.attr, *[env[v] for v in plan.inputs]),",
        "(getter, plan.attr, *[env[self.plans[self.calls[index].first].inputs[k]]\n"
        "                                          if v.op == 'placeholder' else env[v]\n"
        "                                          for k, v in enumerate(plan.inputs)]),",
        NUMERIC,
    ),
    Mutant(
        "fx-call-bias",
        "per body: later calls are passed the first call's 1-d weights (biases, norms) only",
        "rewrite/backends/onnx/lowering/_invoke_subgraph.py",
        "(getter, plan.attr, *[env[v] for v in plan.inputs]),",
        "(getter, plan.attr, *[env[self.plans[self.calls[index].first].inputs[k]]\n"
        "                                          if v.op == 'placeholder'\n"
        "                                          and v.meta['val'].ndim == 1 else env[v]\n"
        "                                          for k, v in enumerate(plan.inputs)]),",
        NUMERIC,
    ),
    Mutant(
        "onnx-call-weight",
        "outlining: each call of a function is passed the first call's initializers",
        "rewrite/backends/onnx/outlining/_call_sites.py",
        "        results = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in outputs]\n",
        "        first = self.__dict__.setdefault('_first_args', {}).setdefault(name, args)\n"
        "        args = [f if a.is_initializer() and f.is_initializer() else a\n"
        "                for a, f in zip(args, first)]\n"
        "        results = [ir.Value(name=v.name, type=v.type, shape=v.shape) for v in outputs]\n",
        NUMERIC,
    ),
    Mutant(
        "lifted-scalar",
        "merging: each call passes the lifted scalar of the next merged body (rotated)",
        "rewrite/backends/onnx/finishing/_merge.py",
        "for fid, value in zip(members, call_value):",
        "for fid, value in zip(members, call_value[1:] + call_value[:1]):",
        ("tests/test_onnx_scalars.py", "tests/test_onnx_policies.py"),
    ),
    Mutant(
        "stand-in-outputs",
        "stand-ins: a stand-in's outputs rewired in reverse order",
        "rewrite/backends/onnx/outlining/_standin_calls.py",
        "outputs = [node.outputs[j] for j in out_at]  # type: ignore[index]",
        "outputs = [node.outputs[j] for j in reversed(out_at)]  # type: ignore[index]",
        ("tests/test_onnx_standins.py", "tests/test_onnx_standin_outputs.py",
         "tests/test_onnx_perbody.py", "tests/test_onnx_models.py"),
    ),
    Mutant(
        "sibling-node",
        "grouping: the last node of a group is placed in its next sibling group",
        "rewrite/grouping/build.py",
        "    group_of = stack_group[sid]\n",
        "    group_of = stack_group[sid].copy()\n"
        "    for _g in range(1, len(parent)):\n"
        "        _sib = [h for h in range(_g + 1, len(parent)) if parent[h] == parent[_g]\n"
        "                and (group_of == h).any()]\n"
        "        _mine = np.flatnonzero((group_of == _g) & ~columns.is_io)\n"
        "        if _sib and len(_mine) > 1:\n"
        "            group_of[_mine[-1]] = _sib[0]\n"
        "            break\n",
        ("tests/test_grouping.py", "tests/test_onnx_models.py", "tests/test_fx_structure.py",
         "tests/test_explain.py", "tests/test_onnx_node_reference.py"),
    ),    Mutant(
        "node-in-caller",
        "outlining: the last node (not an Identity: the optimizer drops those) of the first "
        "nested group is placed in its calling group",
        "rewrite/backends/onnx/outlining/_membership.py",
        "        top = slot[(number == 0) & ~is_io].tolist()\n",
        "        for _g, _direct in list(members.nodes.items()):\n"
        "            _ops = [n for n in _direct if n.op_type != 'Identity']\n"
        "            if members.parent[_g] > 0 and len(_direct) > 1 and _ops:\n"
        "                _moved = _ops[-1]\n"
        "                _direct.remove(_moved)\n"
        "                members.nodes[members.parent[_g]].append(_moved)\n"
        "                members.group_of[_moved] = members.parent[_g]\n"
        "                break\n"
        "        top = slot[(number == 0) & ~is_io].tolist()\n",
        ("tests/test_onnx_node_reference.py", *NUMERIC),
    ),
    Mutant(
        "merge-argument-order",
        "merging: a merged call passes its arguments in its own function's order",
        "rewrite/backends/onnx/finishing/_merge.py",
        "[node.inputs[i] for i in merge.inputs],",
        "list(node.inputs),",
        ("tests/test_onnx_scalars.py", "tests/test_onnx_policies.py",
         "tests/test_onnx_optimize.py", "tests/test_onnx_repeats.py"),
    ),
    Mutant(
        "skipped-cycle-check",
        "grouping: no group is ever found on a cycle",
        "rewrite/grouping/validate.py",
        "    scattered = spans.scattered().tolist()\n",
        "    scattered = []\n",
        ("tests/test_grouping.py",),
    ),
    Mutant(
        "publish-data-first",
        "publishing: the new data replaces the old before the new model is committed",
        "rewrite/files/outputs.py",
        "        if staged.first is not None:\n",
        "        if staged.first is not None:\n            _place_data(staged)\n",
        PUBLISHING,
    ),
    Mutant(
        "publish-model-first",
        "publishing: the final model (reading OUT.onnx.data) goes in before its data",
        "rewrite/files/outputs.py",
        "                _place_data(staged)\n                _fsync(folder)\n"
        "                _reached(\"linked\")\n"
        "                _replace(staged.model, output, mode)\n",
        "                _replace(staged.model, output, mode)\n"
        "                _place_data(staged)\n                _fsync(folder)\n"
        "                _reached(\"linked\")\n",
        PUBLISHING,
    ),
    Mutant(
        "no-lock",
        "publishing: no folder lock (two writers interleave their steps)",
        "rewrite/files/outputs.py",
        "    return _locked(folder)\n",
        "    return contextlib.nullcontext(True)\n",
        PUBLISHING,
    ),
    Mutant(
        "live-staging-cleaned",
        "publishing: a writer's staging folder is not locked (another run's cleaning takes it)",
        "rewrite/files/outputs.py",
        "        with _locked(folder):\n            yield folder\n",
        "        yield folder\n",
        PUBLISHING,
    ),
    Mutant(
        "torch-logs",
        "the CLI: torch.export's log records keep their own handlers (reach stderr)",
        "rewrite/cli/logs.py",
        "        logger.handlers[:] = [sink]\n",
        "        logger.handlers[:] = [*logger.handlers, sink]\n",
        ("tests/test_cli_errors_process.py",),
    ),
)


def _copy() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="rewrite-mutant-"))
    shutil.copytree(ROOT, folder / "repo", ignore=SKIP)
    return folder / "repo"


FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def run(mutant: Mutant | None, tests: tuple[str, ...], python: str
        ) -> tuple[list[str], float, str]:
    """The tests that failed with ``mutant`` applied (to a copy; None: unchanged), seconds,
    pytest's tail."""
    repo = _copy()
    try:
        if mutant is not None:
            mutant.apply(repo)
        env = {**os.environ, "PYTHONPATH": str(repo)}
        start = time.perf_counter()
        proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                               "--tb=no", *tests], cwd=repo, env=env, capture_output=True,
                              text=True)
        failed = sorted(set(FAILED.findall(proc.stdout)))
        tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
        return failed, time.perf_counter() - start, tail
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--tests", nargs="+", help="tests to run instead of the mutant's own")
    parser.add_argument("--list", action="store_true", help="print the mutants' patches")
    parser.add_argument("--control", action="store_true",
                        help="first run every chosen mutant's tests on the unchanged copy "
                        "(they must pass, or a failure would mean nothing)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.list:
        for mutant in chosen:
            print(f"## {mutant.name}: {mutant.bug}\n{mutant.patch()}")
        return 0
    if args.control:
        tests = tuple(dict.fromkeys(t for m in chosen for t in (args.tests or m.tests)))
        failed, seconds, tail = run(None, tests, sys.executable)
        print(f"control (no mutant): {len(failed)} failed in {seconds:.0f} s\n    {tail}")
        if failed:
            print("\n".join(f"    {test}" for test in failed))
            return 1
    missed = []
    for mutant in chosen:
        failed, seconds, tail = run(mutant, tuple(args.tests or mutant.tests), sys.executable)
        print(f"{mutant.name} ({mutant.bug}): {len(failed)} failed in {seconds:.0f} s")
        for test in failed:
            print(f"    {test}")
        if not failed:
            print(f"    NOT CAUGHT\n    {tail}")
            missed.append(mutant.name)
        sys.stdout.flush()
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
