"""The three commands. Each returns an exit code or raises a :class:`RewriteError`."""

from __future__ import annotations

import argparse
import json

import rewrite
from rewrite.cli.args import EXIT_OK
from rewrite.cli.console import Consoles
from rewrite.cli.imports import import_modules
from rewrite.cli.paths import check_model_path
from rewrite.cli.render import Calls, FunctionUse, print_tree, print_variants, summary_line
from rewrite.cli.steps import Steps
from rewrite.errors import InputError
from rewrite.cli.pipeline import group_model, load_rules, lower_model
from rewrite.frontends.onnx.check import unwritable_input
from rewrite.files.outputs import check_output_path

OUTPUT_SUFFIXES = (".onnx", ".py")


def weights_options(external_data: str, chunk: int | None) -> dict:
    """``OnnxOptions`` fields for ``--external-data`` and ``--weights-chunk``."""
    if chunk is not None and external_data == "never":
        raise InputError("--weights-chunk writes external data; it cannot go with "
                         "--external-data never")
    thresholds = {"always": 0, "never": 2**63}
    options: dict = {"weights_chunk": chunk}
    if external_data in thresholds:
        options["external_data_threshold"] = thresholds[external_data]
    return options


def cmd_check(args: argparse.Namespace, io: Consoles) -> int:
    rules = load_rules(args.rules)
    if not io.quiet:
        n = len(rules.rules) + (1 if rules.split else 0)
        files = f" from {len(rules.files)} files" if len(rules.files) > 1 else ""
        io.out.print(f"{args.rules}: ok ({n} rules{files})")
    for name in rules.files[1:]:
        io.detail(f"  includes {name}")
    return EXIT_OK


def calls_of(lowering) -> Calls:
    """Group id -> the function it became and its call sites, from the ONNX backend's
    ``Lowering`` (``outlined.function_of`` and ``outlined.calls``)."""
    from rewrite.backends.onnx.summary import label

    outlined = lowering.outlined
    counts = outlined.calls
    calls: dict[str, FunctionUse | None] = {}
    for group_id, fid in outlined.function_of.items():
        if fid is None:
            calls[group_id] = None
        else:
            calls[group_id] = FunctionUse(label(fid), counts[fid])
    return calls


def _json(result: rewrite.Result, args: argparse.Namespace, lowering) -> dict:
    data = result.explain()
    data["model"] = args.model
    data["rules"] = args.rules
    data["version"] = rewrite.__version__
    if lowering is not None:
        from rewrite.cli.lowered import lowering_to_dict

        calls = calls_of(lowering)
        def add(group: dict) -> None:
            use = calls.get(group["id"], None)
            group["onnx_function"] = use.label if use else None
            group["onnx_calls"] = use.calls if use else 0
            for child in group["children"]:
                add(child)

        for group in data["groups"]:
            add(group)
        data["onnx_functions"] = len({u.label for u in calls.values() if u is not None})
        data["onnx"] = lowering_to_dict(lowering)
    return data


def cmd_explain(args: argparse.Namespace, io: Consoles) -> int:
    rules = load_rules(args.rules)
    check_model_path(args.model)
    report = None
    if args.html is not None:
        from rewrite.cli.html import check_report_path

        report = check_report_path(args.html, [args.model, args.rules, *rules.files])
    import_modules(args.imports)
    steps = Steps.of(io)
    result = group_model(rules, args.model, io, steps, args.trust_model)
    lowering = lower_model(result, io) if args.onnx or report else None
    data = _json(result, args, lowering) if args.json or report else None
    if report is not None:
        from rewrite.cli.html import write_report

        with steps.step(f"writing {report}"):
            write_report(report, data, title=f"{args.model} by {args.rules}",
                         summary=summary_line(result.tree))
    if args.json:
        print(json.dumps(data, indent=2), file=io.out.file)
    else:
        calls = calls_of(lowering) if lowering is not None else None
        print_tree(io.out, result.tree, title=f"{args.model} by {args.rules}: "
                   f"{summary_line(result.tree)}", calls=calls, max_depth=args.depth,
                   qualified=io.verbose, measures=io.verbose)
        if lowering is not None:
            print_variants(io.out, lowering.outlined.variants, lowering.outlined.calls)
    if report is not None:
        io.info(f"wrote {report}")
    return EXIT_OK


def cmd_apply(args: argparse.Namespace, io: Consoles) -> int:
    rules = load_rules(args.rules)
    check_model_path(args.model)
    output = check_output_path(args.output, [args.model, args.rules, *rules.files])
    suffix = output.suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise InputError(
            f"{output}: unknown output type {suffix or '(no extension)'!r}; use .onnx (model-local "
            "functions) or .py (GraphModule code)"
        )
    import_modules(args.imports)
    steps = Steps.of(io)
    result = group_model(rules, args.model, io, steps, args.trust_model)
    if suffix == ".onnx":
        from onnx_ir.serde import SerdeError

        from rewrite.backends.onnx import save_onnx

        try:
            lowering = save_onnx(result, output, progress=Steps.backend(io),
                                 constants=args.constants, optimize=args.optimize,
                                 body_node_names=args.body_node_names,
                                 **weights_options(args.external_data, args.weights_chunk))
        except SerdeError as e:
            raise unwritable_input(args.model, e) or e
        for warning in lowering.warnings:  # save_onnx printed them; --verbose: their causes
            io.trace(warning.cause)
        if io.verbose:  # what each group became, on stderr (stdout stays empty)
            print_tree(io.err, lowering.tree, title=f"{output}: functions by group",
                       calls=calls_of(lowering), qualified=True)
    else:
        from rewrite.backends.fx import save_python

        with steps.step(f"writing {output}"):
            save_python(result, output)
    io.info(f"wrote {output}")
    return EXIT_OK


__all__ = ["cmd_apply", "cmd_check", "cmd_explain"]

