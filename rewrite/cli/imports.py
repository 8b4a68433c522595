"""``--import MODULE``: import the libraries a model needs (custom operators, output types)."""

from __future__ import annotations

import importlib
import os
import sys

from rewrite.errors import InputError, first_line


def import_modules(modules: list[str]) -> None:
    """Import each module, as ``python -m`` finds them (the current folder, then installed
    packages); a module that is missing or fails to import is an :class:`InputError`."""
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise InputError(f"--import {module}: no module named {e.name!r}") from e
        except (Exception, SystemExit) as e:  # the module's own code failed (or exited)
            raise InputError(
                f"--import {module}: importing it failed: {type(e).__name__}: {first_line(e)}"
            ) from e
