"""Structure locks: the structure of a grouped ONNX model as a small text file to commit and
review (``rewrite lock``), checked in CI (``rewrite verify``, ``rewrite diff``,
:func:`rewrite.testing.assert_structure`).

A :class:`Lock` is made from what lowering made (:func:`of_lowering`: functions, main graph,
the rules that made the groups) or from an ``.onnx`` file as it is (:func:`of_model`);
:func:`dumps` / :func:`loads` write and read the file (:mod:`_text` describes it);
:func:`compare` and :func:`render` say what differs. Nothing here reads a weight: functions
take weights as inputs, and the main graph's initializers are not looked at.
"""

from rewrite.structure._build import of_lowering, of_model, read_onnx, rule_text
from rewrite.structure._compare import Change, compare, render
from rewrite.structure._lock import Lock, Section
from rewrite.structure._text import dumps, loads, write

__all__ = ["Change", "Lock", "Section", "compare", "dumps", "loads", "of_lowering", "of_model",
           "read_onnx", "render", "rule_text", "write"]
