"""Small random Hugging Face checkpoint folders (``save_pretrained``), one per family.

Each has 4 decoder layers and tiny sizes; every weight is drawn from a normal distribution
(fixed seed), so two layers never share a value and a call wired to another layer's weight
changes the logits. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import torch

LAYERS = 4
SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
           shared_expert_intermediate_size=40)

FAMILIES: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", SMALL),
    "qwen2": ("Qwen2Config", SMALL),
    "qwen3": ("Qwen3Config", {**SMALL, "head_dim": 8}),
    "mistral": ("MistralConfig", {**SMALL, "sliding_window": None}),
    "phi3": ("Phi3Config", {**SMALL, "pad_token_id": 0}),
    "gemma2": ("Gemma2Config", {**SMALL, "head_dim": 8, "sliding_window": 4,
                                "query_pre_attn_scalar": 8}),
    "gpt2": ("GPT2Config", dict(vocab_size=96, n_embd=32, n_layer=LAYERS, n_head=4,
                                n_positions=64)),
    "qwen2_moe": ("Qwen2MoeConfig", {**SMALL, **MOE}),
}
"""model_type -> (transformers config class, its settings)."""

ROBERTA = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=48, max_position_embeddings=64, is_decoder=True)
OTHER_DECODERS: dict[str, tuple[str, dict]] = {
    # positions start after the padding index (the graph adds it to position_ids)
    "roberta": ("RobertaConfig", ROBERTA),
    "xlm-roberta": ("XLMRobertaConfig", ROBERTA),
    # multi-head latent attention (keys 16 wide, values 12), layer 0 dense, the others MoE
    "deepseek_v3": ("DeepseekV3Config", {
        **SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4, "kv_lora_rank": 16,
        "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 12,
        "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "n_group": 2, "topk_group": 1, "moe_intermediate_size": 24, "n_shared_experts": 1}),
    # a hybrid: short-convolution layers (a convolution state, no keys and values) and
    # attention layers
    "lfm2": ("Lfm2Config", {**SMALL, "layer_types": ["conv", "full_attention", "conv", "conv"],
                            "conv_L_cache": 3, "block_auto_adjust_ff_dim": False}),
    # a Mamba-2 hybrid: state-space layers (a convolution and a recurrent state) around an
    # attention layer (convolution channels 64 + 2 x 8); chunks of 4 tokens, so that eager's
    # prefill scans several
    "bamba": ("BambaConfig", {**SMALL, "attn_layer_indices": [1], "mamba_n_heads": 4,
                              "mamba_d_head": 16, "mamba_d_state": 8, "mamba_expand": 2,
                              "mamba_chunk_size": 4, "mamba_d_conv": 4}),
    # a gated delta net hybrid: linear-attention layers (a convolution and a recurrent
    # state; 4 value heads over 2 key heads, convolution channels 2 x 16 + 32) around an
    # attention layer, MoE in every layer
    "qwen3_next": ("Qwen3NextConfig", {
        **SMALL, **MOE, "head_dim": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
        "layer_types": ["linear_attention", "full_attention", "linear_attention",
                        "linear_attention"]}),
    # Nemotron-H: Mamba-2 layers (2 groups, 4 heads of 16) and an attention layer, each
    # followed by an MLP layer that keeps no state (no past, no present): three layer kinds
    "nemotron_h": ("NemotronHConfig", {
        **SMALL, "num_hidden_layers": 6, "head_dim": 8,
        "layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
        "use_mamba_kernels": False, "ssm_state_size": 8, "mamba_num_heads": 4,
        "mamba_head_dim": 16, "n_groups": 2, "chunk_size": 4, "conv_kernel": 4}),
    # Mamba (1) layers (a convolution and a recurrent state [batch, 64 channels, state 8])
    # around an attention layer (1); MoE in layers 1 and 3: three layer kinds
    "jamba": ("JambaConfig", {
        **SMALL, **MOE, "attn_layer_period": 4, "attn_layer_offset": 1,
        "expert_layer_period": 2, "expert_layer_offset": 1, "mamba_d_state": 8,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 8, "use_mamba_kernels": False}),
    # Zamba: Mamba (1) layers scanning 2 heads each (a recurrent state [batch, 2 heads, 32
    # channels, 8]), two of them also calling the one attention block they share (hybrid)
    "zamba": ("ZambaConfig", {
        **SMALL, "layers_block_type": ["mamba", "hybrid"] * 2, "n_mamba_heads": 2,
        "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 8,
        "attention_head_dim": 16, "use_mamba_kernels": False}),
    # Mamba (1) alone: no attention, its mask the new tokens' (the graph keeps the last
    # columns of the documented one)
    "mamba": ("MambaConfig", dict(vocab_size=96, hidden_size=32, state_size=8,
                                  num_hidden_layers=LAYERS, expand=2, conv_kernel=4,
                                  time_step_rank=8)),
    # RecurrentGemma: recurrent blocks (a short convolution, then the RG-LRU; transformers
    # keeps their states on the modules) around a sliding-window attention layer (1)
    "recurrent_gemma": ("RecurrentGemmaConfig", {
        **SMALL, "head_dim": 8, "lru_width": 32, "conv1d_width": 4, "attention_window_size": 8,
        "block_types": ["recurrent", "attention", "recurrent", "recurrent"]}),
    # MiniMax: lightning attention layers (a recurrent state [batch, 4 heads, 8, 8] in a
    # cache class of its own; eager's prefill in blocks of 4 tokens) around an attention
    # layer (1), MoE in each
    "minimax": ("MiniMaxConfig", {
        **SMALL, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
        "block_size": 4, "layer_types": ["linear_attention", "full_attention",
                                         "linear_attention", "linear_attention"]}),
    # Inkling: every layer keeps keys and values and four convolution states (its keys',
    # values', attention output's and MLP output's); sliding-window layers (window 8) and a
    # full one (1), MoE in each
    "inkling_text": ("InklingTextConfig", {
        **SMALL, "head_dim": 8, "swa_head_dim": 8, "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 2, "d_rel": 8, "sliding_window_size": 8, "rel_extent": 64,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
        "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid_sliding"],
        "mlp_layer_types": ["sparse"] * 4}),
    # DeepSeek-V4: a sliding-window layer (window 8), compressed sparse attention layers
    # (1, 3: windows of 4, an indexer of 16 heads keeping the 3 best entries: with few heads
    # its ReLU scores tie at 0 often, and which tied entry it keeps is unspecified) and a
    # heavily compressed one (2: windows of 8); hash routing in layer 0, MoE in the others
    "deepseek_v4": ("DeepseekV4Config", {
        **SMALL, "intermediate_size": 24, "head_dim": 32, "q_lora_rank": 24, "o_groups": 2,
        "o_lora_rank": 16, "index_n_heads": 16, "index_head_dim": 8, "index_topk": 3,
        "hc_mult": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 24, "sliding_window": 8, "partial_rotary_factor": 0.25,
        "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        "layer_types": ["sliding_attention", "compressed_sparse_attention",
                        "heavily_compressed_attention", "compressed_sparse_attention"],
        "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"]}),
    # Kimi-Linear: Kimi delta attention layers (a convolution state over q, k, v of 4 heads
    # of 8, a recurrent state [batch, 4, 8, 8] decayed per key channel) around a multi-head
    # latent attention layer (1); layer 0 dense, the others MoE
    "kimi_linear": ("KimiLinearConfig", {
        **SMALL, "num_key_value_heads": 4, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8, "v_head_dim": 8, "linear_head_dim": 8, "linear_num_heads": 4,
        "linear_conv_kernel_dim": 4, "num_local_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 24, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "layer_types": ["linear_attention", "full_attention", "linear_attention",
                        "linear_attention"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]}),
    # RWKV: no attention, a state list of its own (two token shifts and a WKV state per
    # layer); layer 0 has a norm more; layers rescaled every 2 (weights and hidden states
    # halved, as transformers does at inference)
    "rwkv": ("RwkvConfig", dict(vocab_size=96, hidden_size=32, attention_hidden_size=32,
                                intermediate_size=48, num_hidden_layers=LAYERS,
                                rescale_every=2)),
}
"""Causal LMs the family tests do not run (tests of one behaviour each)."""

TINY = dict(vocab_size=96, max_position_embeddings=64)
ENCODERS: dict[str, tuple[str, dict, str]] = {
    "bert": ("BertConfig", {**TINY, "hidden_size": 32, "num_hidden_layers": LAYERS,
                            "num_attention_heads": 4, "intermediate_size": 48},
             "BertForMaskedLM"),
    "bart": ("BartConfig", {**TINY, "d_model": 32, "encoder_layers": LAYERS,
                            "decoder_layers": LAYERS, "encoder_attention_heads": 4,
                            "decoder_attention_heads": 4, "encoder_ffn_dim": 48,
                            "decoder_ffn_dim": 48},
             "BartForConditionalGeneration"),
    "t5": ("T5Config", dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=LAYERS,
                            num_decoder_layers=LAYERS, num_heads=4,
                            decoder_start_token_id=0),  # as T5's own checkpoints say
           "T5ForConditionalGeneration"),
}
"""Encoders and encoder-decoders: model_type -> (config class, settings, model class)."""

AUDIO: dict[str, tuple[str, dict, str]] = {
    "whisper": ("WhisperConfig", dict(vocab_size=96, num_mel_bins=8, d_model=32,
                                      encoder_layers=LAYERS, decoder_layers=LAYERS,
                                      encoder_attention_heads=4, decoder_attention_heads=4,
                                      encoder_ffn_dim=48, decoder_ffn_dim=48,
                                      max_source_positions=16, max_target_positions=32,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                      decoder_start_token_id=1, begin_suppress_tokens=None),
                "WhisperForConditionalGeneration"),
}
"""Encoder-decoders over audio (``input_features``): model_type -> as :data:`ENCODERS`."""


def architecture(config) -> type:
    """The causal LM class for ``config`` (what ``architectures`` will name)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM._model_mapping[type(config)]


def write(family: str, folder: Path, *, shard: str | None = None, seed: int = 0,
          dtype: torch.dtype = torch.float32, layers: int | None = None,
          **config: object) -> Path:
    """A random checkpoint of ``family`` in ``folder`` (sharded at ``shard`` bytes, e.g.
    ``"20KB"``), in ``dtype``, with ``layers`` decoder layers instead of the family's
    :data:`LAYERS` (a decoder family of :data:`FAMILIES`) and ``config``'s settings over
    the family's (``tie_word_embeddings=True``); the folder."""
    import transformers

    if family in ENCODERS or family in AUDIO:
        name, settings, model_class = {**ENCODERS, **AUDIO}[family]
        config = getattr(transformers, name)(**settings)
        cls = getattr(transformers, model_class)
    else:
        name, settings = {**FAMILIES, **OTHER_DECODERS}[family]
        if layers is not None:
            settings = {**settings, "num_hidden_layers": layers}
        settings = {**settings, **config}
        config = getattr(transformers, name)(**settings)
        cls = architecture(config)
    torch.manual_seed(seed)
    model = cls(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)
    kwargs = {"max_shard_size": shard} if shard else {}
    model = model.to(dtype)
    model.save_pretrained(folder, **kwargs)
    return folder
