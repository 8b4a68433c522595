"""The command line: ``rewrite [-q|-v] {check,explain,apply,suggest,export,lock,verify,diff}
...`` (argparse)."""

from __future__ import annotations

import argparse
import sys

import rewrite

CONSTANT_POLICIES = ("attribute", "embed", "input")
EXTERNAL_DATA = ("auto", "always", "never")
"""``OnnxOptions.constants`` (not imported from the backend: ``check`` should not load torch)."""

EXIT_OK, EXIT_RULES, EXIT_INPUT, EXIT_BUG = 0, 1, 2, 3

EPILOG = """\
exit codes: 0 success, 1 rules or grouping error (verify, diff: the structure differs),
2 unusable input or usage error,
3 a bug in rewrite (rerun with --verbose for the traceback).
RULES is a .rules file, or the name of a shipped one (gpt2, llama, bert, modularize,
split_by_tags). MODEL is a .pt2 (torch.export.save) or a torch.onnx-exported .onnx file."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one line, as documented
        self.print_usage(sys.stderr)
        self.exit(EXIT_INPUT, f"{self.prog}: error: {message}\n")


class _Version(argparse.Action):
    """``--version``, with the versions computed only when asked for."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit(EXIT_OK)


def _verbosity(parser: argparse.ArgumentParser, default) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="print errors only (no warnings, no progress)")
    group.add_argument("-v", "--verbose", action="store_true", default=default,
                       help="print timings and details; a traceback for internal errors")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rewrite",
        description="Group the nodes of PyTorch export graphs by rules; lower the groups to "
        "nested ONNX functions or FX submodules.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    _verbosity(parser, False)
    # the same flags after the command (`rewrite explain ... -q`); SUPPRESS keeps the global ones
    common = argparse.ArgumentParser(add_help=False)
    _verbosity(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    for add in COMMAND_PARSERS:
        add(sub, common)
    return parser


def _add_check(sub, common: argparse.ArgumentParser) -> None:
    check = sub.add_parser("check", parents=[common], help="validate a rules file",
                           description="Parse and compile RULES (and what it includes).")
    check.add_argument("rules", metavar="RULES")


def _add_explain(sub, common: argparse.ArgumentParser) -> None:
    explain = sub.add_parser(
        "explain", parents=[common], help="show the group tree the rules make of a model",
        description="Print the groups RULES makes of MODEL: per group the module call, its "
        "class, node count, the function it becomes and the rule (file:line) that made it.",
    )
    explain.add_argument("rules", metavar="RULES")
    explain.add_argument("model", metavar="MODEL", help=".pt2 or .onnx")
    explain.add_argument("--json", action="store_true", help="print the tree as JSON (stdout)")
    explain.add_argument("--onnx", action="store_true",
                         help="lower to ONNX (slower) and show the functions actually made, "
                         "with their call counts")
    explain.add_argument("--html", metavar="OUT.html",
                         help="lower to ONNX (as --onnx) and write a one-file HTML report: the "
                         "group tree, the functions, and why a class got more than one function")
    explain.add_argument("--depth", type=_positive, metavar="N",
                         help="show N levels of groups (deeper ones are counted)")
    _imports(explain)
    _trust(explain)


def _add_apply(sub, common: argparse.ArgumentParser) -> None:
    apply = sub.add_parser(
        "apply", parents=[common], help="group a model and write the result",
        description="Group MODEL by RULES and write it: .onnx (nested model-local functions) "
        "or .py (the GraphModule's code). The output is written whole or not at all, and "
        "never over an input.",
    )
    apply.add_argument("rules", metavar="RULES")
    apply.add_argument("model", metavar="MODEL", help=".pt2 or .onnx")
    apply.add_argument("-o", "--output", required=True, metavar="OUT",
                       help=".onnx (model-local functions) or .py (GraphModule code)")
    onnx_output_options(apply)
    _imports(apply)
    _trust(apply)


def _add_suggest(sub, common: argparse.ArgumentParser) -> None:
    suggest = sub.add_parser(
        "suggest", parents=[common], help="print a starter rules file for a model",
        description="Print a starter rules file for MODEL: its repeated block classes as "
        "groups (outermost first), its top-level modules with weights (embedding, head, final "
        "norm) as groups, dropout flat; each line with the calls and distinct bodies it gives.",
    )
    suggest.add_argument("model", metavar="MODEL", help=".pt2 or .onnx")
    suggest.add_argument("-o", "--output", metavar="FILE",
                         help="write the rules to FILE instead of stdout")
    suggest.add_argument("--force", action="store_true",
                         help="replace FILE if it exists (never the model)")
    _imports(suggest)
    _trust(suggest)


def onnx_output_options(parser: argparse.ArgumentParser) -> None:
    """The options of every command that writes ONNX (``apply``, and commands like it)."""
    onnx = parser.add_argument_group("ONNX output")
    onnx.add_argument("--constants", choices=CONSTANT_POLICIES, default="attribute",
                      help="small constants in function bodies, scalars where otherwise equal "
                      "blocks differ as function attributes (attribute, the default); in bodies, "
                      "such blocks separate functions (embed); as function inputs, other "
                      "differing scalars as attributes (input)")
    onnx.add_argument("--no-optimize", dest="optimize", action="store_false",
                      help="leave the functions as torch.onnx translated them (no optimizer)")
    onnx.add_argument("--no-body-node-names", dest="body_node_names", action="store_false",
                      help="leave the nodes inside functions unnamed (onnxruntime runs the "
                      "model ~2%% faster: it copies long node names on every run)")
    onnx.add_argument("--external-data", choices=EXTERNAL_DATA, default="auto",
                      help="where the weights go: auto (the default) writes them to "
                      "OUT.onnx.data when they exceed 256 MB, copied straight from the input "
                      "file at disk speed with memory flat in model size, and keeps smaller "
                      "models one self-contained file (rewrite export: always, a deployment "
                      "as onnxruntime-genai's builder writes it); always: OUT.onnx.data "
                      "whatever the size (tensors under 1 KiB, such as shapes, stay in "
                      "OUT.onnx); never: "
                      "inside OUT.onnx (at most 2 GB, which ONNX files cannot "
                      "exceed; serialized in memory, about twice the weights)")
    onnx.add_argument("--weights-chunk", type=_byte_size, metavar="SIZE",
                      help="split the external data into files of at most SIZE (e.g. 10GB, "
                      "512MB; a larger tensor gets a file of its own), as some hardware "
                      "toolchains require; default: one file")


EXPORT_IO = """\
the ONNX model's inputs and outputs (the names optimum and onnxruntime-genai use):
  --cache kv (default)  inputs  input_ids [batch_size, sequence_length],
                                attention_mask [batch_size, total_sequence_length],
                                position_ids [batch_size, sequence_length],
                                past_key_values.N.key / .value
                                [batch_size, kv_heads, past_sequence_length, head_dim]
                                for each layer N (past may be 0: the first step)
                        outputs logits [batch_size, sequence_length, vocab],
                                present.N.key / .value [batch_size, kv_heads,
                                past_sequence_length + sequence_length, head_dim]:
                                feed them back as past_key_values.N.*
  --cache none          inputs  input_ids, attention_mask, position_ids; outputs logits
  --cache static        inputs  input_ids, position_ids [batch_size, sequence_length],
    --context C                 attention_mask [batch_size, C] (1: a slot holding a token),
                                past_key_values.N.key / .value [batch_size, kv_heads, C,
                                head_dim]; outputs logits, present.N.key / .value: the
                                whole buffers, the new tokens written at position_ids
    --static batch=B,seq=S      every shape fixed; several seq= (seq=S,seq=1): one model
                                each, OUT.onnx the first, OUT_seq1.onnx..., all reading
                                one data file, OUT.onnx.data
Each decoder layer's function takes its layer's cache and returns the updated one. Before
the model is published, onnxruntime runs it against eager PyTorch on a few tokens
(--no-verify skips it). Beside a decode-ready model: genai_config.json and the
checkpoint's tokenizer files, a folder onnxruntime-genai runs as is.
An encoder: input_ids, attention_mask [batch_size, sequence_length] (and token_type_ids
where the model takes them); an encoder-decoder: input_ids, attention_mask
[batch_size, encoder_sequence_length], decoder_input_ids [batch_size,
decoder_sequence_length]; outputs: the model's own tensors by name (logits, ...).
An encoder-decoder with --cache kv: two graphs in OUT's folder, one data file:
  encoder_model.onnx    input_ids, attention_mask (Whisper: input_features)
                        -> encoder_hidden_states
  decoder_model.onnx    input_ids, encoder_hidden_states, encoder_attention_mask
                        (not Whisper's),
                        past_key_values.N.decoder.key / .value,
                        past_key_values.N.encoder.key / .value -> logits,
                        present.N.decoder.* and present.N.encoder.*; the first step is
                        fed both pasts empty (0 positions), later ones the presents."""


def _add_export(sub, common: argparse.ArgumentParser) -> None:
    export = sub.add_parser(
        "export", parents=[common], help="a Hugging Face checkpoint folder to grouped ONNX",
        description="Build the model of a checkpoint folder (config.json and *.safetensors, "
        "maybe sharded)\nwith transformers, offline, its weights mapped; export it with "
        "torch.export (dynamic\nbatch, sequence and past); group it by RULES and write it as "
        "apply does.\nText models: causal LMs (decode-ready by default), encoders "
        "(prefill only) and\nencoder-decoders (prefill by default, decode-ready with "
        "--cache kv).",
        epilog=EXPORT_IO, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("folder", metavar="DIR", help="the checkpoint folder")
    export.add_argument("-o", "--output", required=True, metavar="OUT.onnx")
    export.add_argument("--rules", metavar="RULES",
                        help="a .rules file or a shipped name; default: the shipped rules of "
                        "the config's model_type, else what rewrite suggest writes for the "
                        "model (printed, to keep)")
    export.add_argument("--cache", choices=("kv", "none", "static"),
                        help="kv: decode-ready, the KV cache as inputs and outputs (the "
                        "default for causal LMs; an encoder-decoder's encoder_model.onnx and "
                        "decoder_model.onnx in OUT's folder); none: prefill only (the "
                        "default for encoders and encoder-decoders); static: a cache of "
                        "--context tokens written in place at position_ids (fixed shapes "
                        "for NPU compilers)")
    export.add_argument("--context", type=int, metavar="C",
                        help="--cache static: the cache's length in tokens")
    export.add_argument("--static", type=static_sizes, metavar="batch=B,seq=S",
                        help="--cache static: fix the batch and chunk sizes too (every "
                        "shape static); several seq= write one model per chunk length, "
                        "OUT.onnx for the first, OUT_seqS.onnx for each other, all "
                        "reading one data file")
    export.add_argument("--trust-model", action="store_true",
                        help="load model code from the folder (a config with auto_map) or "
                        "pickled *.bin weights: both run code from the folder, only for "
                        "checkpoints you trust. Without it such a folder is refused (exit 2)")
    export.add_argument("--trace", choices=("layers", "whole"), default="layers",
                        help="layers (default): torch.export traces each distinct decoder "
                        "layer once, the other layers are calls of its trace (the export's "
                        "cost flat in depth; where a model cannot be cut so, the whole trace, "
                        "said in one line); whole: torch.export traces every layer")
    export.add_argument("--no-verify", dest="verify", action="store_false",
                        help="publish without first running the written model in onnxruntime "
                        "against eager PyTorch on a few tokens (by default a mismatch is an "
                        "error, exit 1, and nothing is written)")
    export.add_argument("--precision", choices=("fp32", "fp16", "bf16", "int4"),
                        help="fp32, fp16, bf16: build and export the model in that dtype "
                        "(default: the checkpoint's); int4: blockwise 4-bit weights for every "
                        "MatMul (the decoder layers' linears and the lm_head), dequantized "
                        "inside each layer's function (DequantizeLinear, opset 21), and the "
                        "embeddings' tables (4-bit rows, gathered then dequantized)")
    _add_int4(export)
    _add_fusion(export)
    onnx_output_options(export)


def _add_int4(export: argparse.ArgumentParser) -> None:
    """``rewrite export``'s options of ``--precision int4``."""
    export.add_argument("--block-size", type=int, metavar="B",
                        help="--precision int4: values per scale along the input dimension "
                        "(16, 32, 64, 128 or 256; default 32)")
    export.add_argument("--asymmetric", action="store_true", default=None,
                        help="--precision int4: uint4 with zero points (default: symmetric "
                        "int4, as the builder's default)")
    export.add_argument("--target", choices=("onnx", "onnxruntime"), default=None,
                        help="onnx (default) writes standard ops only; onnxruntime writes "
                        "its com.microsoft ops, which other runtimes lack, once in each layer "
                        "function: GroupQueryAttention (a causal model without a sliding "
                        "window; rows padded on the right), SkipSimplifiedLayerNormalization; "
                        "in int4, a tied lm_head reads its embedding's 4-bit table as "
                        "MatMulNBits (one table, as the builder's; symmetric)")


def _add_fusion(export: argparse.ArgumentParser) -> None:
    export.add_argument("--unfused-attention", dest="fuse_attention", action="store_false",
                        help="keep each layer's attention and rotary embedding as torch.onnx "
                        "lowers them (MatMul, Softmax, the grouped KV heads expanded) instead "
                        "of opset-23 Attention and RotaryEmbedding nodes in each layer "
                        "function (the default)")
    export.add_argument("--unpacked-projections", dest="pack_projections",
                        action="store_false",
                        help="keep one MatMul per projection (query, key, value; gate, up) "
                        "instead of one by their weights packed, then a Split, in each layer "
                        "function (the default)")


def _model_or_rules_and_model(parser: argparse.ArgumentParser) -> None:
    """``[RULES] MODEL``: with RULES, MODEL grouped and lowered as ``explain --onnx`` does;
    without, MODEL is an ``.onnx`` file read as it is."""
    parser.add_argument("rules", metavar="RULES", nargs="?",
                        help="a .rules file or a shipped one; omit it to read an .onnx MODEL "
                        "as it is")
    parser.add_argument("model", metavar="MODEL", help=".pt2 or .onnx (.onnx only without RULES)")


def _add_lock(sub, common: argparse.ArgumentParser) -> None:
    lock = sub.add_parser(
        "lock", parents=[common], help="write the structure of a model as a lock file",
        usage="rewrite lock [RULES] MODEL -o FILE",
        description="Write the structure RULES gives MODEL (grouped and lowered to ONNX, no "
        "model written), or of an .onnx MODEL as it is, to FILE: a small text file to commit "
        "and review. Per function its call sites, inputs and outputs (dtype, rank), "
        "attributes, op histogram and body digest; the main graph's ops; per rule (by its "
        "text) the groups it made. No timestamps, no paths, no weights read.",
    )
    _model_or_rules_and_model(lock)
    lock.add_argument("-o", "--output", required=True, metavar="FILE",
                      help="the lock file (written whole or not at all)")
    _imports(lock)
    _trust(lock)


def _add_verify(sub, common: argparse.ArgumentParser) -> None:
    verify = sub.add_parser(
        "verify", parents=[common], help="check a model's structure against a lock file",
        usage="rewrite verify [RULES] MODEL --lock FILE [--update]",
        description="Compare the structure of MODEL (with RULES: grouped and lowered; without: "
        "an .onnx file as it is) with the lock FILE. Exit 0 when they are equal, 1 with what "
        "was added, removed or changed (function and change; for a class that got another "
        "function, why it is distinct), 2 when an input is unusable.",
    )
    _model_or_rules_and_model(verify)
    verify.add_argument("--lock", required=True, metavar="FILE", help="the lock file")
    verify.add_argument("--update", action="store_true",
                        help="rewrite FILE with MODEL's structure (after a reviewed change); "
                        "exit 0")
    _imports(verify)
    _trust(verify)


def _add_diff(sub, common: argparse.ArgumentParser) -> None:
    diff = sub.add_parser(
        "diff", parents=[common], help="compare the structure of two models",
        usage="rewrite diff A B [--rules RULES]",
        description="What changed in structure from model A to model B: .onnx files as they "
        "are, or (with --rules) .pt2 / .onnx files grouped and lowered by RULES. Exit 0 the "
        "same, 1 different (printed as `rewrite verify` prints it), 2 an unusable input.",
    )
    diff.add_argument("a", metavar="A", help="the model before (.onnx, or .pt2 with --rules)")
    diff.add_argument("b", metavar="B", help="the model after")
    diff.add_argument("--rules", metavar="RULES", help="group and lower both models by RULES")
    _imports(diff)
    _trust(diff)


def _add_check_static(sub, common: argparse.ArgumentParser) -> None:
    static = sub.add_parser(
        "check-static", parents=[common], help="what would stop a static-shape compiler",
        description="List what an NPU compiler that wants every shape fixed would reject in "
        "MODEL.onnx: data-dependent ops (NonZero, If, Loop), shapes read at run time, "
        "reductions over axes that are not constants, dimensions that are not numbers. "
        "Exit 0 when there is none, 1 when there are.")
    static.add_argument("model", metavar="MODEL.onnx")


COMMAND_PARSERS = (_add_check, _add_explain, _add_apply, _add_suggest, _add_export,
                   _add_check_static, _add_lock, _add_verify, _add_diff)
"""One function per command, each adding its subparser (in ``--help`` order)."""


def _imports(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar="MODULE",
                        help="import MODULE before reading the model, e.g. the library that "
                        "registers its custom operators (repeatable)")


def _trust(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-model", action="store_true",
                        help="load parts of a .pt2 that only full pickle can read (pickled "
                        "tensors or objects, TorchBind objects, sample inputs). Unpickling "
                        "runs code from the file: only for files you built yourself. "
                        "Without it such a file is refused (exit 2), nothing is run")


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def _byte_size(text: str) -> int:
    """``10GB``, ``512MiB``, ``1.5GB``, ``4096``: a positive number of bytes."""
    number = text.strip().upper().rstrip("S")
    unit = number.lstrip("0123456789._")
    try:
        value = float(number[: len(number) - len(unit)]) * _UNITS[unit.strip()]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (examples: 10GB, 512MB, 2GiB)") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least one byte")
    return int(value)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return value


def version_text() -> str:
    """``rewrite X (torch Y, onnx Z)``."""
    import torch

    parts = [f"torch {torch.__version__}"]
    try:
        import onnx

        parts.append(f"onnx {onnx.__version__}")
    except ImportError:  # pragma: no cover - a dependency
        pass
    return f"rewrite {rewrite.__version__} ({', '.join(parts)})"


def static_sizes(text: str) -> dict[str, int | tuple[int, ...]]:
    """``batch=1,seq=128`` -> ``{"batch": 1, "seq": 128}``; ``seq`` given several times:
    the tuple of them (``batch=1,seq=128,seq=1`` -> ``{"batch": 1, "seq": (128, 1)}``;
    one asked twice is refused by the export, in its words)."""
    batch: list[int] = []
    seqs: list[int] = []
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip() not in ("batch", "seq") or not value.strip().isdigit() \
                or int(value) < 1 or (key.strip() == "batch" and batch):
            raise argparse.ArgumentTypeError(
                f"not batch=B,seq=S[,seq=S2...] (positive sizes, batch once): {text!r}")
        (batch if key.strip() == "batch" else seqs).append(int(value))
    sizes: dict[str, int | tuple[int, ...]] = {"batch": batch[0]} if batch else {}
    if seqs:
        sizes["seq"] = seqs[0] if len(seqs) == 1 else tuple(seqs)
    return sizes
