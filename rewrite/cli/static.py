"""``rewrite check-static MODEL.onnx``: what would stop a static-shape compiler."""

from __future__ import annotations

import argparse

from rewrite.cli.args import EXIT_OK, EXIT_RULES
from rewrite.cli.console import Consoles
from rewrite.cli.paths import check_model_path
from rewrite.errors import InputError, first_line, library_call


def cmd_check_static(args: argparse.Namespace, io: Consoles) -> int:
    from rewrite.structure.static import static_obstacles

    path = check_model_path(args.model)
    if not str(path).lower().endswith(".onnx"):
        raise InputError(f"{path}: check-static reads .onnx files")

    def unreadable(e: BaseException) -> InputError:
        return InputError(f"{path}: not a readable ONNX model ({first_line(e)})")

    with library_call("onnx", f"reading {path}", unreadable, parses_input=True):
        found = static_obstacles(path)
    for obstacle in found:
        io.out.print(obstacle.render(), markup=False, highlight=False, soft_wrap=True)
    if not found:
        io.info(f"{path}: every shape static, nothing a static compiler rejects")
        return EXIT_OK
    io.info(f"{path}: {len(found)} things a static compiler would reject")
    return EXIT_RULES
