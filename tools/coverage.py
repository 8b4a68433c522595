"""Which causal LMs ``rewrite export`` converts: every ``model_type`` of transformers'
causal-LM mapping, as a tiny random checkpoint, exported as a user runs it.

    .venv/bin/python -m tools.coverage [--only TYPE ...] [--jobs N] [--timeout 300]
        [--cache {kv,none}] [--table docs/COVERAGE.md | --update docs/COVERAGE.md] [--json FILE]

Per model type: its config class with small sizes (2 layers, hidden 64, 4 heads / 2 KV heads,
4 experts / top-2 where the family has experts; nested text configs likewise), random normal
weights (fixed seed), ``save_pretrained``; the eager model called with a cache on 6 tokens
first (a model whose own forward fails is not counted against rewrite); then ``rewrite export
DIR -o model.onnx`` in a fresh process. That command runs the written model in onnxruntime
against the eager model (a prefill and a decode step) before publishing it, so exit 0 means
"equal to eager"; exit 1 is a model that disagreed and was not written; exit 2 a refusal with
its one line; exit 3 a bug in rewrite. The table lists each type with its result and the
line that says why. ``--table`` writes the table of this run; ``--update`` puts this run's rows
(``--only`` some types, after a fix) in place of the same types' rows of an existing page,
its counts redone and the text above and below them kept. ``--cache none`` exports prefill
only (``rewrite export --cache none``: no cache inputs or outputs; the eager model called
without a cache first); its table says so in its heading and is a table of its own
(docs/COVERAGE-none.md): ``--update`` puts a run's rows in the table of its own cache only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128,
    "vocab_size_per_layer_input": 128,
    "max_position_embeddings": 128, "head_dim": 16, "num_experts": 4, "num_local_experts": 4,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "num_experts_per_token": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "n_layer": 2, "n_embd": 64, "n_head": 4,
    "d_model": 64, "n_positions": 128, "decoder_layers": 2, "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128, "encoder_layers": 2, "encoder_attention_heads": 4,
    "encoder_ffn_dim": 128, "num_layers": 2, "num_heads": 4, "ffn_dim": 128,
    "hidden_size_global": 64, "encoder_hash_byte_group_vocab": 128, "swa_head_dim": 16,
    "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
}
"""Small values for the config fields that set sizes, applied where a config has the field."""

RESULTS = {0: "converted, equal to eager", 1: "disagrees with eager (not written)",
           2: "refused (exit 2)", 3: "bug in rewrite (exit 3)"}


GROUPS = {"n_group": 2, "num_expert_group": 2, "topk_group": 1, "rotary_dim": 8,
          "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
          "expert_layer_offset": 1, "attn_layer_indices": [1]}
"""Settings that follow the small sizes: expert groups within 4 experts, a rotary part within
a 16-wide head, an attention layer among the first layers of a hybrid."""

PATTERNS = ("layer_types", "layers_block_type", "block_types")
"""The config fields that list each layer's kind."""

SHORT_CONV = ["conv", "full_attention", "conv", "conv"]
"""The layers of a short-convolution hybrid (LFM2's family: ``conv_L_cache``) whose config
lists none of its convolution layers (its defaults attend everywhere, or list nothing)."""

STATE_SPACE = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
"""The layers of a state-space hybrid whose config lists state-space layers only
(GraniteMoE-Hybrid's defaults: transformers' own forward fails without an attention layer)."""

TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
          "sep_token_id", "cls_token_id")
"""Special token ids, kept inside the small vocabulary."""

MLA = {"qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "kv_lora_rank": 32,
       "q_lora_rank": 32, "qk_head_dim": 16, "num_key_value_heads": 4, "index_n_heads": 4,
       "index_head_dim": 16}
"""Multi-head latent attention's sizes (DeepSeek-V2/V3 and their kin: one key/value head per
head; DeepSeek-V3.2's indexer), where present."""


NESTED = ("text_config", "decoder", "encoder_config", "decoder_config", "global_config",
          "patcher_config")
"""The fields of nested configs, made small likewise (BLT's byte encoder, decoder, global
transformer and entropy patcher)."""


def tiny_config(model_type: str):
    """The config of ``model_type`` with :data:`SIZES` wherever it has those fields (hybrid
    models keep the first four layers of their pattern, so that both kinds occur)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    try:  # given at construction, so that derived fields (MLA's head_dim) follow
        config = AutoConfig.for_model(model_type, **_small(config.to_dict()))
    except Exception:  # noqa: BLE001 - a validator refusing a combination: set them after
        pass
    for part in [config, *(getattr(config, k, None) for k in NESTED)]:
        if part is not None and hasattr(part, "to_dict"):
            fields = part.to_dict()
            for key, value in _small(fields).items():
                if fields.get(key) != value:  # already so (Dory writes its counts doubled)
                    _set(part, key, value)
            _missing_defaults(part)
    return config


def _missing_defaults(config) -> None:
    """Fields a family's modeling code reads that its default config leaves unset (a real
    checkpoint's config sets them): DBRX's attention ``rope_theta`` and ``clip_qkv`` (its
    clamp takes no None); X-MOD's default language adapter; RoPE parameters for each layer
    kind where the defaults give none (Cohere Compass)."""
    attention = getattr(config, "attn_config", None)
    if attention is not None and hasattr(attention, "kv_n_heads"):  # DBRX's
        if getattr(attention, "rope_theta", None) is None:
            attention.rope_theta = 10000.0
        if getattr(attention, "clip_qkv", None) is None:
            attention.clip_qkv = 8.0
    languages = getattr(config, "languages", None)
    if languages and getattr(config, "default_language", "unset") is None:  # X-MOD's
        config.default_language = languages[0]  # adapter, which its forward needs chosen
    kinds = getattr(config, "layer_types", None)
    if getattr(config, "rope_parameters", None) == {} and kinds:
        config.rope_parameters = {kind: {"rope_type": "default", "rope_theta": 10000.0}
                                  for kind in dict.fromkeys(kinds)}


def _small(fields: dict) -> dict:
    """The small values for the size fields among ``fields``."""
    sizes = {**SIZES, **MLA} if "kv_lora_rank" in fields else SIZES
    small = {key: value for key, value in sizes.items() if key in fields
             and not (key == "head_dim" and "qk_rope_head_dim" in fields)}
    small.update({key: value for key, value in GROUPS.items() if key in fields})
    for key in TOKENS:
        if key in fields and fields[key] is not None:
            small[key] = _token(fields[key])
    if "conv_L_cache" in fields and "conv" not in (fields.get("layer_types") or ()):
        fields = {**fields, "layer_types": SHORT_CONV}
    if set(fields.get("layer_types") or ()) == {"linear_attention"}:
        fields = {**fields, "layer_types": STATE_SPACE}
    for key in PATTERNS:
        pattern = fields.get(key)
        if isinstance(pattern, list) and pattern:
            small["num_hidden_layers"] = layers = _kept(pattern)
            small[key] = pattern[:layers]
            if fields.get("num_kv_shared_layers"):  # as many layers again, reading their caches
                small[key] = pattern[:layers] * 2
                small["num_hidden_layers"] = small["num_kv_shared_layers"] = layers
                small["num_hidden_layers"] = 2 * layers
    layers = small.get("num_hidden_layers", fields.get("num_hidden_layers"))
    small.update(_validated(fields, small, layers))
    if isinstance(fields.get("activation_sparsity_pattern"), list):
        small["activation_sparsity_pattern"] = [0.0] * layers
    for key, value in list(small.items()):  # a size given per layer: one per layer
        if isinstance(fields.get(key), list) and isinstance(value, int) and layers:
            small[key] = [value] * layers
    per_layer = fields.get("per_layer_config")
    if isinstance(per_layer, dict):
        layers = small.get("num_hidden_layers", fields.get("num_hidden_layers", 2))
        small["per_layer_config"] = {k: v for k, v in per_layer.items() if int(k) < layers}
    return small


def _validated(fields: dict, small: dict, layers: int | None) -> dict:
    """Fields that must follow the small sizes for the family's own validators (or its
    modeling code) to accept them: a router's top-k no higher than the family's (ZAYA, Llama
    4: 1), Mamba-2's heads filling ``hidden_size * expand``, GPT-Neo's global / local pattern
    one pair per two layers, a shared-expert count where the defaults leave it None
    (dots1), two Zamba hybrid layers sharing their block (one is refused by transformers'
    weight tying), HRM's layer count the slots of its cycles (one layer per stack), Inkling 2's
    unpadded vocabulary, LongCat's ``head_dim`` its rotary width as in its defaults."""
    out: dict = {}
    top = fields.get("num_experts_per_tok")
    if isinstance(top, int) and top < small.get("num_experts_per_tok", top):
        out["num_experts_per_tok"] = top
    if {"expand", "num_heads", "head_dim"} <= fields.keys():
        width = small.get("hidden_size", fields.get("hidden_size")) * fields["expand"]
        out["num_heads"] = width // small.get("head_dim", fields["head_dim"])
    if "attention_types" in fields:  # its layer count is num_layers, set through a map
        count = layers or SIZES["num_hidden_layers"]
        out["attention_types"] = [[["global", "local"], max(1, count // 2)]]
    if "n_shared_experts" in fields and fields["n_shared_experts"] is None:
        out["n_shared_experts"] = 1
    if fields.get("unpadded_vocab_size") is not None:  # before padding (Inkling 2)
        out["unpadded_vocab_size"] = small.get("vocab_size", fields["unpadded_vocab_size"])
    if "qk_rope_head_dim" in small and fields.get("head_dim") == fields.get("qk_rope_head_dim"):
        out["head_dim"] = small["qk_rope_head_dim"]  # the rotary part's width (LongCat)
    if fields.get("model_type") == "zamba":  # its hybrid layers share one attention block,
        out["layers_block_type"] = ["linear_attention", "hybrid"] * 2  # tied from the first
        out["num_hidden_layers"] = 4  # to the others: transformers needs a second to tie
    if "indexer_compress_ratio" in fields and fields["indexer_compress_ratio"] is None:
        out.update(indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16,
                   indexer_budget=8, indexer_compress_ratio=4)  # Qwen4-Exp builds its
        # token indexer whether or not its defaults set one (they leave every size None)
    if "n_recurrent_loops" in fields:  # Dory: an input, a recurrent and an output layer, as
        out.update(num_hidden_layers=6, n_input_layers=2, n_recurrent_layers=2,  # released
                   n_output_layers=2, layer_types=[  # configs list them: attention then MLP
                       kind for attention in ("sliding_attention", "full_attention",
                                              "sliding_attention") for kind in (attention, "mlp")])
    if "num_layers_per_stack" in fields:  # HRM: a cache slot per stacked layer per cycle
        cycles = fields.get("H_cycles", 1) * (fields.get("L_cycles", 0) + 1)
        out["num_layers_per_stack"], out["num_hidden_layers"] = 1, cycles
    return out


def _kept(pattern: list) -> int:
    """How many of a hybrid's layers to keep: 4, or up to the first layer of each kind."""
    kinds = [str(kind) for kind in pattern]
    firsts = [kinds.index(kind) for kind in dict.fromkeys(kinds)]
    return min(len(pattern), max(4, max(firsts) + 1))


def _token(value):
    """A special token id (or list of them) inside :data:`SIZES`' vocabulary."""
    if isinstance(value, list):
        return [_token(v) for v in value]
    return value % SIZES["vocab_size"] if isinstance(value, int) else value


def _set(config, key: str, value) -> None:
    try:
        setattr(config, key, value)
    except (AttributeError, TypeError, ValueError):  # a derived property: left as it is
        pass


def write_checkpoint(model_type: str, folder: Path, cache: str = "kv") -> str | None:
    """A tiny random checkpoint; None, or why the eager model cannot be used (called on 6
    tokens with a cache, or without one for ``cache="none"``)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        config = tiny_config(model_type)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.normal_(0.0, 0.2)
        model.save_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder).eval()  # as rewrite will
        with torch.no_grad():
            ids = torch.randint(0, 100, (1, 6))
            model(input_ids=ids, attention_mask=torch.ones_like(ids),
                  use_cache=cache != "none")
    except Exception as e:  # noqa: BLE001 - any failure: the eager model is unusable
        return f"{type(e).__name__}: {_first(str(e))}"
    return None


def _first(text: str, width: int = 240) -> str:
    """The first non-blank line of ``text``, cut to ``width`` with an ellipsis saying so."""
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= width else line[:width - 3].rstrip() + "..."


def run_one(model_type: str, timeout: float, cache: str = "kv") -> dict:
    """Build, export (``rewrite export --cache CACHE``) and classify one model type (each in
    its own processes)."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"coverage-{model_type}-") as tmp:
        folder = Path(tmp) / "checkpoint"
        try:
            build = subprocess.run(
                [sys.executable, "-c", "import sys; from tools.coverage import "
                 "write_checkpoint; from pathlib import Path; why = write_checkpoint("
                 "sys.argv[1], Path(sys.argv[2]), sys.argv[3]); print(why or ''); "
                 "sys.exit(3 if why else 0)", model_type, str(folder), cache],
                cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if build.returncode != 0:
                why = _first(build.stdout) or _first(build.stderr.splitlines()[-1]
                                                     if build.stderr else "")
                return _row(model_type, "eager unusable", why, start)
            run = subprocess.run([sys.executable, "-m", "rewrite", "export", str(folder),
                                  "-o", str(Path(tmp) / "model.onnx"), "--cache", cache],
                                 cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            step = "building the checkpoint" if e.cmd[1] == "-c" else "rewrite export"
            return _row(model_type, "timeout", f"{step} over {timeout:.0f} s", start)
    err = run.stderr.strip().splitlines()
    said = [line for line in err if "error" in line.lower() or "disagrees" in line]
    verified = re.search(r"max \|difference\| (\S+)", run.stderr + run.stdout)
    last = err[-1:] if run.returncode == 2 else []  # a refusal is one line, the last
    why = verified.group(0) if run.returncode == 0 and verified else _first(
        (last or said or err or [""])[-1])
    result = RESULTS.get(run.returncode, f"exit {run.returncode}")
    return {**_row(model_type, result, why, start, trace=traced(run.stderr + run.stdout)),
            "code": run.returncode}


def traced(said: str) -> str:
    """How ``rewrite export`` traced the layers, from what it said: ``per layer`` (each
    distinct layer traced once), ``whole: <reason>`` (it fell back to tracing every layer), or
    empty (it did not get that far)."""
    fell = re.findall(r"torch\.export traces every layer: (.*)", said)
    if fell:
        return "whole: " + _first(fell[-1])
    return "per layer" if re.search(r"torch\.export: \d+ of \d+ layers traced", said) else ""


def _row(model_type: str, result: str, why: str, start: float, seconds: float | None = None,
         trace: str = "") -> dict:
    """One row: its seconds since ``start`` (a ``time.perf_counter()``), or ``seconds``;
    ``trace`` as :func:`traced` says it."""
    return {"type": model_type, "result": result, "why": why, "trace": trace,
            "seconds": round(time.perf_counter() - start if seconds is None else seconds, 1)}


PAGES = {"kv": "docs/COVERAGE.md", "none": "docs/COVERAGE-none.md"}
"""Each cache's page."""

PREFILL = ", prefill only (`--cache none`)"
"""What a ``--cache none`` table's heading says after its count."""


def table(rows: list[dict], cache: str = "kv") -> str:
    """The markdown table, with the counts per result first; its heading says the cache."""
    import transformers

    counts: dict[str, int] = {}
    for row in rows:
        counts[row["result"]] = counts.get(row["result"], 0) + 1
    option = "" if cache == "kv" else f"--cache {cache} "
    lines = [f"transformers {transformers.__version__}, {len(rows)} causal-LM model types"
             f"{PREFILL if cache == 'none' else ''} "
             f"(`python -m tools.coverage {option}--table {PAGES[cache]}`):", ""]
    lines += [f"- {result}: {n}" for result, n in sorted(counts.items(), key=lambda x: -x[1])]
    lines += ["", "| model type | result | why | layers traced | seconds |",
              "|---|---|---|---|---|"]
    for row in rows:
        why, trace = (row.get(k, "").replace("|", "\\|") for k in ("why", "trace"))
        lines.append(f"| {row['type']} | {row['result']} | {why} | {trace} | "
                     f"{row['seconds']} |")
    return "\n".join(lines) + "\n"


HEADING = re.compile(r"^transformers \S+, \d+ causal-LM model types(?P<none>"
                     + re.escape(PREFILL) + ")?", re.M)


def update(page: str, rows: list[dict], cache: str = "kv") -> str:
    """``page`` (a ``--table`` page) with ``rows`` in place of its rows of the same types in
    its table of ``cache``: the counts and the table redone, the text above and below kept."""
    headings = {("none" if h.group("none") else "kv"): h for h in HEADING.finditer(page)}
    if cache not in headings:
        has = " and ".join(f"--cache {c}" for c in headings)
        what = f"a table of {has} only" if has else "no table written by --table"
        raise SystemExit(f"--update: the page has {what}, not one of --cache {cache} "
                         f"(its page: {PAGES[cache]})")
    heading = headings[cache]
    section = page[heading.start():].splitlines(keepends=True)
    end = next((i for i, line in enumerate(section) if i > 2 and not line.startswith("|")
                and section[i - 1].startswith("|")), len(section))
    kept = {}
    for line in section[:end]:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) in (4, 5) and cells[-1] not in ("seconds", "---"):
            trace = cells[3].replace("\\|", "|") if len(cells) == 5 else ""
            kept[cells[0]] = _row(*cells[:2], cells[2].replace("\\|", "|"), 0.0,
                                  float(cells[-1]), trace)
    kept.update({row["type"]: row for row in rows})
    return (page[:heading.start()] + table([kept[t] for t in sorted(kept)], cache)
            + "".join(section[end:]))


def main(argv: list[str] | None = None) -> int:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="TYPE")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--jobs", type=int, default=1, help="model types run at once")
    parser.add_argument("--cache", choices=sorted(PAGES), default="kv",
                        help="rewrite export's --cache: kv (decode-ready, the default) or none "
                             "(prefill only); each has a table of its own")
    parser.add_argument("--table", type=Path, help="write the markdown table here")
    parser.add_argument("--update", type=Path,
                        help="put the rows in place of the same types' rows of this page")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    types = args.only or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.update:  # a page without this cache's table: said before any run
        update(args.update.read_text(), [], args.cache)
    rows = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:  # each runs processes
        for n, row in enumerate(pool.map(lambda t: run_one(t, args.timeout, args.cache),
                                         types), 1):
            rows.append(row)
            print(f"[{n}/{len(types)}] {row['type']}: {row['result']} ({row['seconds']} s) "
                  f"{row['why']}", flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    text = table(rows, args.cache)
    if args.table:
        args.table.write_text(text)
    if args.update:
        args.update.write_text(update(args.update.read_text(), rows, args.cache))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
