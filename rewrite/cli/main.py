"""The ``rewrite`` command: ``check``, ``explain``, ``apply``, ``suggest``, ``export``,
``lock``, ``verify`` and ``diff``.

Exit codes: 0 success, 1 rules or grouping error, 2 unusable input or usage error, 3 a bug in
rewrite. User mistakes print a one-line reason (or ``file:line:col`` diagnostics) on stderr,
never a traceback; ``--verbose`` adds the traceback of internal errors.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
import warnings

from rewrite.cli.args import EXIT_BUG, EXIT_INPUT, build_parser
from rewrite.cli.commands import cmd_apply, cmd_check, cmd_explain
from rewrite.cli.console import Consoles
from rewrite.cli.export import cmd_export
from rewrite.cli.lock import cmd_diff, cmd_lock, cmd_verify
from rewrite.cli.static import cmd_check_static
from rewrite.cli.logs import quiet_libraries
from rewrite.cli.suggest import cmd_suggest
from rewrite.errors import RewriteError, first_line

COMMANDS = {"check": cmd_check, "explain": cmd_explain, "apply": cmd_apply,
            "suggest": cmd_suggest, "export": cmd_export, "lock": cmd_lock,
            "verify": cmd_verify, "diff": cmd_diff, "check-static": cmd_check_static}
WITHOUT_TORCH = ("check", "check-static")
"""Commands that run neither torch nor what it drives (their logs are not quieted: no torch
import for them)."""


def _os_error(e: OSError) -> str:
    """``path: reason``, like the other input errors."""
    if e.filename is None:
        return f"rewrite: {e.strerror or e}"
    return f"{e.filename}: {e.strerror or e}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_INPUT
    io = Consoles.create(quiet=args.quiet, verbose=args.verbose)
    try:
        quiet = contextlib.nullcontext() if args.command in WITHOUT_TORCH else quiet_libraries()
        with warnings.catch_warnings(), quiet:  # stderr: the command's own lines
            if not sys.warnoptions:  # library chatter (torch, transformers); -W shows it
                warnings.simplefilter("ignore")
            return COMMANDS[args.command](args, io)
    except RewriteError as e:
        io.error(e.render())
        io.trace(e.__cause__)  # --verbose: the dependency's exception behind it
        return e.exit_code
    except KeyboardInterrupt:
        io.error("interrupted")
        return 130
    except BrokenPipeError:  # `rewrite explain ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # the system refused something: a file, a device, disk space
        io.error(_os_error(e))
        return EXIT_INPUT
    except MemoryError:
        io.error("rewrite: out of memory (the model is too large for this machine)")
        return EXIT_INPUT
    except Exception as e:  # a bug in rewrite, not a user mistake
        if args.verbose:
            traceback.print_exc()
        first = first_line(e)
        io.error(
            f"rewrite: internal error: {type(e).__name__}: {first}\n"
            "  this is a bug in rewrite; rerun with --verbose for the traceback and report it"
        )
        return EXIT_BUG


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
