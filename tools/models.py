"""Small models with random weights, shared by tests, benchmarks (bench/) and tools (tools/).

Every builder :func:`perturb`-s its model: no two per-layer tensors are equal.

Nothing here downloads anything: transformers models are built from small configs.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

# --- transformers ----------------------------------------------------------------------------


def gpt2(n_layer: int = 2, n_embd: int = 32, n_head: int = 2, vocab: int = 100,
         positions: int = 64):
    """(model, example args, example kwargs) of a random-weight GPT2Model."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=positions,
        use_cache=False, bos_token_id=0, eos_token_id=0,
    )
    torch.manual_seed(0)
    model = perturb(GPT2Model(config).eval())
    ids = torch.randint(0, vocab, (1, 8))
    return model, (ids,), {"return_dict": False, "use_cache": False}


def llama(layers: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2, vocab: int = 100,
          *, head: bool = False):
    """A random-weight LlamaModel (``head``: LlamaForCausalLM, the model under ``model``)."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=hidden * 2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
        max_position_embeddings=64, use_cache=False, bos_token_id=0, eos_token_id=0,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = perturb((LlamaForCausalLM if head else LlamaModel)(config).eval())
    ids = torch.randint(0, vocab, (1, 8))
    return model, (ids,), {"return_dict": False, "use_cache": False}


def bert(layers: int = 2, hidden: int = 32, heads: int = 2, vocab: int = 100):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=layers, hidden_size=hidden, intermediate_size=hidden * 2,
        num_attention_heads=heads, vocab_size=vocab, max_position_embeddings=64,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = perturb(BertModel(config).eval())
    ids = torch.randint(0, vocab, (1, 8))
    return model, (ids,), {"return_dict": False}


# --- hand-written ----------------------------------------------------------------------------


class Sub(torch.nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x))


class SplitHeads(torch.nn.Module):
    """A submodule with two outputs."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.proj = torch.nn.Linear(width, 2 * width)

    def forward(self, x):
        a, b = self.proj(x).chunk(2, dim=-1)
        return torch.tanh(a), torch.sigmoid(b)


class SharedAndList(torch.nn.Module):
    """A shared submodule called twice, a ModuleList, a multi-output submodule, a buffer."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.shared = Sub(width)
        self.layers = torch.nn.ModuleList([Sub(width) for _ in range(3)])
        self.heads = SplitHeads(width)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, width))

    def forward(self, x):
        x = self.shared(x)
        x = self.shared(x)
        for layer in self.layers:
            x = layer(x)
        a, b = self.heads(x)
        return a * self.scale + b, b.sum()


def shared_and_list():
    torch.manual_seed(0)
    return perturb(SharedAndList().eval()), (torch.randn(2, 4),), {}


@contextlib.contextmanager
def annotate(tags: dict) -> Iterator[None]:
    """``torch.fx.traceback.annotate`` (torch 2.10+); on torch 2.9, what it does: the tags
    in ``current_meta["custom"]``, which the tracers copy into each node's meta."""
    from torch.fx import traceback

    if hasattr(traceback, "annotate"):
        with traceback.annotate(tags):
            yield
        return
    before = traceback.current_meta.get("custom")
    traceback.current_meta["custom"] = {**(before or {}), **tags}
    try:
        yield
    finally:
        if before is None:
            del traceback.current_meta["custom"]
        else:
            traceback.current_meta["custom"] = before


class Staged(torch.nn.Module):
    """Regions annotated with a ``stage`` tag, for split tests."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.enc = Sub(width)
        self.mid = Sub(width)
        self.dec = Sub(width)

    def forward(self, x):
        with annotate({"stage": "encode"}):
            x = self.enc(x) + 1
        with annotate({"stage": "decode"}):
            x = self.dec(self.mid(x)) * 2
        return x


def staged():
    torch.manual_seed(0)
    return perturb(Staged().eval()), (torch.randn(2, 4),), {}


def export(model_args_kwargs, *, preserve_meta: bool = False, strict: bool = False
           ) -> torch.export.ExportedProgram:
    """``torch.export.export`` of a (model, args, kwargs) triple."""
    model, args, kwargs = model_args_kwargs
    if preserve_meta:
        with torch.fx.traceback.preserve_node_meta():
            return torch.export.export(model, args, kwargs=kwargs, strict=strict)
    return torch.export.export(model, args, kwargs=kwargs, strict=strict)


# --- FX backend: state mutation and repeated split regions -----------------------------------


class Accumulate(torch.nn.Module):
    """A submodule that mutates its buffer in place (a running total)."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.register_buffer("total", torch.zeros(width))

    def forward(self, x):
        self.total.add_(x.sum(0))
        return x + self.total


class Stateful(torch.nn.Module):
    """Buffer mutation inside a submodule, a mutated user input, a non-persistent buffer."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.acc = Accumulate(width)
        self.register_buffer("offset", torch.full((width,), 0.25), persistent=False)

    def forward(self, x, y):
        y.mul_(2)
        return self.acc(self.lin(x)) + y + self.offset


def stateful():
    torch.manual_seed(0)
    return perturb(Stateful().eval()), (torch.randn(2, 4), torch.randn(2, 4)), {}


class Alternating(torch.nn.Module):
    """Regions tagged a, b, a: one component per value would be a cycle."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.first = Sub(width)
        self.second = Sub(width)
        self.third = Sub(width)

    def forward(self, x):
        with annotate({"stage": "a"}):
            x = self.first(x)
        with annotate({"stage": "b"}):
            x = self.second(x) * 2
        with annotate({"stage": "a"}):
            x = self.third(x) + 1
        return x


def alternating():
    torch.manual_seed(0)
    return perturb(Alternating().eval()), (torch.randn(2, 4),), {}


# --- ONNX backend: constants that differ, calls of a shared module apart ---------------------


class Scaled(torch.nn.Module):
    """A Linear times a Python constant: modules that differ only in that constant."""

    def __init__(self, factor: float, width: int = 4):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.factor = factor

    def forward(self, x):
        return self.lin(x) * self.factor


class TwoFactors(torch.nn.Module):
    """Three Scaled modules: factors 2, 3, 2."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.a = Scaled(2.0, width)
        self.b = Scaled(3.0, width)
        self.c = Scaled(2.0, width)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def two_factors():
    torch.manual_seed(0)
    return perturb(TwoFactors().eval()), (torch.randn(2, 4),), {}


class NoOp(torch.nn.Module):
    """A Linear, then ``* 1`` or ``+ 0`` (nothing), or ``* -1``, by ``mode``. The export
    differs between the modes; optimized, the first two are the Linear alone."""

    def __init__(self, mode: str, width: int = 4):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.mode = mode

    def forward(self, x):
        y = self.lin(x)
        if self.mode == "neg":
            return y * -1.0
        return y * 1.0 if self.mode == "mul" else y + 0.0


class TwoNoOps(torch.nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.a = NoOp("mul", width)
        self.b = NoOp("add", width)
        self.c = NoOp("neg", width)

    def forward(self, x):
        return self.c(self.b(torch.relu(self.a(x))))


def two_noops():
    torch.manual_seed(0)
    return perturb(TwoNoOps().eval()), (torch.randn(2, 4),), {}


class Flatten(torch.nn.Module):
    """Flattens all but the first dimension, times 2: its export depends on the input shape."""

    def forward(self, x):
        return x.flatten(1) * 2


class TwoShapes(torch.nn.Module):
    """One Flatten module called on inputs of two shapes."""

    def __init__(self):
        super().__init__()
        self.flatten = Flatten()

    def forward(self, x, y):
        return self.flatten(x).sum(-1) + self.flatten(y).sum(-1)


def two_shapes():
    return perturb(TwoShapes().eval()), (torch.randn(2, 3, 4), torch.randn(2, 6, 5)), {}


class NormBlock(torch.nn.Module):
    """A pre-norm residual block whose LayerNorm eps and residual scale are settings."""

    def __init__(self, eps: float, scale: float, width: int = 8):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width, eps=eps)
        self.lin = torch.nn.Linear(width, width)
        self.scale = scale

    def forward(self, x):
        return x + self.scale * torch.relu(self.lin(self.norm(x)))


class Settings(torch.nn.Module):
    """Blocks of one class that differ only in their settings: four NormBlocks by default."""

    def __init__(self, width: int = 8, block: type = NormBlock,
                 settings=((1e-5, 0.5), (1e-6, 0.5), (1e-5, 0.25), (1e-3, 2.0))):
        super().__init__()
        self.blocks = torch.nn.ModuleList(block(e, s, width) for e, s in settings)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _small_inputs(model: Settings):
    """``model`` with its norms' weights drawn, on an input of small variance (where eps
    matters)."""
    with torch.no_grad():
        for block in model.blocks:
            block.norm.weight.normal_(1.0, 0.1)
    return perturb(model), (torch.randn(2, 3, 8) * 1e-2,), {}


def settings():
    torch.manual_seed(0)
    return _small_inputs(Settings().eval())


class EpsBlock(NormBlock):
    """A NormBlock without the ReLU: ``x + linear(norm(x)) * scale``."""

    def forward(self, x):
        return x + self.lin(self.norm(x)) * self.scale


class EpsBlocks(Settings):
    """Four EpsBlocks that differ in eps and in the residual scale, the last 1.0 (a multiply
    an optimizer removes)."""

    def __init__(self, width: int = 8):
        super().__init__(width, EpsBlock, ((1e-5, 0.5), (1e-6, 0.25), (1e-5, 0.125), (1e-3, 1.0)))


def eps_blocks():
    torch.manual_seed(0)
    return _small_inputs(EpsBlocks().eval())


class SharedApart(torch.nn.Module):
    """A shared module called twice with another module's call in between."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.shared = Sub(width)
        self.mid = Sub(width)

    def forward(self, x):
        return self.shared(self.mid(self.shared(x)) - 1)


def shared_apart():
    torch.manual_seed(0)
    return perturb(SharedApart().eval()), (torch.randn(2, 4),), {}


# --- ONNX input: weights that differ between blocks --------------------------------------------


def perturb(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """``model`` with every floating-point parameter and buffer perturbed in place (normal
    noise, std 0.1; variances scaled by a factor near 1, so they stay positive); returns it.

    Fresh models start with equal tensors in every block (transformers' zero biases and
    LayerNorm weights of one, BatchNorm's zero means and unit variances): a bug that hands
    block 3 the bias of block 0 would compute the same numbers. Perturbed, no two per-layer
    tensors are equal (``test_models.py`` checks it), so numeric comparisons see wiring
    mistakes; blocks can share a function only if weights are its inputs.
    """
    generator = torch.Generator().manual_seed(seed)
    tensors = [*model.named_parameters(remove_duplicate=True),
               *model.named_buffers(remove_duplicate=True)]
    with torch.no_grad():
        for name, tensor in tensors:
            if not tensor.is_floating_point():
                continue  # BatchNorm's num_batches_tracked, integer tables
            noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
            if name.endswith("running_var"):
                tensor.mul_(torch.exp(0.1 * noise))
            else:
                tensor.add_(0.1 * noise)
    return model


def randomized(model_args_kwargs, seed: int = 1):
    """The triple with its model :func:`perturb`-ed again with ``seed`` (builders already
    perturb with seed 1)."""
    perturb(model_args_kwargs[0], seed)
    return model_args_kwargs


def positional(model_args_kwargs):
    """A transformers triple with its keyword arguments bound (``return_dict=False``...), so
    ``dynamic_shapes`` can be one tuple for ``input_ids``. Module paths are unchanged."""
    model, args, kwargs = model_args_kwargs
    base = type(model)

    class Positional(base):  # type: ignore[misc, valid-type]
        def forward(self, input_ids):
            return base.forward(self, input_ids, **kwargs)

    Positional.__qualname__ = f"Positional{base.__name__}"
    model.__class__ = Positional
    return model, args, {}


# --- rewrite.export and rewrite suggest: repeated blocks ---------------------------------------


class Block(torch.nn.Module):
    """A residual Linear + ReLU block."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.lin(x))


class Chain(torch.nn.Module):
    """Blocks one after the other: the last block's output is the model's output."""

    def __init__(self, blocks: int = 3, width: int = 4):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(width) for _ in range(blocks)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def chain(blocks: int = 3):
    torch.manual_seed(0)
    return perturb(Chain(blocks).eval()), (torch.randn(2, 4),), {}


class Pair(torch.nn.Module):
    """A block with two outputs of one shape: outputs in the wrong order still make a valid
    model, only the numbers tell."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.first = torch.nn.Linear(width, width)
        self.second = torch.nn.Linear(width, width)

    def forward(self, x):
        h = torch.relu(self.first(x))
        return h, torch.sigmoid(self.second(h))


class PairChain(torch.nn.Module):
    """Three Pair blocks; both outputs of each make the next one's input."""

    def __init__(self, blocks: int = 3, width: int = 4):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Pair(width) for _ in range(blocks)])

    def forward(self, x):
        for block in self.blocks:
            h, gate = block(x)
            x = h - 2 * gate
        return x


def pair_chain():
    torch.manual_seed(0)
    return perturb(PairChain().eval()), (torch.randn(2, 4),), {}


class BasicBlock(torch.nn.Module):
    """torchvision's ResNet BasicBlock: two 3x3 convolutions and a (downsampled) shortcut."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: torch.nn.Module | None = None):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(planes)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(torch.nn.Module):
    """A small torchvision-style ResNet: stem, two stages of BasicBlocks, pooling, head."""

    def __init__(self, layers: tuple[int, ...] = (2, 2), width: int = 8, classes: int = 10):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.relu = torch.nn.ReLU(inplace=True)
        self.maxpool = torch.nn.MaxPool2d(3, 2, 1)
        self.inplanes = width
        for k, blocks in enumerate(layers):
            setattr(self, f"layer{k + 1}", self._stage(width * 2**k, blocks, 1 if k == 0 else 2))
        self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(self.inplanes, classes)
        self.stages = len(layers)

    def _stage(self, planes: int, blocks: int, stride: int) -> torch.nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = torch.nn.Sequential(
                torch.nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                torch.nn.BatchNorm2d(planes))
        made = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        made += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return torch.nn.Sequential(*made)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for k in range(self.stages):
            x = getattr(self, f"layer{k + 1}")(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet():
    torch.manual_seed(0)
    model = ResNet().eval()
    with torch.no_grad():  # running statistics that are not the identity
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return perturb(model), (torch.randn(1, 3, 32, 32),), {}


class Mixer(torch.nn.Module):
    """A token-mixing block: LayerNorm, then an MLP across the sequence."""

    def __init__(self, seq: int, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(seq, 2 * seq)
        self.down = torch.nn.Linear(2 * seq, seq)

    def forward(self, x):
        y = self.norm(x).transpose(1, 2)
        return x + self.down(torch.nn.functional.gelu(self.up(y))).transpose(1, 2)


class Gated(torch.nn.Module):
    """A gated channel MLP block."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.gate = torch.nn.Linear(width, width)
        self.value = torch.nn.Linear(width, width)

    def forward(self, x):
        y = self.norm(x)
        return x + torch.sigmoid(self.gate(y)) * self.value(y)


class TwoBlockKinds(torch.nn.Module):
    """An embedding, two Mixer blocks, three Gated blocks, a final norm and a head."""

    def __init__(self, vocab: int = 50, seq: int = 6, width: int = 8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.mixers = torch.nn.ModuleList([Mixer(seq, width) for _ in range(2)])
        self.gated = torch.nn.ModuleList([Gated(width) for _ in range(3)])
        self.drop = torch.nn.Dropout(0.1)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.drop(self.embed(ids))
        for block in [*self.mixers, *self.gated]:
            x = block(x)
        return self.head(self.norm(x))


def two_block_kinds():
    torch.manual_seed(0)
    return perturb(TwoBlockKinds().eval()), (torch.randint(0, 50, (2, 6)),), {}


def _decayed(state: torch.Tensor, token: tuple[torch.Tensor, torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's update of a recurrent state: (new state, the token's output)."""
    value, decay = token
    state = state * decay + value
    return state.clone(), torch.tanh(state)


class Recurrent(torch.nn.Module):
    """A recurrent block, as a hybrid's scanning layer is exported: its tokens scanned
    (``torch.scan``, one step per token) from the state it is given, the final state written
    into a copy of that state (``copy_`` into a clone, as transformers updates a cache)."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.decay = torch.nn.Parameter(torch.zeros(width))

    def forward(self, x, state):
        from torch._higher_order_ops.scan import scan

        value = self.proj(x)
        decay = torch.sigmoid(self.decay).expand_as(value)
        final, out = scan(_decayed, state, (value.movedim(1, 0), decay.movedim(1, 0)))
        kept = state.clone()
        kept.copy_(final)
        return x + out.movedim(0, 1), kept


class Recurrents(torch.nn.Module):
    """Three :class:`Recurrent` blocks, each reading and returning its own state."""

    def __init__(self, blocks: int = 3, width: int = 4):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Recurrent(width) for _ in range(blocks)])

    def forward(self, x, states):
        kept = []
        for block, state in zip(self.blocks, states.unbind(0)):
            x, state = block(x, state)
            kept.append(state)
        return x, torch.stack(kept)


def recurrents():
    torch.manual_seed(0)
    return perturb(Recurrents().eval()), (torch.randn(2, 5, 4), torch.randn(3, 2, 4)), {}


# --- the benchmarks' models (bench/, tools/matrix.py, tools/output_hashes.py) -----------------


def bench_gpt2(blocks: int, seq: int = 32):
    """(model, args, kwargs) of the benchmarks' GPT-2: width 64, 4 heads, a 1,000-word
    vocabulary, every weight perturbed (as in a trained model: transformers initializes biases
    to zero and norms to one, and torch.onnx's optimizer then drops every bias of the flat
    graph, a fold on weight *values* that a function shared by all blocks cannot make)."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(n_layer=blocks, n_embd=64, n_head=4, vocab_size=1000,
                        n_positions=max(seq, 64), use_cache=False, bos_token_id=0,
                        eos_token_id=0)
    torch.manual_seed(0)
    model = perturb(GPT2Model(config).eval())  # no two blocks' biases or norms equal
    ids = torch.randint(0, config.vocab_size, (1, seq))
    return model, (ids,), {"return_dict": False, "use_cache": False}


def llama_config(blocks: int, hidden: int, use_cache: bool):
    """The benchmarks' Llama configuration: 16 heads, 4 key/value heads, a 1,000-word
    vocabulary, 64 positions."""
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=blocks, hidden_size=hidden,
                       intermediate_size=4 * hidden, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=1000, max_position_embeddings=64,
                       use_cache=use_cache, bos_token_id=0, eos_token_id=0, pad_token_id=0)
