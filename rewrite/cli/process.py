"""``rewrite`` as a process: the command, with Python's cyclic garbage collector set for a
short batch process.

Loading a program and lowering it make a few million objects that mostly live until the
process ends, and with the collector's defaults every full collection scans all of them
again: on the 48-block GPT-2, ``rewrite apply`` spent ~40% of its time in ~9 full
collections (3 while torch imports, 4 while the program loads, 1 after lowering, 1 when the
interpreter exits) that found almost nothing to free. Here the collector is paused while the
command's modules import, what they made is frozen (``gc.freeze``: never scanned again),
collections are made rarer (:data:`THRESHOLDS`: young garbage is still collected, full
collections are left for processes that run long), and what is alive when the command ends
is frozen too, so that the interpreter's last collection has nothing to scan. Then the
process exits once the exit handlers have run (``atexit``: logging, weak reference
finalizers, a coverage tool's), without the interpreter's teardown, which deallocated the
program and the model one object at a time (~0.15 s); every output is written, closed and
renamed into place before the command returns.

Only for the process's entry points (the ``rewrite`` script, ``python -m rewrite``): a
program calling :func:`rewrite.cli.main.main` keeps its collector as it is.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import NoReturn

THRESHOLDS = (1_000_000, 50, 100)
"""``gc.set_threshold``: a young collection every million allocations (default 700), so
that a command of a few seconds collects a few times at most (100,000 still cost ~0.2 s on
the 48-block GPT-2), while a long one still frees its cyclic garbage."""


def run() -> NoReturn:
    """Run the ``rewrite`` command of ``sys.argv`` and exit with its code."""
    gc.disable()
    try:
        from rewrite.cli.main import main
    except KeyboardInterrupt:  # Ctrl-C while torch imports: as during the command
        print("interrupted", file=sys.stderr)
        _exit(130)
    finally:
        gc.freeze()
        gc.set_threshold(*THRESHOLDS)
        gc.enable()
    code = main()
    gc.freeze()
    _exit(code)


def _exit(code: int) -> NoReturn:
    """Exit with ``code``: the exit handlers run, the streams are flushed, the interpreter's
    teardown is skipped (without CPython's ``atexit._run_exitfuncs``: a normal exit)."""
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None:  # pragma: no cover - not CPython
        sys.exit(code)
    run_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone (a closed pipe): nothing to flush
            pass
    os._exit(code)
