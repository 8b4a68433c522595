"""Mutations of model files for :mod:`tools.fuzz_models`: each writes one broken (or oddly
formed) copy of a real export and returns ``name: detail``."""

from __future__ import annotations

import json
import random
import warnings
import zipfile
from pathlib import Path
from typing import Callable

import onnx

NAME_SCOPES = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY = "pkg.torch.onnx.class_hierarchy"

GARBAGE = [
    "", "garbage", "[", "]", "[1, 2]", "{'a': 1}", "None", "('', 'h.0')", "['']", "[[]]",
    "['', 'h.0']", "['', 'h.0', 'h.0', 'x']", "['', 'h.0.attn', 'h.0', 'x']", "[" * 300,
    "['x'] * 3", "[''," + "'a'," * 500 + "'z']", "\x00", "['', '\\u2028', 'x']",
    "['', 'h.0', 1]", "['', None, 'x']", "['', '', '', 'x']", "['', '**', 'x']",
    "['', 'a b', 'x']", "['', 'h.0@1', 'x']", "['', '.', 'x']", "[\"\", \"h'0\", \"x\"]",
    "['', 'é', 'x']", "__import__('os')", "['', 'h.0', 'x'] + ['y']",
]
FUNCTION_NAMES = [("GPT2Block", "pkg.transformers"), ("GPT2Attention", "pkg.transformers"),
                  ("GPT2MLP", "pkg.transformers"), ("LlamaDecoderLayer", "pkg.transformers"),
                  ("Linear", "pkg.torch"), ("Sub", "pkg.tools"), ("FinalLayerNorm", "pkg.torch")]


# --- ONNX ------------------------------------------------------------------------------------


def _node(model: onnx.ModelProto, rng: random.Random) -> onnx.NodeProto:
    return rng.choice(list(model.graph.node))


def _set_meta(node: onnx.NodeProto, key: str, value: str | None) -> None:
    kept = [p for p in node.metadata_props if p.key != key]
    del node.metadata_props[:]
    node.metadata_props.extend(kept)
    if value is not None:
        node.metadata_props.add(key=key, value=value)


def _meta(node: onnx.NodeProto, key: str) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == key), None)


def remove_node(m, rng):
    i = rng.randrange(len(m.graph.node))
    name = m.graph.node[i].op_type
    del m.graph.node[i]
    return f"node {i} ({name})"


def dangling_input(m, rng):
    node = rng.choice([n for n in m.graph.node if n.input] or list(m.graph.node))
    if node.input:
        node.input[rng.randrange(len(node.input))] = "fuzz_missing"
    return node.op_type


def rename_output(m, rng):
    node = _node(m, rng)
    node.output[rng.randrange(len(node.output))] = "fuzz_renamed"
    return node.op_type


def duplicate_output(m, rng):
    a, b = rng.sample(list(m.graph.node), 2)
    b.output[0] = a.output[0]
    return f"{a.op_type}/{b.op_type}"


def swap_nodes(m, rng):
    i, j = rng.sample(range(len(m.graph.node)), 2)
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(m.graph.node[i])
    b.CopyFrom(m.graph.node[j])
    m.graph.node[i].CopyFrom(b)
    m.graph.node[j].CopyFrom(a)
    return f"{i}<->{j}"


def unknown_op(m, rng):
    node = _node(m, rng)
    node.op_type = "FuzzOp"
    return "FuzzOp"


def remove_initializer(m, rng):
    if not m.graph.initializer:
        return "none"
    i = rng.randrange(len(m.graph.initializer))
    name = m.graph.initializer[i].name
    del m.graph.initializer[i]
    return name


def bad_graph_output(m, rng):
    m.graph.output[rng.randrange(len(m.graph.output))].name = "fuzz_nowhere"
    return "fuzz_nowhere"


def metadata_garbage(m, rng):
    key = rng.choice([NAME_SCOPES, CLASS_HIERARCHY])
    count = rng.choice([1, 3, len(m.graph.node)])
    value = rng.choice(GARBAGE)
    for node in rng.sample(list(m.graph.node), min(count, len(m.graph.node))):
        _set_meta(node, key, value)
    return f"{key.rsplit('.', 1)[1]} x{count} = {value[:20]!r}"


def metadata_mismatch(m, rng):
    """``name_scopes`` and ``class_hierarchy`` of different lengths."""
    nodes = [n for n in m.graph.node if _meta(n, NAME_SCOPES)] or list(m.graph.node)
    for node in rng.sample(nodes, min(rng.choice([1, 5, 50]), len(nodes))):
        scopes = _meta(node, NAME_SCOPES) or "['', 'x']"
        _set_meta(node, NAME_SCOPES, scopes[:-1] + ", 'extra']" if scopes.endswith("]")
                  else scopes)
    return "extra scope"


def metadata_shuffle(m, rng):
    props = [list(n.metadata_props) for n in m.graph.node]
    rng.shuffle(props)
    for node, p in zip(m.graph.node, props):
        del node.metadata_props[:]
        node.metadata_props.extend(p)
    return "all nodes"


def metadata_swap_keys(m, rng):
    """One node's scopes with another's classes (same length, wrong pairing)."""
    a, b = rng.sample(list(m.graph.node), 2)
    _set_meta(a, CLASS_HIERARCHY, _meta(b, CLASS_HIERARCHY))
    return f"{a.op_type}<-{b.op_type}"


def metadata_strip(m, rng):
    nodes = list(m.graph.node)
    for node in rng.sample(nodes, rng.randrange(1, len(nodes) + 1)):
        del node.metadata_props[:]
    return "stripped"


def existing_function(m, rng):
    """A function already present with a name rewrite wants, called or not."""
    name, domain = rng.choice(FUNCTION_NAMES)
    version = next((o.version for o in m.opset_import if o.domain == ""), 18)
    function = onnx.helper.make_function(
        domain, name, ["x"], ["y"], [onnx.helper.make_node("Identity", ["x"], ["y"])],
        [onnx.helper.make_opsetid("", version)])
    m.functions.append(function)
    if not any(o.domain == domain for o in m.opset_import):
        m.opset_import.append(onnx.helper.make_opsetid(domain, 1))
    called = rng.random() < 0.5
    if called:  # route one value through it
        node = rng.choice([n for n in m.graph.node if n.output])
        old = node.output[0]
        node.output[0] = old + "_fuzz_pre"
        call = onnx.helper.make_node(name, [node.output[0]], [old], domain=domain,
                                     name="fuzz_call")
        index = list(m.graph.node).index(node)
        m.graph.node.insert(index + 1, call)
    return f"{domain}::{name}" + (" called" if called else "")


def bad_opset(m, rng):
    del m.opset_import[:]
    return "no opset imports"


def bad_ir_version(m, rng):
    m.ir_version = rng.choice([0, 1, 99])
    return str(m.ir_version)


def unchanged(m, rng):
    return "control"


ONNX_MUTATIONS: dict[str, Callable] = {f.__name__: f for f in (
    remove_node, dangling_input, rename_output, duplicate_output, swap_nodes, unknown_op,
    remove_initializer, bad_graph_output, metadata_garbage, metadata_mismatch,
    metadata_shuffle, metadata_swap_keys, metadata_strip, existing_function, bad_opset,
    bad_ir_version, unchanged)}
BYTE_MUTATIONS = ("truncate", "byte_flip")


def mutate_onnx(data: bytes, rng: random.Random, out: Path) -> str:
    """Write a mutated copy of the ONNX file ``data`` to ``out``; ``name: detail``."""
    kind = rng.choice([*ONNX_MUTATIONS, *BYTE_MUTATIONS])
    if kind in BYTE_MUTATIONS:
        out.write_bytes(_bytes(kind, data, rng))
        return kind
    model = onnx.load_from_string(data)
    detail = ONNX_MUTATIONS[kind](model, rng)
    out.write_bytes(model.SerializeToString())
    return f"{kind}: {detail}"


def _bytes(kind: str, data: bytes, rng: random.Random) -> bytes:
    if kind == "truncate":
        return data[: rng.randrange(1, len(data))]
    flipped = bytearray(data)
    for _ in range(rng.choice([1, 4, 32])):
        flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
    return bytes(flipped)


# --- .pt2 ------------------------------------------------------------------------------------

STACK_GARBAGE = [
    "", ",", ";", ",,", "x", "L__self__", "L__self__,,", "a,b", "a,b,c,d", ";;;",
    "L__self__,h.0,", "L__self__,,cls;L__self__,,cls", "k,h.0,transformers.X;k,h.0,Y",
    "k,h.0.attn,A;j,h.0,B", "k,\u00e9,C", "k,h.0,C" * 50, "k,h.[0],C", "k,h.0@x,C",
]


def _stack_value(rng: random.Random, current: str) -> str:
    choice = rng.random()
    if choice < 0.5:
        return rng.choice(STACK_GARBAGE)
    entries = current.split(";")
    if choice < 0.7 and len(entries) > 1:  # drop the root entry, or reverse the nesting
        return ";".join(entries[1:] if rng.random() < 0.5 else entries[::-1])
    if choice < 0.85:  # a field too many or too few in one entry
        i = rng.randrange(len(entries))
        entries[i] = entries[i] + ",extra" if rng.random() < 0.5 else entries[i].split(",")[0]
        return ";".join(entries)
    return current + ";" + current  # the same calls twice


ARCHIVE_MUTATIONS = ("entry_dropped", "entry_twice", "weights_deflated", "meta_too_big",
                     "pickled_weight", "bomb")
"""Broken archives (the zip, not the program): each must load or be refused clearly."""


def _archive(path: Path, rng: random.Random, out: Path, kind: str) -> str:
    """A copy of the ``.pt2`` zip at ``path`` broken as ``kind`` (:data:`ARCHIVE_MUTATIONS`)."""
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        weights = [i for i in infos if "/data/weights/weight_" in i.filename]
        target = rng.choice(weights)
        with zipfile.ZipFile(out, "w") as copy, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns about a duplicate name
            for info in infos:
                content = archive.read(info)
                method = zipfile.ZIP_STORED
                if info.filename.endswith("weights_config.json") and kind in (
                        "meta_too_big", "pickled_weight"):
                    content = _broken_config(content, target.filename, kind)
                if info is target:
                    if kind == "entry_dropped":
                        continue
                    if kind == "bomb":
                        content, method = bytes(len(content) * 1000 + 64), zipfile.ZIP_DEFLATED
                if kind == "weights_deflated" and info in weights:
                    method = zipfile.ZIP_DEFLATED
                copy.writestr(info.filename, content, compress_type=method)
                if kind == "entry_twice" and info is target:
                    copy.writestr(info.filename, content)
    return f"pt2 {kind}: {target.filename.rsplit('/', 1)[-1]}"


def _broken_config(content: bytes, entry: str, kind: str) -> bytes:
    config = json.loads(content)
    for meta in config["config"].values():
        if entry.endswith("/" + meta["path_name"]):
            if kind == "pickled_weight":
                meta["use_pickle"] = True
            else:
                meta["tensor_meta"]["sizes"][0]["as_int"] += 7
    return json.dumps(config).encode()


def mutate_pt2(path: Path, rng: random.Random, out: Path) -> str:
    """Write a copy of the ``.pt2`` at ``path`` with malformed ``nn_module_stack`` entries
    (or truncated / flipped bytes, or a broken archive) to ``out``; ``name: detail``."""
    data = path.read_bytes()
    kind = rng.choice(["nn_module_stack", "nn_module_stack", "stack_removed", *BYTE_MUTATIONS,
                       *ARCHIVE_MUTATIONS])
    if kind in BYTE_MUTATIONS:
        out.write_bytes(_bytes(kind, data, rng))
        return f"pt2 {kind}"
    if kind in ARCHIVE_MUTATIONS:
        return _archive(path, rng, out, kind)
    with zipfile.ZipFile(path) as archive, zipfile.ZipFile(out, "w") as copy:
        for info in archive.infolist():
            content = archive.read(info)
            if info.filename.endswith("models/model.json"):
                program = json.loads(content)
                nodes = program["graph_module"]["graph"]["nodes"]
                count = rng.choice([1, 3, len(nodes)])
                for node in rng.sample(nodes, min(count, len(nodes))):
                    meta = node.setdefault("metadata", {})
                    if kind == "stack_removed":
                        meta.pop("nn_module_stack", None)
                    else:
                        meta["nn_module_stack"] = _stack_value(
                            rng, meta.get("nn_module_stack", ""))
                content = json.dumps(program).encode()
            copy.writestr(info, content)
    return f"pt2 {kind}"
