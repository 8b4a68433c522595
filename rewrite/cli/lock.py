"""``rewrite lock``, ``rewrite verify`` and ``rewrite diff``: a model's structure as a lock
file, compared with a lock or with another model (:mod:`rewrite.structure`).

A model is read with RULES (grouped and lowered, no file written, as ``explain --onnx``) or,
without them, an ``.onnx`` file as it is (its functions as they are).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rewrite.cli.args import EXIT_OK, EXIT_RULES
from rewrite.cli.pipeline import group_model, load_rules, lower_model
from rewrite.cli.console import Consoles
from rewrite.cli.imports import import_modules
from rewrite.cli.paths import check_model_path
from rewrite.cli.steps import Steps
from rewrite.errors import InputError
from rewrite.files.outputs import check_output_path

EXIT_DIFFERENT = EXIT_RULES
"""A structure that differs from the lock (or the other model): 1, like a grouping error."""


def structure(rules_arg: str | None, model: str, args: argparse.Namespace, io: Consoles):
    """The :class:`rewrite.structure.Lock` of ``model``, grouped and lowered by
    ``rules_arg``, or read as it is (an ``.onnx`` file) when it is None."""
    from rewrite import structure as locks

    path = check_model_path(model)
    steps = Steps.of(io)
    if rules_arg is None:
        if path.suffix.lower() != ".onnx":
            raise InputError(f"{model}: a .pt2 is read with rules: give RULES before it (or "
                             "--rules for diff); only an .onnx file is read as it is")
        from rewrite.frontends.onnx.check import check_onnx_input

        with steps.step(f"reading {model}"):
            check_onnx_input(model)
            return locks.of_model(locks.read_onnx(model))
    rules = load_rules(rules_arg)
    import_modules(args.imports)
    result = group_model(rules, model, io, steps, args.trust_model)
    return locks.of_lowering(lower_model(result, io, check_weights=False))


def _inputs(args: argparse.Namespace) -> list[str]:
    return [p for p in (args.rules, args.model) if p is not None]


def _read_lock(path: str, missing_ok: bool = False):
    from rewrite import structure as locks

    lock = Path(path)
    if missing_ok and not lock.exists():
        return None
    try:
        text = lock.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{lock}: no such lock file (write one with `rewrite lock`, or "
                         "`rewrite verify ... --update`)") from None
    except UnicodeDecodeError:
        raise InputError(f"{lock}: malformed lock: not UTF-8 text") from None
    return locks.loads(text, str(lock))


def cmd_lock(args: argparse.Namespace, io: Consoles) -> int:
    from rewrite import structure as locks

    output = check_output_path(args.output, _inputs(args))
    found = structure(args.rules, args.model, args, io)
    locks.write(output, found)
    io.info(f"wrote {output}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, io: Consoles) -> int:
    from rewrite import structure as locks

    if args.update:
        check_output_path(args.lock, _inputs(args))
    expected = _read_lock(args.lock, missing_ok=args.update)
    found = structure(args.rules, args.model, args, io)
    changes = locks.compare(expected, found) if expected is not None else ()
    if expected is not None and not changes:
        io.info(f"{args.model}: the structure matches {args.lock}")
        return EXIT_OK
    if changes:
        print(locks.render(changes, args.lock, args.model), file=io.out.file)
    if args.update:
        locks.write(args.lock, found)
        io.info(f"updated {args.lock}")
        return EXIT_OK
    io.error(f"{args.model}: the structure differs from {args.lock}; after review, "
             "accept it with --update")
    return EXIT_DIFFERENT


def cmd_diff(args: argparse.Namespace, io: Consoles) -> int:
    from rewrite import structure as locks

    old = structure(args.rules, args.a, args, io)
    new = structure(args.rules, args.b, args, io)
    changes = locks.compare(old, new)
    if not changes:
        io.info(f"{args.a} and {args.b}: the same structure")
        return EXIT_OK
    print(locks.render(changes, args.a, args.b), file=io.out.file)
    return EXIT_DIFFERENT


__all__ = ["cmd_diff", "cmd_lock", "cmd_verify", "structure"]
