"""``rewrite suggest MODEL [-o FILE] [--force]``: print or write a starter rules file."""

from __future__ import annotations

import argparse

from rewrite.cli.args import EXIT_OK
from rewrite.cli.console import Consoles
from rewrite.cli.imports import import_modules
from rewrite.cli.paths import check_model_path
from rewrite.cli.steps import Steps
from rewrite.errors import InputError
from rewrite.files.outputs import check_output_path, write_text_atomic


def cmd_suggest(args: argparse.Namespace, io: Consoles) -> int:
    import_modules(args.imports)
    check_model_path(args.model)
    output = None
    if args.output is not None:
        output = check_output_path(args.output, [args.model])
        if output.exists() and not args.force:
            raise InputError(f"{output}: exists; use --force to replace it")
    from rewrite.suggest import render, suggest

    with Steps.of(io).step(f"reading {args.model}"):
        suggestion = suggest(args.model, trust_model=args.trust_model)
    for warning in suggestion.warnings:
        io.warning(f"{args.model}: {warning.message}")
    text = render(suggestion, str(output) if output is not None else None)
    if output is None:
        io.out.file.write(text)
        io.out.file.flush()
    else:
        write_text_atomic(output, text)
        io.info(f"wrote {output}")
    return EXIT_OK
