"""The ``rewrite`` command: ``check``, ``explain`` and ``apply``.

Exit codes: 0 success, 1 rules or grouping error, 2 unusable input or usage error. User
mistakes print a one-line reason (or ``file:line:col`` diagnostics), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

from rich.console import Console

import rewrite
from rewrite.errors import Diagnostic, InputError, RewriteError

EXIT_OK, EXIT_RULES, EXIT_INPUT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one line, as documented
        self.print_usage(sys.stderr)
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rewrite",
        description="Group the nodes of PyTorch export graphs by rules; lower the groups to "
        "nested ONNX functions or FX submodules.",
    )
    parser.add_argument("--version", action="version", version=f"rewrite {rewrite.__version__}")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    verbosity.add_argument("-v", "--verbose", action="store_true", help="print more detail")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    check = sub.add_parser("check", help="validate a rules file")
    check.add_argument("rules", metavar="RULES")

    explain = sub.add_parser("explain", help="show the group tree the rules make of a model")
    explain.add_argument("rules", metavar="RULES")
    explain.add_argument("model", metavar="MODEL", help=".pt2 or .onnx")
    explain.add_argument("--json", action="store_true", help="print the tree as JSON")

    apply = sub.add_parser("apply", help="group a model and write the result")
    apply.add_argument("rules", metavar="RULES")
    apply.add_argument("model", metavar="MODEL", help=".pt2 or .onnx")
    apply.add_argument("-o", "--output", required=True, metavar="OUT",
                       help=".onnx (model-local functions) or .py (GraphModule code)")
    return parser


def _print_warnings(err: Console, warnings, quiet: bool) -> None:
    if quiet:
        return
    for w in warnings:
        err.print(w.render(), markup=False, highlight=False)


def _cmd_check(args, out: Console, err: Console) -> int:
    rules = rewrite.load_rules(args.rules)
    if not args.quiet:
        n = len(rules.rules) + (1 if rules.split else 0)
        out.print(f"{args.rules}: ok ({n} rules)", markup=False, highlight=False)
    return EXIT_OK


def _check_model_path(path: str) -> None:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, expected a .pt2 or .onnx file")


def _cmd_explain(args, out: Console, err: Console) -> int:
    rules = rewrite.load_rules(args.rules)
    _check_model_path(args.model)
    result = rewrite.apply(rules, args.model)
    if args.json:
        data = result.explain()
        data["model"] = args.model
        data["rules"] = args.rules
        print(json.dumps(data, indent=2))
    else:
        from rewrite.cli.render import render_tree

        out.print(render_tree(result.tree, title=f"{args.model} by {args.rules}"))
    _print_warnings(err, result.warnings, args.quiet)
    return EXIT_OK


def _cmd_apply(args, out: Console, err: Console) -> int:
    from rewrite.outputs import check_output_path

    rules = rewrite.load_rules(args.rules)
    _check_model_path(args.model)
    output = check_output_path(args.output, [args.model, args.rules])
    suffix = output.suffix.lower()
    if suffix not in (".onnx", ".py"):
        raise InputError(f"{output}: unknown output type {suffix or '(none)'!r}; use .onnx or .py")
    result = rewrite.apply(rules, args.model)
    _print_warnings(err, result.warnings, args.quiet)
    if suffix == ".onnx":
        from rewrite.backends.onnx import save_onnx

        save_onnx(result, output, console=None if args.quiet else err)
    else:
        from rewrite.backends.fx import save_python

        save_python(result, output)
    if not args.quiet:
        err.print(f"wrote {output}", markup=False, highlight=False)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    command = {"check": _cmd_check, "explain": _cmd_explain, "apply": _cmd_apply}[args.command]
    try:
        return command(args, out, err)
    except RewriteError as e:
        err.print(e.render(), markup=False, highlight=False)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("interrupted", markup=False)
        return 130
    except Exception as e:  # a bug in rewrite, not a user mistake
        if args.verbose:
            traceback.print_exc()
        err.print(
            f"rewrite: internal error: {type(e).__name__}: {e}\n"
            "  this is a bug in rewrite; rerun with --verbose for the traceback and report it",
            markup=False, highlight=False,
        )
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
