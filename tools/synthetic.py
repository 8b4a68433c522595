"""Synthetic ``torch.fx`` graphs shaped like exported transformers, at any size.

    .venv/bin/python -m tools.synthetic --nodes 100000     # build one and print its shape

Built directly as a ``torch.fx.Graph`` (no ``torch.export``, no ``GraphModule`` code
generation), with the metadata ``torch.export`` writes: ``nn_module_stack`` in the
``{key: (path, qualified class)}`` form with the root entry and ``@N`` keys, parameters as
placeholders without a stack, ``meta["custom"]`` tags from ``annotate``. The module tree:

    Model
      embed                                  Embedding
      stages.S                               Stage         (8 blocks each)
        stages.S.blocks.B                    Block
          ln_1, ln_2                         LayerNorm
          attn                               Attention
            q_proj k_proj v_proj o_proj      Linear
            rope@N                           Rotary        (one shared module, one call per block)
            drop                             Dropout
          mlp                                MLP
            fc1 fc2                          Linear
            act                              GELU
      norm                                   LayerNorm
      head                                   Linear

Each block is about 50 nodes; one node per block (a constant the block reads) has no stack,
like the nodes graph passes create. The first half of the blocks is tagged
``stage = "encode"``, the rest ``stage = "decode"``.
"""

from __future__ import annotations

import argparse
import time

import torch

aten = torch.ops.aten

PKG = "synth.models"
ROOT_KEY = "L__self__"
BLOCKS_PER_STAGE = 8


def _cls(name: str) -> str:
    return f"{PKG}.{name}"


class _Builder:
    """Appends nodes to a graph with a current module stack and tag set."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.stack: list[tuple[str, tuple[str, str]]] = [(ROOT_KEY, ("", _cls("Model")))]
        self.custom: dict[str, str] | None = None
        self.calls: dict[str, int] = {}
        self.count = 0

    def enter(self, path: str, cls: str) -> None:
        n = self.calls.get(path, 0)
        self.calls[path] = n + 1
        key = f"{ROOT_KEY}.{path}" + (f"@{n}" if n else "")
        self.stack.append((key, (path, _cls(cls))))

    def leave(self) -> None:
        self.stack.pop()

    def _node(self, target, args) -> torch.fx.Node:
        # named up front and args set afterwards: Graph.call_function's naming and argument
        # checks are most of the cost of building a million nodes
        self.count += 1
        node = self.graph.create_node("call_function", target,
                                      name=f"{target._opname}_{self.count}")
        node.args = args
        return node

    def op(self, target, *args) -> torch.fx.Node:
        node = self._node(target, args)
        node.meta["nn_module_stack"] = dict(self.stack)  # a copy per node, as export does
        if self.custom is not None:
            node.meta["custom"] = dict(self.custom)
        return node

    def bare(self, target, *args) -> torch.fx.Node:
        """A node without any metadata (what a graph pass leaves)."""
        return self._node(target, args)

    def module(self, path: str, cls: str, body, *args):
        self.enter(path, cls)
        try:
            return body(*args)
        finally:
            self.leave()


def _linear(b: _Builder, path: str, x, params: list) -> torch.fx.Node:
    w = b.graph.placeholder(f"p_{path.replace('.', '_')}_weight")
    params.append(w)
    return b.module(path, "Linear", lambda: b.op(aten.linear.default, x, w))


def _block(b: _Builder, path: str, x, params: list, const) -> torch.fx.Node:
    def attention(h):
        q = _linear(b, f"{path}.attn.q_proj", h, params)
        k = _linear(b, f"{path}.attn.k_proj", h, params)
        v = _linear(b, f"{path}.attn.v_proj", h, params)
        q, k, v = (b.op(aten.view.default, t, [1, 8, 4, 8]) for t in (q, k, v))
        q, k, v = (b.op(aten.transpose.int, t, 1, 2) for t in (q, k, v))

        def rope(q, k):
            cos = b.op(aten.cos.default, const)
            sin = b.op(aten.sin.default, const)
            q = b.op(aten.add.Tensor, b.op(aten.mul.Tensor, q, cos), b.op(aten.mul.Tensor, q, sin))
            k = b.op(aten.add.Tensor, b.op(aten.mul.Tensor, k, cos), b.op(aten.mul.Tensor, k, sin))
            return q, k

        q, k = b.module("rope", "Rotary", rope, q, k)
        kt = b.op(aten.transpose.int, k, -2, -1)
        s = b.op(aten.div.Tensor, b.op(aten.matmul.default, q, kt), 2.0)
        p = b.op(aten._softmax.default, s, -1, False)
        p = b.module(f"{path}.attn.drop", "Dropout",
                     lambda: b.op(aten.dropout.default, p, 0.1, False))
        o = b.op(aten.matmul.default, p, v)
        o = b.op(aten.transpose.int, o, 1, 2)
        o = b.op(aten.view.default, o, [1, 4, 64])
        return _linear(b, f"{path}.attn.o_proj", o, params)

    def mlp(h):
        h = _linear(b, f"{path}.mlp.fc1", h, params)
        h = b.module(f"{path}.mlp.act", "GELU", lambda: b.op(aten.gelu.default, h))
        return _linear(b, f"{path}.mlp.fc2", h, params)

    def norm(name, h):
        w = b.graph.placeholder(f"p_{path.replace('.', '_')}_{name}_weight")
        params.append(w)
        return b.module(f"{path}.{name}", "LayerNorm",
                        lambda: b.op(aten.layer_norm.default, h, [64], w))

    def body(x):
        h = norm("ln_1", x)
        h = b.module(f"{path}.attn", "Attention", attention, h)
        x = b.op(aten.add.Tensor, x, h)
        h = norm("ln_2", x)
        h = b.module(f"{path}.mlp", "MLP", mlp, h)
        return b.op(aten.add.Tensor, x, h)

    return b.module(path, "Block", body, x)


NODES_PER_BLOCK = 42  # call_function nodes, parameter placeholders and the constant


def synthetic_graph(nodes: int) -> torch.fx.Graph:
    """A graph of about ``nodes`` nodes (at least one block)."""
    blocks = max(1, (nodes - 8) // NODES_PER_BLOCK)
    b = _Builder()
    params: list = []
    ids = b.graph.placeholder("input_ids")
    table = b.graph.placeholder("p_embed_weight")
    x = b.module("embed", "Embedding", lambda: b.op(aten.embedding.default, table, ids))
    for i in range(blocks):
        stage, j = divmod(i, BLOCKS_PER_STAGE)
        b.custom = {"stage": "encode" if i < blocks // 2 else "decode"}
        const = b.bare(aten.arange.default, 8)
        if j == 0:
            b.enter(f"stages.{stage}", "Stage")
        x = _block(b, f"stages.{stage}.blocks.{j}", x, params, const)
        if j == BLOCKS_PER_STAGE - 1 or i == blocks - 1:
            b.leave()
    b.custom = None
    w = b.graph.placeholder("p_norm_weight")
    x = b.module("norm", "LayerNorm", lambda: b.op(aten.layer_norm.default, x, [64], w))
    x = _linear(b, "head", x, params)
    b.graph.output((x,))
    _move_placeholders_first(b.graph)
    return b.graph


def _move_placeholders_first(graph: torch.fx.Graph) -> None:
    """Put every placeholder before the first other node, as in exported graphs."""
    first = next(n for n in graph.nodes if n.op != "placeholder")
    for node in list(graph.nodes):
        if node.op == "placeholder":
            first.prepend(node)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    args = parser.parse_args()
    start = time.perf_counter()
    graph = synthetic_graph(args.nodes)
    elapsed = time.perf_counter() - start
    count = len(graph.nodes)
    depth = max(len(n.meta.get("nn_module_stack", ())) for n in graph.nodes)
    calls = {k for n in graph.nodes for k in n.meta.get("nn_module_stack", {})}
    print(f"{count} nodes, {len(calls)} module calls, stack depth up to {depth}, "
          f"built in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
