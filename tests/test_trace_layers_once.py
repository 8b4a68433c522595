"""``rewrite export --trace layers`` (the default): torch.export traces each distinct decoder
layer once, the other layers are recorded as calls of its trace. The model written is the
whole-model trace's (``--trace whole``): the same functions, calls and I/O (their structure
locks are equal) and the same numerics; where the model cannot be cut so, the whole trace,
said in one line.

The decode numerics of the default path for every family are tests/test_checkpoint_export.py's
(prefill and 3 decode steps against eager, a left-padded row).
"""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
import pytest
import torch

import rewrite
from rewrite.errors import InputError
from rewrite.structure import compare, of_model, render
from tests import checkpoints
from tests.test_checkpoint_export import Recorder, decode_and_compare

KINDS = {"llama": 1, "qwen2": 1, "qwen3": 1, "mistral": 1, "phi3": 1, "gemma2": 2, "gpt2": 1,
         "qwen2_moe": 1}
"""Family -> its distinct layer kinds (Gemma-2: sliding and full attention)."""
FAMILIES = [family if family == "llama" else pytest.param(family, marks=pytest.mark.slow)
            for family in KINDS]


@pytest.fixture(scope="module")
def both(request, tmp_path_factory):
    """(family, folder, (model, progress, path) per trace) of one family's checkpoint."""
    family = request.param
    root = tmp_path_factory.mktemp(f"once-{family}")
    folder = checkpoints.write(family, root / "checkpoint")
    return family, folder, _both_traces(folder, root)


def _both_traces(folder: Path, root: Path) -> dict:
    """(model, progress, path) per trace of the checkpoint ``folder``, exported below
    ``root``."""
    made = {}
    for trace in ("layers", "whole"):
        progress = Recorder()
        out = root / trace / "model.onnx"
        out.parent.mkdir()
        made[trace] = (rewrite.export(folder, output=out, trace=trace, progress=progress),
                       progress, out)
    return made


@pytest.mark.parametrize("both", FAMILIES, indirect=True)
def test_each_distinct_layer_is_traced_once(both):
    family, _, made = both
    text = made["layers"][1].text
    kinds = KINDS[family]
    layers = checkpoints.LAYERS
    assert (f"torch.export: {kinds} of {layers} layers traced" in text
            and f"{layers - kinds} recorded as calls of their traces" in text), text
    assert "traces every layer" not in made["whole"][1].text  # whole: no cut, no note


@pytest.mark.parametrize("both", FAMILIES, indirect=True)
def test_the_model_is_the_whole_traces(both):
    _, _, made = both
    whole, layers = of_model(made["whole"][0]), of_model(made["layers"][0])
    changes = compare(whole, layers)
    assert not changes, render(changes, "whole", "layers")
    names = [(v.name, str(v.shape)) for v in made["layers"][0].graph.inputs]
    assert names == [(v.name, str(v.shape)) for v in made["whole"][0].graph.inputs]


@pytest.mark.slow
def test_a_layer_whose_code_reads_its_index_falls_back_to_the_whole_trace(tmp_path,
                                                                          monkeypatch):
    from transformers.models.llama import modeling_llama

    forward = modeling_llama.LlamaDecoderLayer.forward

    def scaled(self, hidden_states, *args, **kwargs):  # each layer's code differs by its index
        out = forward(self, hidden_states, *args, **kwargs)
        return out * (1.0 + 0.1 * self.self_attn.layer_idx)

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", scaled)
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    progress = Recorder()
    out = tmp_path / "model.onnx"
    rewrite.export(folder, output=out, progress=progress)
    note = next(line for line in progress.text.splitlines() if "traces every layer" in line)
    assert "layer 1's traced body does not compute it" in note
    assert max(decode_and_compare(folder, out)) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("family, added, first", [
    ("llama", 4, 2),  # one kind: the model cut to 2 layers, 4 added
    pytest.param("gemma2", 2, 4, marks=pytest.mark.slow),  # sliding, full, sliding, full
])
def test_further_layers_are_added_to_the_program_of_the_first(family, added, first,
                                                              tmp_path):
    """torch.export traces the model cut to its first layers (two of each kind); the
    further layers are added to the program as calls of their kind's trace: the same
    structure and I/O as the whole trace, prefill and decode steps equal to eager."""
    folder = checkpoints.write(family, tmp_path / "checkpoint", layers=6)
    made = {}
    for trace in ("layers", "whole"):
        progress = Recorder()
        out = tmp_path / trace / "model.onnx"
        out.parent.mkdir()
        made[trace] = rewrite.export(folder, output=out, trace=trace, progress=progress)
        if trace == "layers":
            assert f"({added} added to the program of the first {first})" in progress.text, \
                progress.text
    changes = compare(of_model(made["whole"]), of_model(made["layers"]))
    assert not changes, render(changes, "whole", "layers")
    names = [(v.name, str(v.shape)) for v in made["layers"].graph.inputs]
    assert names == [(v.name, str(v.shape)) for v in made["whole"].graph.inputs]
    assert max(decode_and_compare(folder, tmp_path / "layers" / "model.onnx")) < 1e-4


@pytest.mark.slow
def test_added_layers_wired_wrong_are_caught_and_the_model_traced_whole(tmp_path,
                                                                        monkeypatch):
    """A mutant that feeds every added layer what its kind's traced call is fed (the
    output of the layer before that one, not of its own previous layer): the program run
    against the model disagrees, the model is traced whole, said, and written right."""
    wire_added_layers_stale(monkeypatch)
    text = _exported_equal_to_eager(tmp_path)
    assert "torch.export traces every layer: the program of the first layers, extended, " \
           "does not give the model's outputs" in text, text


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int4_checks_its_layers_with_the_written_model(dtype, tmp_path):
    """An int4 export's layers traced once are checked by the written model's check on the
    weights written (float32's tolerance on them dequantized), not run before: said, and the
    model is equal to eager on them. A half checkpoint's float32 shell holds placeholders
    until written (nothing for eager to compare); a float32 one saves two eager runs."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint", dtype=dtype, layers=4)
    progress = Recorder()
    rewrite.export(folder, output=tmp_path / "model.onnx", precision="int4",
                   progress=progress)
    assert "2 added to the program of the first 2); checked with the written model, on the " \
           "weights written" in progress.text, progress.text
    assert "on the same int4 weights dequantized: max |difference|" in progress.text


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int4_layers_wired_wrong_fail_the_written_models_check_and_are_traced_whole(
        dtype, tmp_path, monkeypatch):
    """The stale-wiring mutant in int4 (a half checkpoint's shell, a float32 one): no check
    runs the bodies before writing; the written model's check on the weights written fails,
    the model is traced whole, said, and written checked."""
    wire_added_layers_stale(monkeypatch)
    folder = checkpoints.write("llama", tmp_path / "checkpoint", dtype=dtype, layers=4)
    progress = Recorder()
    rewrite.export(folder, output=tmp_path / "model.onnx", precision="int4",
                   progress=progress)
    assert "torch.export traces every layer: the per-layer model disagreed with eager" in \
        progress.text, progress.text
    assert "on the same int4 weights dequantized: max |difference|" in progress.text


def wire_added_layers_stale(monkeypatch) -> None:
    """The mutant: every added layer fed what its kind's traced call is fed."""
    from rewrite._private import torch_repeated_calls

    operand = torch_repeated_calls._Builder._operand

    def stale(self, value, layer):
        if isinstance(value, torch.fx.Node) and value.args and value.args[0] is layer.before:
            return value
        return operand(self, value, layer)

    monkeypatch.setattr(torch_repeated_calls._Builder, "_operand", stale)


@pytest.mark.slow
def test_a_program_that_cannot_be_extended_records_every_layers_call(tmp_path, monkeypatch):
    from rewrite._private import torch_repeated_calls
    from rewrite._private.errors import Unavailable

    def refused(self, index):
        raise Unavailable(f"layer {index} refused")

    monkeypatch.setattr(torch_repeated_calls._Builder, "add_layer", refused)
    text = _exported_equal_to_eager(tmp_path)
    assert "the program of the first 2 layers could not be extended: Unavailable: layer 2 " \
           "refused" in text, text
    assert "1 of 5 layers traced (LlamaDecoderLayer), 4 recorded as calls of their traces\n" \
        in text + "\n", text


def _exported_equal_to_eager(tmp_path) -> str:
    """A 5-layer Llama checkpoint exported, its prefill and decode steps equal to eager
    (checked here); what the export said."""
    folder = checkpoints.write("llama", tmp_path / "checkpoint", layers=5)
    progress = Recorder()
    out = tmp_path / "model.onnx"
    rewrite.export(folder, output=out, progress=progress)
    assert max(decode_and_compare(folder, out)) < 1e-4
    return progress.text


def test_a_config_whose_layer_count_cannot_be_set_is_not_cut(tmp_path, monkeypatch):
    """ProphetNet's config refuses a new ``num_hidden_layers`` (NotImplementedError): the
    model is not cut to its first layers (one line says why; it had been an internal error,
    exit 3), its layers' calls traced or recorded in one trace, the model equal to eager."""
    from transformers import LlamaConfig

    folder = checkpoints.write("llama", tmp_path / "checkpoint")

    def setting(self, value):
        if "_layers" in self.__dict__ and value != self.__dict__["_layers"]:
            raise NotImplementedError("This model does not support the setting of "
                                      "`num_hidden_layers`.")
        self.__dict__["_layers"] = value

    monkeypatch.setattr(LlamaConfig, "num_hidden_layers", property(
        lambda self: self.__dict__["_layers"], setting), raising=False)
    progress = Recorder()
    out = tmp_path / "model.onnx"
    rewrite.export(folder, output=out, progress=progress)
    said = " ".join(progress.text.split())
    assert "could not be extended: Unavailable: its config's layer count cannot be set: " \
           "This model does not support" in said, said
    assert max(decode_and_compare(folder, out)) < 1e-4


def test_an_unknown_trace_is_refused(tmp_path):
    folder = checkpoints.write("llama", tmp_path / "checkpoint")
    with pytest.raises(InputError, match="trace='all'"):
        rewrite.export(folder, trace="all")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


@pytest.mark.slow
@pytest.mark.parametrize("model_type, shared_sizes, said", [
    # Falcon's layer makes tensor constants of its own (torch.tensor(-2) to index with):
    # lifted out of its body, one per body
    ("falcon", False, "torch.export: 1 of 2 layers traced (FalconDecoderLayer), 1 recorded"),
    # BART as a decoder: transformers makes an encoder mask (unused) while exporting, none in
    # eager; the check's eager runs make the masks as the trace does
    ("bart", False, "torch.export: 1 of 2 layers traced (BartDecoderLayer), 1 recorded"),
    # JetMoE's experts take the rows routed to them: sizes from data, each call's own
    ("jetmoe", False, "torch.export: 1 of 2 layers traced (JetMoeDecoderLayer), 1 recorded"),
    # with the reader made to share them across calls (the bug of session 17): the per-layer
    # model passes the body checks but disagrees with eager when written: exported again,
    # every layer traced, and published only then
    ("jetmoe", True, "torch.export traces every layer: the per-layer model disagreed with eager"),
])
def test_families_the_cut_serves_or_not(tmp_path, monkeypatch, model_type, shared_sizes, said):
    from rewrite.frontends.fx import regions
    from tools.coverage import write_checkpoint

    if model_type == "jetmoe" and torch.__version__ < (2, 10):
        if shared_sizes:
            pytest.skip("torch 2.9: a body computing sizes from data is traced whole before "
                        "the reader runs (its ONNX translation would give them one value)")
        said = ("torch.export traces every layer: JetMoeDecoderLayer computes sizes from "
                "data, which torch 2.9")
    if shared_sizes:
        monkeypatch.setattr(regions, "_input_size", lambda value: isinstance(value, torch.SymInt))
    folder = tmp_path / model_type
    assert write_checkpoint(model_type, folder) is None  # its eager forward works
    progress = Recorder()
    out = tmp_path / "model.onnx"
    rewrite.export(folder, output=out, progress=progress)
    assert said in progress.text, progress.text
    assert "verified against eager" in progress.text and out.is_file()


@pytest.mark.slow  # a tiny Gemma 4 checkpoint, exported, then prefill + 3 decode steps
def test_layers_sharing_keys_and_values_through_a_mapping_are_traced_once_per_kind(tmp_path):
    """Gemma 4's layers get a mapping (``shared_kv_states``) into which the last layer of
    each attention type before the sharing ones stores its keys and values, and from which
    the sharing layers (3, 4, 5) read theirs: in a layer's function its entries are inputs
    and what it stores outputs. Five kinds of six layers traced (the mapping's keys differ
    along the way), one recorded; prefill and decode equal eager; only the layers that
    compute keys and values have a past and a present."""
    from transformers import AutoModelForCausalLM

    from tools.coverage import tiny_config

    said = tiny_config("gemma4_text").to_dict()
    for key in [k for k in said if k.startswith("per_layer")]:  # remade from layer_types
        said.pop(key)
    said.update(num_hidden_layers=6, num_kv_shared_layers=3,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(type(tiny_config("gemma4_text"))(**said)).eval()
    assert [layer.self_attn.is_kv_shared_layer for layer in model.model.layers] == \
        [False] * 3 + [True] * 3
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    folder = tmp_path / "gemma4"
    model.save_pretrained(folder)
    progress = Recorder()
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    exported = rewrite.export(folder, output=out, cache="kv", progress=progress)
    assert "torch.export: 5 of 6 layers traced (Gemma4TextDecoderLayer x5), 1 recorded" in \
        progress.text, progress.text
    errors = decode_and_compare(folder, out)
    assert max(errors) < 1e-4, errors
    assert [v.name for v in exported.graph.outputs] == [
        "logits", *(f"present.{n}.{kv}" for n in range(3) for kv in ("key", "value"))]
    calls = [n.op_type for n in exported.graph if n.op_type.startswith("Gemma4TextDecoder")]
    assert len(calls) == 6 and len(set(calls)) == 5, calls


# --- rewrite.export(module): the module's one list of repeated layers ----------------------


class _Layer(torch.nn.Module):
    def __init__(self, width: int, index: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.layer_idx = index  # a layer's number: not part of its kind

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return torch.relu(self.linear(x)) * scale + x


class _Stack(torch.nn.Module):
    def __init__(self, width: int = 8, depth: int = 5) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Layer(width, i) for i in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, scale=0.5)
        return x


@pytest.mark.parametrize("build", ["gpt2", "bert", "stack"])
def test_a_modules_repeated_layers_are_traced_once(build, tmp_path):
    """rewrite.export(module): the one list of repeated layers (GPT-2's blocks, BERT's
    layers, a plain ModuleList) traced once per kind; the same structure as the whole trace,
    equal to eager in onnxruntime."""
    from tests.onnx_fixtures import assert_matches_eager, checked_proto
    from tools import models

    torch.manual_seed(0)
    triple = (_Stack(), (torch.randn(3, 8),), {}) if build == "stack" else \
        getattr(models, build)(**({"n_layer": 4} if build == "gpt2" else {"layers": 4}))
    model, args, kwargs = triple
    made = {}
    for trace in ("layers", "whole"):
        progress = Recorder()
        made[trace] = rewrite.export(model, args, kwargs, output=tmp_path / f"{trace}.onnx",
                                     trace=trace, progress=progress), progress.text
    depth = 5 if build == "stack" else 4
    assert f"torch.export: 1 of {depth} layers traced" in made["layers"][1], made["layers"][1]
    changes = compare(of_model(made["whole"][0]), of_model(made["layers"][0]))
    assert not changes, render(changes, "whole", "layers")
    checked_proto(made["layers"][0])
    assert_matches_eager(tmp_path / "layers.onnx", triple)


class _Scaling(torch.nn.Module):
    """A layer that makes tensor constants in its ``forward`` (as Falcon's does), each kind
    (``gain``, a plain attribute) its own value under the same name in its traced body."""

    def __init__(self, width: int, gain: float) -> None:
        super().__init__()
        self.linear, self.gain = torch.nn.Linear(width, width), gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = x[..., torch.tensor([-1])]  # an index made in the forward
        return torch.relu(self.linear(x)) * torch.tensor(self.gain) + last


class _Scalings(torch.nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Scaling(width, gain) for gain in (2.0, 3.0) * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_tensor_constants_a_layer_makes_are_lifted_from_its_kinds_body(tmp_path):
    """Each kind's body holds its own constants (two kinds, the same attribute names, other
    values): each is lifted once per body, read by every call of that kind (the ONNX
    function is one, the constants its inputs)."""
    from tests.onnx_fixtures import assert_matches_eager, checked_proto

    torch.manual_seed(0)
    triple = (_Scalings(), (torch.randn(3, 8),), {})
    progress = Recorder()
    out = tmp_path / "model.onnx"
    model = rewrite.export(*triple, output=out, progress=progress)
    assert "torch.export: 2 of 4 layers traced (_Scaling x2), 2 recorded" in progress.text, \
        progress.text
    assert [f.name for f in model.functions.values()] == ["_Scaling"]  # gains: inputs
    assert [n.op_type for n in model.graph].count("_Scaling") == 4
    checked_proto(model)
    assert_matches_eager(out, triple)


class _Routing(torch.nn.Module):
    """A layer whose sizes depend on data (as a MoE's: the rows routed to its linear), a
    size of its own at each call."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gate, self.linear = torch.nn.Linear(width, 1), torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.gate(x)[:, 0]
        count = (scores > 0).sum().item()  # traced: a size from data
        torch._check(count >= 0)
        torch._check(count <= x.shape[0])
        rows = torch.argsort(scores, descending=True)[:count]
        return x.index_add(0, rows, self.linear(x.index_select(0, rows)))


class _Routings(torch.nn.Module):
    def __init__(self, width: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Routing(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_sizes_that_depend_on_data_are_each_calls_own(tmp_path):
    """A size computed from data in a layer's body (an unbacked symbol: the rows routed) is
    not the size of the same name an earlier call computed: the model equals eager (JetMoE
    disagreed before, its routing read from its first layer)."""
    from tests.onnx_fixtures import assert_matches_eager, checked_proto

    torch.manual_seed(0)
    model = _Routings()
    x = torch.randn(16, 8)
    routed = []
    for layer in model.layers:  # each layer routes another number of rows
        routed.append(int((layer.gate(x) > 0).sum()))
        x = layer(x)
    assert len(set(routed)) > 1, routed
    triple = (model, (torch.randn(16, 8),), {})
    progress = Recorder()
    out = tmp_path / "model.onnx"
    checked_proto(rewrite.export(*triple, output=out, progress=progress))
    if torch.__version__ >= (2, 10):
        said = "torch.export: 1 of 4 layers traced (_Routing), 3 recorded"
    else:  # its ONNX translation gives every call's u0 one value: each layer traced
        said = ("torch.export traces every layer: _Routing computes sizes from data, which "
                "torch 2.9")
    assert said in progress.text, progress.text
    assert_matches_eager(out, triple)


def test_a_module_layer_reading_its_index_falls_back_to_the_whole_trace(tmp_path,
                                                                        monkeypatch):
    """Layers of one kind whose code differs by their index: the program with one traced
    body disagrees with the module, so the module is traced whole, said in one line."""
    from tests.onnx_fixtures import assert_matches_eager

    def by_index(self, x, scale=1.0):
        return torch.relu(self.linear(x)) * (scale + self.layer_idx) + x

    monkeypatch.setattr(_Layer, "forward", by_index)
    torch.manual_seed(0)
    triple = (_Stack(), (torch.randn(3, 8),), {})
    progress = Recorder()
    out = tmp_path / "model.onnx"
    rewrite.export(*triple, output=out, progress=progress)
    assert "torch.export traces every layer: the program with each layer traced once does " \
           "not give the module's outputs" in progress.text, progress.text
    assert_matches_eager(out, triple)


def test_a_module_without_repeated_layers_is_traced_whole_and_an_unknown_trace_refused(
        tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    progress = Recorder()
    rewrite.export(model, (torch.randn(2, 4),), progress=progress)
    assert "torch.export traces every layer: Sequential has no one list of repeated layers" \
        in progress.text
    with pytest.raises(InputError, match="trace='all'"):
        rewrite.export(model, (torch.randn(2, 4),), output=tmp_path / "m.onnx", trace="all")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("family, note", [
    pytest.param("bart", "1 of 4 layers traced (BartEncoderLayer)", marks=pytest.mark.slow),
    pytest.param("t5", "2 of 4 layers traced (T5Block x2)", marks=pytest.mark.slow),
    pytest.param("whisper", "1 of 4 layers traced (WhisperEncoderLayer)",
                 marks=pytest.mark.slow),
])
def test_an_encoder_decoders_encoder_layers_are_traced_once(family, note, tmp_path):
    """--cache kv of an encoder-decoder: the encoder's layers and the decoder step's traced
    once per kind (T5's first block, which holds the relative attention bias, is a kind of
    its own); the encoder graph has the structure of the whole trace, the decoder's the same
    functions, calls and ops in each, where a size may be read from another input of that
    size (the cross-attention's past length: the whole trace reads one layer's past values,
    the cut one its past keys). The decode numerics: tests/test_checkpoint_seq2seq.py."""
    folder = checkpoints.write(family, tmp_path / "checkpoint")
    texts = {}
    for trace in ("layers", "whole"):
        progress = Recorder()
        (tmp_path / trace).mkdir()
        rewrite.export(folder, output=tmp_path / trace / "model.onnx", cache="kv",
                       trace=trace, progress=progress)
        texts[trace] = progress.text
    assert f"torch.export: {note}" in texts["layers"], texts["layers"]
    cut = torch.__version__ >= (2, 10)  # torch 2.9: the decoder step traced whole
    assert texts["layers"].count(f"torch.export: {note.replace('Encoder', 'Decoder')}") == \
        cut + (family == "t5"), texts["layers"]  # T5's decoder blocks: T5Block too
    assert "layers traced" not in texts["whole"]
    for graph in ("encoder_model.onnx", "decoder_model.onnx"):
        whole, layers = (ir.load(tmp_path / trace / graph) for trace in ("whole", "layers"))
        changes = compare(of_model(whole), of_model(layers))
        if graph == "decoder_model.onnx":  # the same ops, a size read from another input
            changes = tuple(c for c in changes if c.what != "changed" or not all(
                "the same ops: how they connect" in d for d in c.details))
        assert not changes, render(changes, "whole", "layers")


class _ScanLayer(torch.nn.Module):
    """A recurrent layer: a ``torch.scan`` over the rows (a decayed running sum), its body a
    subgraph of the layer's traced body."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.decay = torch.nn.Parameter(torch.rand(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.scan import scan

        def step(state: torch.Tensor, row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            state = state * torch.sigmoid(self.decay) + row
            return state.clone(), state.clone()

        _, rows = scan(step, torch.zeros_like(x[0]), self.linear(x))
        return torch.tanh(rows) + x


class _ScanStack(torch.nn.Module):
    def __init__(self, width: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_ScanLayer(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.slow
def test_a_layer_that_scans_is_traced_once(tmp_path):
    """Layers whose traced body holds a subgraph (a ``torch.scan``'s body, an ONNX ``Scan``):
    traced once, its copies sharing the subgraph; the model written is the whole trace's
    (same functions, calls and I/O) and equals eager in onnxruntime."""
    from tests.onnx_fixtures import assert_matches_eager, checked_proto

    torch.manual_seed(0)
    triple = (_ScanStack(), (torch.randn(6, 8),), {})
    made = {}
    for trace in ("layers", "whole"):
        progress = Recorder()
        made[trace] = rewrite.export(*triple, output=tmp_path / f"{trace}.onnx", trace=trace,
                                     progress=progress), progress.text
    assert "torch.export: 1 of 4 layers traced" in made["layers"][1], made["layers"][1]
    changes = compare(of_model(made["whole"][0]), of_model(made["layers"][0]))
    assert not changes, render(changes, "whole", "layers")
    assert any(n.op_type == "Scan" for f in made["layers"][0].functions.values() for n in f)
    checked_proto(made["layers"][0])
    assert_matches_eager(tmp_path / "layers.onnx", triple)


@pytest.mark.slow  # two exports of each of two tiny hybrid checkpoints
@pytest.mark.parametrize("family, traced", [("bamba", "2 of 4 layers traced"),
                                            ("jamba", "3 of 4 layers traced")])
def test_a_hybrids_scanning_layers_are_traced_once(family, traced, tmp_path):
    """A hybrid whose recurrent layers scan (Bamba's Mamba-2 layers, Jamba's Mamba layers
    beside attention, three kinds): each kind traced once; the model written has the whole
    trace's functions, calls and I/O (a function's inner wiring may differ: the state
    lengths are summed in another order), its prefill and decode steps equal to eager."""
    from tests.test_export_families import hybrid_export

    folder = checkpoints.write(family, tmp_path / "checkpoint")
    with hybrid_export():
        made = _both_traces(folder, tmp_path)
    text = made["layers"][1].text
    assert traced in text and "traces every layer" not in text, text
    whole, layers = (_calls_and_io(made[trace][0]) for trace in ("whole", "layers"))
    assert whole == layers
    errors = decode_and_compare(folder, made["layers"][2])
    assert max(errors) < 1e-4, errors


def _calls_and_io(model: ir.Model) -> tuple:
    """A model's functions (their names and how many nodes each has), its main graph's
    calls in order and its inputs and outputs with their shapes."""
    return (sorted((f.name, len(f)) for f in model.functions.values()),
            [(n.domain, n.op_type) for n in model.graph],
            [(v.name, str(v.shape)) for v in (*model.graph.inputs, *model.graph.outputs)])
