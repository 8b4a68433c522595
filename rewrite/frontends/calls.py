"""Module calls from metadata that lacks call indices (shared by the FX and ONNX frontends).

``nn_module_stack`` from ``torch.export`` and today's ``symbolic_trace`` marks the (N+1)-th
call of a module with a ``@N`` key suffix. Older tracers (the ``{path: class}`` form) and the
metadata ``torch.onnx`` writes (``name_scopes``) do not: two calls of a shared module carry
the same path. :func:`split_runs` recovers the calls from the order of the nodes:

* a call is a *contiguous run* of nodes (in topological order) whose stacks hold the path,
  under the same parent call: when a node leaves the path and a later node re-enters it, the
  later node starts the next call (``shared``, then ``shared@1``);
* nodes whose stack is unknown (``None``) are transparent: they neither end nor extend a run;
* call indices count runs per path in order of appearance (``index`` 0, 1, 2...).

Known limit: calls that follow each other with no node of another module in between at the
caller's level (``x = shared(shared(x))``) form one run and cannot be told apart; their inner
calls (``shared.lin``, ``shared.lin@1``) still can.
"""

from __future__ import annotations

from typing import Sequence

from rewrite.ir import ModuleCall, Stack


def _common_prefix_length(a: Stack, b: Stack) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def split_runs(stacks: Sequence[Stack | None]) -> list[Stack | None]:
    """The stacks with every module call renumbered as one call per contiguous run.

    ``stacks[i]`` is node i's stack (outermost call first, call indices ignored for paths
    that recur), or None when unknown. Equal input stacks at consecutive known nodes give the
    same output tuple, so the work is per change of stack, not per node.
    """
    count: dict[str, int] = {}
    calls: dict[tuple[str, str, int], ModuleCall] = {}
    out: list[Stack | None] = []
    prev_in: Stack = ()
    prev_out: Stack = ()
    for stack in stacks:
        if stack is None:
            out.append(None)
            continue
        if stack is not prev_in and stack != prev_in:
            keep = _common_prefix_length(stack, prev_in)
            fresh = []
            for call in stack[keep:]:
                index = count.get(call.path, 0)
                count[call.path] = index + 1
                key = (call.path, call.cls, index)
                renamed = calls.get(key)
                if renamed is None:
                    renamed = calls[key] = ModuleCall(call.path, call.cls, index)
                fresh.append(renamed)
            prev_out = prev_out[:keep] + tuple(fresh)
            prev_in = stack
        out.append(prev_out)
    return out
