"""The model zoo: random-weight models from many architectures, small configs, nothing
downloaded (transformers configs, ``timm.create_model(pretrained=False)``, diffusers configs).

Each :class:`Entry` builds ``(model, args, kwargs)`` and names the class of its repeated
block, for the blocks rule ``group class *{block}``.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from typing import Any, Callable

import torch
from attrs import frozen

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub, even by mistake

Triple = tuple[torch.nn.Module, tuple, dict]


@frozen
class Entry:
    name: str
    family: str
    build: Callable[[], Triple]
    block: str
    """Class name (a glob) of the repeated block: ``group class {block}``."""
    atol: float = 1e-4
    why_atol: str = ""
    """Why a looser tolerance than 1e-4 is needed, when it is."""
    note: str = ""
    """A known limit, shown in the table."""


def _seeded(module: torch.nn.Module) -> torch.nn.Module:
    return module.eval()


def _ids(vocab: int = 100, length: int = 8) -> torch.Tensor:
    return torch.randint(1, vocab, (1, length), generator=torch.Generator().manual_seed(1))


def _hf(config_cls: str, model_cls: str, **config: Any) -> Callable[[], Triple]:
    """A transformers model on token ids, returning tuples (no cache)."""
    def build() -> Triple:
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(cfg).eval()
        kwargs: dict = {"return_dict": False}
        if getattr(cfg, "use_cache", None) is not None:
            kwargs["use_cache"] = False
        return model, (_ids(config.get("vocab_size", 100)),), kwargs
    return build


_DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=100, max_position_embeddings=64,
                bos_token_id=0, eos_token_id=0, pad_token_id=0, use_cache=False)
_ENCODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                vocab_size=100, max_position_embeddings=64, pad_token_id=0)


def _encoder_decoder(config_cls: str, model_cls: str, **config: Any) -> Callable[[], Triple]:
    def build() -> Triple:
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(cfg).eval()
        ids = _ids()
        return model, (ids,), {"decoder_input_ids": ids[:, :4].clone(), "return_dict": False,
                               "use_cache": False}
    return build


def _vision(config_cls: str, model_cls: str, size: int = 32, **config: Any
            ) -> Callable[[], Triple]:
    def build() -> Triple:
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(cfg).eval()
        pixels = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        return model, (pixels,), {"return_dict": False}
    return build


def _whisper() -> Triple:
    from transformers import WhisperConfig, WhisperModel

    cfg = WhisperConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
                        num_mel_bins=16, max_source_positions=16, max_target_positions=16,
                        vocab_size=100, use_cache=False, pad_token_id=0, bos_token_id=0,
                        eos_token_id=0, decoder_start_token_id=0)
    torch.manual_seed(0)
    model = WhisperModel(cfg).eval()
    features = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(1))
    return model, (features,), {"decoder_input_ids": _ids(100, 4), "return_dict": False,
                                "use_cache": False}


def _wav2vec2() -> Triple:
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                         conv_kernel=(10, 3), num_feat_extract_layers=2,
                         num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
                         do_stable_layer_norm=True, mask_time_prob=0.0)
    torch.manual_seed(0)
    model = Wav2Vec2Model(cfg).eval()
    audio = torch.randn(1, 400, generator=torch.Generator().manual_seed(1))
    return model, (audio,), {"return_dict": False}


class _StubMeta(type(torch.nn.Module)):  # type: ignore[misc]
    def __getattr__(cls, name: str) -> str:
        if name.startswith("__"):
            raise AttributeError(name)
        return f"{cls.__name__}.{name}"


class _StubModule(types.ModuleType):
    """A module whose every attribute is a stub: a submodule, or a class for capitalized
    names (whose attributes are strings)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name[:1].isupper():
            value: Any = _StubMeta(name, (torch.nn.Module,), {"__module__": self.__name__})
        else:
            value = _StubModule(f"{self.__name__}.{name}")
            value.__path__ = []
            sys.modules[value.__name__] = value
        setattr(self, name, value)
        return value


class _StubFinder:
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def import_timm() -> Any:
    """``import timm`` without torchvision.

    timm (>= 1.0) imports torchvision at import time (``FrozenBatchNorm2d``, data transforms)
    but its models do not use it; the torchvision wheels the registry serves are CUDA builds
    that do not load next to the CPU torch. So when torchvision is missing, timm is imported
    against stub ``torchvision`` modules, which are removed again right after: nothing else
    sees them (``importlib.util.find_spec("torchvision")`` stays None).
    """
    try:
        import timm
        return timm
    except ModuleNotFoundError as e:
        if e.name is None or not e.name.startswith("torchvision"):
            raise
    for name in [k for k in sys.modules if k.startswith("timm")]:
        del sys.modules[name]
    finder = _StubFinder()
    sys.meta_path.append(finder)
    try:
        import timm
    finally:
        sys.meta_path.remove(finder)
        for name in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[name]
    return timm


def _timm(name: str, size: int = 64, **kwargs: Any) -> Callable[[], Triple]:
    def build() -> Triple:
        timm = import_timm()

        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs).eval()
        image = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(1))
        return model, (image,), {}
    return build


def _unet() -> Triple:
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    model = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1,
        block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
        attention_head_dim=4, norm_num_groups=8).eval()
    g = torch.Generator().manual_seed(1)
    sample, hidden = torch.randn(1, 4, 16, 16, generator=g), torch.randn(1, 4, 16, generator=g)
    return model, (sample, torch.tensor([10]), hidden), {"return_dict": False}


def _dit() -> Triple:
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    model = DiTTransformer2DModel(
        num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10,
        norm_num_groups=8).eval()
    g = torch.Generator().manual_seed(1)
    sample = torch.randn(1, 4, 8, 8, generator=g)
    return model, (sample, torch.tensor([3]), torch.tensor([1])), {"return_dict": False}


ZOO: tuple[Entry, ...] = (
    # decoder LLMs
    Entry("gpt2", "decoder", _hf("GPT2Config", "GPT2Model", n_layer=2, n_embd=32, n_head=2,
                                 vocab_size=100, n_positions=64, use_cache=False,
                                 bos_token_id=0, eos_token_id=0), "*GPT2Block"),
    Entry("llama", "decoder", _hf("LlamaConfig", "LlamaModel", **_DECODER), "*LlamaDecoderLayer"),
    Entry("mistral", "decoder", _hf("MistralConfig", "MistralModel", **_DECODER),
          "*MistralDecoderLayer"),
    Entry("qwen2", "decoder", _hf("Qwen2Config", "Qwen2Model", **_DECODER), "*Qwen2DecoderLayer"),
    Entry("phi", "decoder", _hf("PhiConfig", "PhiModel", **_DECODER), "*PhiDecoderLayer"),
    Entry("gemma", "decoder", _hf("GemmaConfig", "GemmaModel", head_dim=8, **_DECODER),
          "*GemmaDecoderLayer"),
    Entry("gpt_neox", "decoder", _hf("GPTNeoXConfig", "GPTNeoXModel", hidden_size=32,
                                     intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, vocab_size=100,
                                     max_position_embeddings=64, use_cache=False),
          "*GPTNeoXLayer"),
    Entry("opt", "decoder", _hf("OPTConfig", "OPTModel", hidden_size=32, ffn_dim=64,
                                num_hidden_layers=2, num_attention_heads=4, vocab_size=100,
                                max_position_embeddings=64, word_embed_proj_dim=32,
                                use_cache=False), "*OPTDecoderLayer"),
    Entry("bloom", "decoder", _hf("BloomConfig", "BloomModel", hidden_size=32, n_layer=2,
                                  n_head=4, vocab_size=100, use_cache=False), "*BloomBlock"),
    # encoder-decoders
    Entry("t5", "encoder-decoder", _encoder_decoder(
        "T5Config", "T5Model", d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        vocab_size=100, decoder_start_token_id=0, pad_token_id=0), "*T5Block"),
    Entry("bart", "encoder-decoder", _encoder_decoder(
        "BartConfig", "BartModel", d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, vocab_size=100, max_position_embeddings=64),
          "*Bart*Layer"),
    # encoders
    Entry("bert", "encoder", _hf("BertConfig", "BertModel", **_ENCODER), "*BertLayer"),
    Entry("roberta", "encoder", _hf("RobertaConfig", "RobertaModel", **_ENCODER), "*RobertaLayer"),
    Entry("distilbert", "encoder", _hf("DistilBertConfig", "DistilBertModel", dim=32,
                                       hidden_dim=64, n_layers=2, n_heads=2, vocab_size=100,
                                       max_position_embeddings=64), "*TransformerBlock"),
    Entry("electra", "encoder", _hf("ElectraConfig", "ElectraModel", embedding_size=32,
                                    **_ENCODER), "*ElectraLayer"),
    Entry("albert", "encoder", _hf("AlbertConfig", "AlbertModel", embedding_size=16,
                                   **_ENCODER), "*AlbertLayer"),
    # vision transformers
    Entry("vit", "vision", _vision("ViTConfig", "ViTModel", image_size=32, patch_size=8,
                                   hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2), "*ViTLayer"),
    Entry("deit", "vision", _vision("DeiTConfig", "DeiTModel", image_size=32, patch_size=8,
                                    hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=2), "*DeiTLayer"),
    Entry("swin", "vision", _vision("SwinConfig", "SwinModel", image_size=32, patch_size=4,
                                    embed_dim=16, depths=(2, 2), num_heads=(2, 2),
                                    window_size=4), "*SwinLayer"),
    Entry("convnext_hf", "vision", _vision("ConvNextConfig", "ConvNextModel", num_stages=2,
                                           hidden_sizes=(16, 32), depths=(2, 2)),
          "*ConvNextLayer"),
    # audio
    Entry("whisper", "audio", _whisper, "*Whisper*Layer"),
    Entry("wav2vec2", "audio", _wav2vec2, "*Wav2Vec2EncoderLayerStableLayerNorm"),
    # timm CNNs
    Entry("resnet18", "cnn", _timm("resnet18"), "*BasicBlock"),
    Entry("efficientnet_b0", "cnn", _timm("efficientnet_b0"), "*InvertedResidual"),
    Entry("convnext_atto", "cnn", _timm("convnext_atto"), "*ConvNeXtBlock"),
    Entry("mobilenetv3", "cnn", _timm("mobilenetv3_small_050"), "*InvertedResidual"),
    # diffusion
    Entry("unet2d", "diffusion", _unet, "*ResnetBlock2D"),
    Entry("dit", "diffusion", _dit, "*BasicTransformerBlock"),
)

FAST = ("llama", "bart", "distilbert", "vit", "wav2vec2")
"""The subset ``make test`` runs (tests/test_zoo.py): one per transformers family."""


def entry(name: str) -> Entry:
    return next(e for e in ZOO if e.name == name)
