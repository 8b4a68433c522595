"""Small models with random weights, shared by tests, benchmarks and the demo.

Nothing here downloads anything: transformers models are built from small configs.
"""

from __future__ import annotations

import torch

# --- transformers ----------------------------------------------------------------------------


def gpt2(n_layer: int = 2, n_embd: int = 32, n_head: int = 2, vocab: int = 100, positions: int = 64):
    """(model, example args, example kwargs) of a random-weight GPT2Model."""
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=positions,
        use_cache=False, bos_token_id=0, eos_token_id=0,
    )
    torch.manual_seed(0)
    model = GPT2Model(config).eval()
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
    model = (LlamaForCausalLM if head else LlamaModel)(config).eval()
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
    model = BertModel(config).eval()
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
    return SharedAndList().eval(), (torch.randn(2, 4),), {}


class Staged(torch.nn.Module):
    """Regions annotated with a ``stage`` tag, for split tests."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.enc = Sub(width)
        self.mid = Sub(width)
        self.dec = Sub(width)

    def forward(self, x):
        from torch.fx.traceback import annotate

        with annotate({"stage": "encode"}):
            x = self.enc(x) + 1
        with annotate({"stage": "decode"}):
            x = self.dec(self.mid(x)) * 2
        return x


def staged():
    torch.manual_seed(0)
    return Staged().eval(), (torch.randn(2, 4),), {}


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
    return Stateful().eval(), (torch.randn(2, 4), torch.randn(2, 4)), {}


class Alternating(torch.nn.Module):
    """Regions tagged a, b, a: one component per value would be a cycle."""

    def __init__(self, width: int = 4):
        super().__init__()
        self.first = Sub(width)
        self.second = Sub(width)
        self.third = Sub(width)

    def forward(self, x):
        from torch.fx.traceback import annotate

        with annotate({"stage": "a"}):
            x = self.first(x)
        with annotate({"stage": "b"}):
            x = self.second(x) * 2
        with annotate({"stage": "a"}):
            x = self.third(x) + 1
        return x


def alternating():
    torch.manual_seed(0)
    return Alternating().eval(), (torch.randn(2, 4),), {}


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
    return TwoFactors().eval(), (torch.randn(2, 4),), {}


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
    return SharedApart().eval(), (torch.randn(2, 4),), {}


# --- ONNX input: weights that differ between blocks --------------------------------------------


def randomized(model_args_kwargs, seed: int = 1):
    """The triple with every parameter redrawn, so identical blocks differ only in weights.

    Fresh transformers models start with LayerNorm weights of ones and zero biases: equal in
    every block, and the ONNX optimizer then shares one initializer between blocks. Redrawn
    values keep the test honest: blocks can share a function only if weights are its inputs.
    """
    model, args, kwargs = model_args_kwargs
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            base = 1.0 if param.ndim == 1 else 0.0
            param.copy_(base + 0.1 * torch.randn(param.shape, generator=generator))
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
