"""``rewrite export DIR -o OUT.onnx [--rules R] [--cache kv|none]``: a checkpoint folder in
(an encoder-decoder with ``--cache kv``: two graphs in OUT's folder)."""

from __future__ import annotations

import argparse

from rewrite.cli.args import EXIT_OK
from rewrite.cli.commands import weights_options
from rewrite.cli.pipeline import load_rules
from rewrite.cli.console import Consoles
from rewrite.cli.logs import no_progress_bars
from rewrite.cli.steps import Steps
from rewrite.errors import InputError


def cmd_export(args: argparse.Namespace, io: Consoles) -> int:
    from pathlib import Path

    output = Path(args.output)
    if output.suffix.lower() != ".onnx":
        raise InputError(f"{output}: rewrite export writes .onnx files")
    rules = load_rules(args.rules) if args.rules is not None else None
    options = weights_options(args.external_data, args.weights_chunk)
    if args.external_data == "never" and isinstance((args.static or {}).get("seq"), tuple):
        raise InputError("several seq= sizes share one data file: they cannot go with "
                         "--external-data never")
    import rewrite

    with no_progress_bars():
        rewrite.export(args.folder, rules=rules, cache=args.cache, context=args.context,
                       static=args.static, output=output,
                       trust_model=args.trust_model, verify=args.verify, trace=args.trace,
                       precision=args.precision, block_size=args.block_size,
                       symmetric=False if args.asymmetric else None, target=args.target,
                       progress=Steps.backend(io),
                       constants=args.constants, optimize=args.optimize,
                       body_node_names=args.body_node_names,
                       fuse_attention=args.fuse_attention,
                       pack_projections=args.pack_projections, **options)
    from rewrite.exporting.checkpoint import read_checkpoint, written

    config = read_checkpoint(args.folder, trust_model=args.trust_model).config
    io.info("wrote " + " and ".join(str(p) for p in written(output, config, args.cache)))
    return EXIT_OK
