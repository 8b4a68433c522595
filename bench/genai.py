"""rewrite export vs onnxruntime-genai's builder at the same precision, from export to decode
(issue 39).

    flock /work/bench.lock nice .venv/bin/python -m bench.genai [--sizes 180m-fp32 2.5gb]
        [--precisions fp32 int4] [--repeats 3] [--steps 64] [--no-profile] [--no-verify]
        [--target onnxruntime]
    .venv/bin/python -m bench.genai --quick          # tiny4, 1 run, 8 steps: checks the harness

Checkpoints (built here into ``bench/out/`` by ``bench.checkpoint``, never downloaded; random
normal weights, a word-level tokenizer): ``180m-fp32`` (issue 39's fp32 Llama: 8 layers x 1024,
16/4 heads, MLP 4096, vocab 32000, untied head, 187M parameters) and ``2.5gb`` (Llama-3.2-1B
shaped, 1.24B parameters, bf16). For each checkpoint and precision:

* export rows, each a fresh process alone, in rounds of alternating order (``--repeats``,
  medians; ``bench.harness.run_row``: warm page cache, freed memory settled): ``export-P``:
  ``rewrite -v export DIR -o OUT/model.onnx --cache kv --precision P`` (int4: ``--block-size
  32``, symmetric, the default; ``--no-verify`` adds ``--no-verify``: no check against eager
  before writing, which the builder does not do either; ``--target onnxruntime`` adds
  ``--target onnxruntime``) and ``builder-P``: ``python -m
  onnxruntime_genai.models.builder -i DIR -o OUT -p P -e cpu`` (int4: ``--extra_options
  block_size=32 is_symmetric=true``, its defaults); wall time and peak RssAnon of the tree;
* eager fp32 (transformers, the checkpoint loaded in float32) in its own process: a prompt of
  ``--prompt`` (256) random token ids, ``generate(do_sample=False)`` of ``--steps`` + 1 new
  tokens (the end token held back), and the logits of one forward over prompt + continuation:
  the reference;
* each model in onnxruntime, a fresh process per model and round (2 threads, default graph
  optimizations, rounds of alternating order, medians), fed by the same code (input names;
  ``position_ids`` where the model has it; the cache as ``present`` -> ``past``, no shared
  buffer): after a warm-up (a prefill and 2 steps), the prefill of the prompt (ms) and
  ``--steps`` decode steps fed the eager continuation (ms/token: the median step), so that
  every logit row compares with eager's at the same position: mean |logit difference| and
  top-1 agreement (argmax equal to eager's) over the prefill's last row and every step;
* one onnxruntime-genai run per folder (``og.Model(folder)``, greedy, ``--steps`` + 1 new
  tokens): its tokens against eager's;
* unless ``--no-profile``: onnxruntime's profiler (``SessionOptions.enable_profiling``) over
  16 decode steps of each model: time per op type per token, and per decoder layer (also
  in ``bench/out/genai/SIZE/profiles.json``; each onnxruntime run in ``decoded.json``).

Targets (issue 39), each printed met or MISSED with the ratio: rewrite int4 decode ms/token
<= the builder int4's; fp32 prefill and decode <= the builder fp32's; int4 export faster than
the builder's at <= 1/2 its peak RssAnon; int4 mean |logit difference| <= the builder int4's.
The report goes to stdout and ``bench/out/genai.md``. Exit 1 if a run failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from bench.checkpoint import ENV, NAMES
from bench.harness import Result, Row, load_average, rounds, run_row, verdict
from bench.weights_model import OUT, ROOT, SIZES

PROMPT, STEPS, THREADS, BLOCK = 256, 64, 2, 32
WARM_STEPS, PROFILE_STEPS = 2, 16


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def _export(precision: str, verify: bool = True, target: str = "onnx") -> Row:
    extra = (["--block-size", str(BLOCK)] if precision == "int4" else []) + (
        [] if verify else ["--no-verify"]) + (
        ["--target", target] if target != "onnx" else [])
    return Row(lambda d, o: _python("-m", "rewrite", "-v", "export", str(d), "-o",
                                    str(o / "model.onnx"), "--cache", "kv", "--precision",
                                    precision, *extra), "model.onnx")


def _builder(precision: str) -> Row:
    extra = (["--extra_options", f"block_size={BLOCK}", "is_symmetric=true"]
             if precision == "int4" else [])
    return Row(lambda d, o: _python("-m", "onnxruntime_genai.models.builder", "-i", str(d),
                                    "-o", str(o), "-p", precision, "-e", "cpu", "-c",
                                    str(o / "cache_dir"), *extra))


def rows(precisions: list[str], verify: bool = True, target: str = "onnx") -> dict[str, Row]:
    """``export-P`` and ``builder-P`` for each precision P (``verify``: rewrite checks the
    model against eager before writing it, as by default; ``target``: ``--target``)."""
    return {f"{side}-{p}": row for p in precisions for side, row in (
        ("export", _export(p, verify, target)), ("builder", _builder(p)))}


# --- workers: each a fresh process (python -m bench.genai --worker KIND ...) ----------------


def reference(checkpoint: Path, target: Path, prompt: int, steps: int) -> None:
    """Eager fp32: prompt ids, the greedy continuation (``steps`` + 1 tokens) and the logits
    of each position that predicts one of them, into ``target`` (.npz)."""
    np.savez(target, **eager_reference(eager_model(checkpoint), prompt, steps))


def eager_model(checkpoint: Path) -> Any:
    """The checkpoint in transformers, in float32, for :func:`eager_reference`."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32,
                                                local_files_only=True).eval()


def eager_reference(model: Any, prompt: int, steps: int, seed: int = 0
                    ) -> dict[str, np.ndarray]:
    """:func:`reference`'s arrays: a prompt of ``prompt`` random ids (``seed``), eager's
    greedy continuation and its logits at each position predicting one of its tokens."""
    import torch

    vocab = model.config.vocab_size
    ids = torch.tensor(np.random.default_rng(seed).integers(1, vocab, prompt)[None])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=steps + 1, min_new_tokens=steps + 1,
                             pad_token_id=0)
        tokens = out[0, prompt:]
        logits = model(out[:, :-1]).logits[0, prompt - 1:]
    return {"prompt": ids[0].numpy(), "continuation": tokens.numpy(),
            "logits": logits.numpy()}


def _session(folder: Path, profile: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    options.log_severity_level = 3
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = str(folder / "ort-profile")
    return ort.InferenceSession(str(folder / "model.onnx"), options,
                                providers=["CPUExecutionProvider"])


class Feeder:
    """The same feeding code for every model: input ids, a mask of ones, ``position_ids``
    where the model has it, an empty cache first, then each ``present`` as the next
    ``past``."""

    def __init__(self, session: Any, head: int) -> None:
        self.session, self.head = session, head
        self.names = [i.name for i in session.get_inputs()]
        self.outputs = [o.name for o in session.get_outputs()]
        self.past: dict[str, np.ndarray] = {}
        for i in session.get_inputs():
            if i.name.startswith("past_key_values."):
                self.past[i.name] = np.zeros((1, i.shape[1], 0, head), np.float32)
        self.length, self.seconds = 0, 0.0

    def step(self, ids: np.ndarray, rehearse: bool = False) -> np.ndarray:
        """Run ``ids`` (one row) after what ran before; the logits of each position. With
        ``rehearse``, the same run once before, untimed; ``seconds`` is the last run's time."""
        total = self.length + len(ids)
        feeds = {"input_ids": ids[None].astype(np.int64),
                 "attention_mask": np.ones((1, total), np.int64), **self.past}
        if "position_ids" in self.names:
            feeds["position_ids"] = np.arange(self.length, total, dtype=np.int64)[None]
        if rehearse:
            self.session.run(None, feeds)
        start = time.perf_counter()
        values = dict(zip(self.outputs, self.session.run(None, feeds)))
        self.seconds = time.perf_counter() - start
        self.past = {name.replace("present.", "past_key_values."): value
                     for name, value in values.items() if name.startswith("present.")}
        self.length = total
        return values["logits"][0]


def _head(folder: Path) -> int:
    said = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    return int(said["head_size"])


def decode(folder: Path, ref: dict[str, np.ndarray]) -> dict[str, Any]:
    """Prefill ms, decode ms per step, and the logits' agreement with eager's (module
    docstring)."""
    session, head = _session(folder), _head(folder)
    warm = Feeder(session, head)
    warm.step(ref["prompt"])
    for token in ref["continuation"][:WARM_STEPS]:
        warm.step(token[None])
    feeder = Feeder(session, head)
    start = time.perf_counter()
    rows = [feeder.step(ref["prompt"])[-1]]
    prefill = time.perf_counter() - start
    times = []
    for token in ref["continuation"][:-1]:
        start = time.perf_counter()
        rows.append(feeder.step(token[None])[-1])
        times.append(time.perf_counter() - start)
    logits = np.stack(rows)
    return {"prefill_ms": prefill * 1e3, "decode_ms": statistics.median(times) * 1e3,
            "mean_abs": float(np.abs(logits - ref["logits"]).mean()),
            "max_abs": float(np.abs(logits - ref["logits"]).max()),
            "top1": float((logits.argmax(-1) == ref["logits"].argmax(-1)).mean())}


def og_greedy(folder: Path, ref: dict[str, np.ndarray]) -> dict[str, Any]:
    """onnxruntime-genai's greedy continuation of the prompt (the end token held back)."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    length = len(ref["prompt"]) + len(ref["continuation"])
    params.set_search_options(do_sample=False, max_length=length, min_length=length)
    generator = og.Generator(model, params)
    generator.append_tokens(ref["prompt"][None].astype(np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)][len(ref["prompt"]):]
    return {"tokens": tokens}


PARTS = (("norms", re.compile(r"norm", re.I)), ("attention", re.compile(r"attn|attention", re.I)),
         ("MLP", re.compile(r"mlp", re.I)), ("rotary", re.compile(r"rotary", re.I)))
"""Where a node of either model belongs, by its name: the builder's ``/model/layers.N/attn/...``,
rewrite's inlined ``_inlfunc_LlamaAttention_...`` (onnxruntime names a node of an inlined
function after the innermost function); anything else is the rest (embedding, lm_head,
masks, residual adds). The norms first: the builder's ``post_attention_layernorm`` is a
norm."""


def profile(folder: Path, ref: dict[str, np.ndarray]) -> dict[str, Any]:
    """onnxruntime's profile of :data:`PROFILE_STEPS` decode steps after the prefill (the
    first :data:`WARM_STEPS` not counted): ms per token of each node (its median over the
    steps: a machine shared with other work stalls a thread now and then), summed by op
    type; the median step."""
    session = _session(folder, profile=True)
    feeder = Feeder(session, _head(folder))
    feeder.step(ref["prompt"])
    for token in ref["continuation"][:PROFILE_STEPS]:
        feeder.step(token[None])
    path = Path(session.end_profiling())
    events = json.loads(path.read_text())
    path.unlink()
    runs = [e for e in events if e.get("name") == "model_run"][1 + WARM_STEPS:]
    durations: dict[str, list[float]] = {}
    kinds: dict[str, str] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        if any(r["ts"] <= event["ts"] <= r["ts"] + r["dur"] for r in runs):
            name = event["name"][: -len("_kernel_time")]
            durations.setdefault(name, []).append(event["dur"] / 1e3)
            kinds[name] = event["args"]["op_name"]
    nodes = {name: statistics.median(found) for name, found in durations.items()}
    ops: dict[str, float] = {}
    for name, ms in nodes.items():
        ops[kinds[name]] = ops.get(kinds[name], 0.0) + ms
    return {"ops": ops, "nodes": nodes}


WORKERS = {"decode": decode, "og": og_greedy, "profile": profile}


def worker(kind: str, args: list[str]) -> None:
    if kind == "reference":
        reference(Path(args[0]), Path(args[1]), int(args[2]), int(args[3]))
        return
    ref = dict(np.load(args[1]))
    print(json.dumps(WORKERS[kind](Path(args[0]), ref)))


# --- the run ---------------------------------------------------------------------------------


@attrs.define
class Runs:
    """The runs of one model in onnxruntime (dicts of :func:`decode`), as
    :func:`bench.harness.rounds` fills them."""

    runs: list[dict[str, Any]] = attrs.Factory(list)
    failed: str | None = None

    def median(self, key: str) -> float:
        return statistics.median(run[key] for run in self.runs)

    def spread(self, key: str, fmt: str) -> str:
        """``median (min-max)``: the machine is shared, the spread says how much."""
        found = [run[key] for run in self.runs]
        return f"{statistics.median(found):{fmt}} ({min(found):{fmt}}-{max(found):{fmt}})"


@attrs.frozen
class Bench:
    """Everything measured on one checkpoint."""

    size: str
    folder: Path
    commands: dict[str, str]
    exports: dict[str, Result]
    decoded: dict[str, Runs]
    og: dict[str, dict[str, Any] | None]
    eager: list[int]
    profiles: dict[str, dict[str, Any] | None]


def _worker(kind: str, *args: Any) -> tuple[dict[str, Any] | None, str]:
    """A worker's answer (its last line of output, JSON) or None, and its stderr."""
    proc = subprocess.run(_python("-m", "bench.genai", "--worker", kind, *map(str, args)),
                          cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr + proc.stdout
    lines = proc.stdout.strip().splitlines()
    return (json.loads(lines[-1]) if lines else {}), proc.stderr


def checkpoint_folder(size: str) -> Path:
    """The checkpoint folder, built (by ``bench.checkpoint``, in its own process) if needed."""
    build = _python("-m", "bench.checkpoint", "--build-only", "--size", size)
    return Path(subprocess.run(build, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                               check=True).stdout.strip())


def _exports(size: str, folder: Path, table: dict[str, Row], repeats: int, work: Path
             ) -> dict[str, Result]:
    results = {name: Result() for name in table}
    rounds(list(table), dict.fromkeys(table, repeats),
           lambda name: run_row(table[name], folder, work / name, names=NAMES,
                                inputs=sorted(folder.iterdir()), env=ENV),
           results, f"{size} export ", lambda run: f"{run.measure.seconds:.2f}s, RssAnon "
           f"{run.measure.anon_mb:.0f} MB")
    for name in table:
        shutil.rmtree(work / name / "cache_dir", ignore_errors=True)
    return results


def bench(size: str, precisions: list[str], repeats: int, steps: int, work: Path,
          profiled: bool, verify: bool = True, target: str = "onnx") -> Bench:
    """Every measure of the module docstring on one checkpoint."""
    folder, table = checkpoint_folder(size), rows(precisions, verify, target)
    exports = _exports(size, folder, table, repeats, work)
    ref = work / "reference.npz"
    done, log = _worker("reference", folder, ref, PROMPT, steps)
    if done is None:
        sys.exit(f"eager reference failed:\n{log[-3000:]}")
    ok = [name for name in table if exports[name].runs]
    decoded = {name: Runs() for name in ok}
    rounds(ok, dict.fromkeys(ok, repeats), lambda name: _worker("decode", work / name, ref),
           decoded, f"{size} onnxruntime ", lambda run: f"prefill {run['prefill_ms']:.0f} ms, "
           f"decode {run['decode_ms']:.1f} ms/token, top-1 {run['top1']:.2f}")
    og = {name: _worker("og", work / name, ref)[0] for name in ok}
    profiles = {name: _worker("profile", work / name, ref)[0] if profiled else None
                for name in ok}
    (work / "profiles.json").write_text(json.dumps(profiles))
    (work / "decoded.json").write_text(json.dumps({n: r.runs for n, r in decoded.items()}))
    commands = {name: table[name].command(NAMES) for name in table}
    eager = [int(t) for t in np.load(ref)["continuation"]]
    return Bench(size, folder, commands, exports, decoded, og, eager, profiles)


# --- the report ------------------------------------------------------------------------------


def _same(tokens: list[int] | None, other: list[int]) -> str:
    """``N of M`` equal from the start (greedy diverges for good at the first difference)."""
    if tokens is None:
        return "FAILED"
    same = next((i for i, (a, b) in enumerate(zip(tokens, other)) if a != b),
                min(len(tokens), len(other)))
    return f"{same} of {len(other)}"


def results_table(b: Bench) -> list[str]:
    """One line per row: the export (medians) and the model in onnxruntime (medians, with
    the spread)."""
    lines = ["| row | command | export wall s (median, n) | peak RssAnon MB | output MB | "
             "prefill ms, median (min-max) | decode ms/token, median (min-max) | mean (max) "
             "abs logit diff vs eager fp32 | top-1 agreement | onnxruntime-genai greedy "
             "tokens = eager's |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, result in b.exports.items():
        command = f"`{b.commands[name]}`"
        if not result.runs:
            lines.append(f"| {name} | {command} | FAILED: {result.failed} | | | | | | | |")
            continue
        export = (f"{result.median():.2f} (n={len(result.runs)}) | "
                  f"{result.peak('anon_mb'):,.0f} | {result.runs[-1].output_bytes / 2**20:,.0f}")
        runs = b.decoded.get(name)
        if runs is None or not runs.runs:
            failed = runs.failed if runs else "not run"
            lines.append(f"| {name} | {command} | {export} | FAILED: {failed} | | | | |")
            continue
        og = b.og.get(name)
        lines.append(
            f"| {name} | {command} | {export} | {runs.spread('prefill_ms', '.0f')} | "
            f"{runs.spread('decode_ms', '.1f')} | {runs.runs[0]['mean_abs']:.5f} "
            f"({runs.runs[0]['max_abs']:.3f}) | {runs.runs[0]['top1']:.3f} | "
            f"{_same(og and og['tokens'], b.eager)} |")
    return lines


def _ratio(mine: float, theirs: float, unit: str, bound: float, fmt: str = ".2f") -> str:
    ratio = mine / theirs
    unit = f" {unit}" if unit else ""
    return (f"{mine:{fmt}} / {theirs:{fmt}}{unit} = {ratio:.3f}x | <= {bound}x | "
            f"{verdict(ratio <= bound)} |")


def targets_table(b: Bench) -> list[str]:
    """Each target of issue 39 this run can judge: measured, target, verdict."""
    lines = ["| criterion (rewrite / builder) | measured | target | verdict |",
             "|---|---|---|---|"]
    dec = {name: runs for name, runs in b.decoded.items() if runs.runs}
    exp = {name: result for name, result in b.exports.items() if result.runs}
    pairs = (("export-int4", "builder-int4"), ("export-fp32", "builder-fp32"))
    for mine, theirs in pairs:
        if mine not in dec or theirs not in dec:
            continue
        p = mine.split("-")[1]
        if p == "fp32":
            lines.append(f"| fp32 prefill | " + _ratio(dec[mine].median("prefill_ms"),
                                                      dec[theirs].median("prefill_ms"), "ms", 1,
                                                      ".0f"))
        lines.append(f"| {p} decode per token | " + _ratio(
            dec[mine].median("decode_ms"), dec[theirs].median("decode_ms"), "ms", 1))
        if p == "int4":
            lines.append("| int4 mean abs logit difference vs eager fp32 | " + _ratio(
                dec[mine].runs[0]["mean_abs"], dec[theirs].runs[0]["mean_abs"], "", 1, ".5f"))
    if "export-int4" in exp and "builder-int4" in exp:
        mine, theirs = exp["export-int4"], exp["builder-int4"]
        lines.append("| int4 export, whole process (wall) | " + _ratio(
            mine.median(), theirs.median(), "s", 1))
        lines.append("| int4 export, peak RssAnon | " + _ratio(
            mine.peak("anon_mb"), theirs.peak("anon_mb"), "MB", 0.5, ",.0f"))
    return lines


def parts(nodes: dict[str, float]) -> dict[str, float]:
    """ms per token of each of :data:`PARTS` (and ``rest``), from the profile's nodes."""
    found = dict.fromkeys([*(name for name, _ in PARTS), "rest"], 0.0)
    for node, ms in nodes.items():
        part = next((name for name, pattern in PARTS if pattern.search(node)), "rest")
        found[part] += ms
    return found


def profile_table(b: Bench, top: int = 8) -> list[str]:
    """Per model: decode ms per token in kernels (the profiler's own cost per node is not in
    it), the top op types, and
    the time of each part per decoder layer (the rest: for the whole model)."""
    layers = SIZES[b.size].layers
    lines = ["| row | kernels ms/token | top op types, ms/token (share of kernel time) "
             f"| per decoder layer ({layers}): norms / attention / MLP / rotary; rest of the "
             "model, ms/token |", "|---|---|---|---|"]
    for name, found in b.profiles.items():
        if not found:
            continue
        kernels = sum(found["ops"].values())
        ops = sorted(found["ops"].items(), key=lambda item: -item[1])[:top]
        shown = ", ".join(f"{op} {ms:.2f} ({ms / kernels:.0%})" for op, ms in ops)
        split = parts(found["nodes"])
        rest = split.pop("rest")
        per_layer = " / ".join(f"{ms / layers:.3f}" for ms in split.values())
        lines.append(f"| {name} | {kernels:.2f} | {shown} | "
                     f"{per_layer}; {rest:.2f} |")
    return lines


def report(benches: list[Bench], command: str, started: datetime.datetime,
           loads: tuple[str, str], steps: int) -> str:
    import onnxruntime
    import onnxruntime_genai
    import torch
    import transformers

    lines = [
        "# genai benchmark (issue 39)", "",
        f"{started:%Y-%m-%d %H:%M} UTC, `{command}`, {platform.machine()}, {os.cpu_count()} "
        f"cores, Python {platform.python_version()}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}, onnxruntime {onnxruntime.__version__}, "
        f"onnxruntime-genai {onnxruntime_genai.__version__}, niceness {os.nice(0)}; load "
        f"average before {loads[0]}, after {loads[1]}. onnxruntime: {THREADS} threads, prompt "
        f"{PROMPT} tokens, {steps} decode steps fed eager fp32's greedy continuation; logits "
        f"compared over the prefill's last row and every step (bench/genai.py).", ""]
    for b in benches:
        lines += [f"### {b.size}: {SIZES[b.size].describe()} (`{b.folder.name}`)", "",
                  *results_table(b), "", *targets_table(b), ""]
        if any(b.profiles.values()):
            lines += [f"onnxruntime's profiler, {PROFILE_STEPS} decode steps after the "
                      "prefill:", "", *profile_table(b), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), help="default 180m-fp32 2.5gb")
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "int4"],
                        default=["fp32", "int4"])
    parser.add_argument("--repeats", type=int, help="runs per row (default 3, --quick 1)")
    parser.add_argument("--steps", type=int, help=f"decode steps (default {STEPS})")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--no-verify", action="store_true",
                        help="rewrite export --no-verify (its check against eager skipped)")
    parser.add_argument("--target", choices=["onnx", "onnxruntime"], default="onnx",
                        help="rewrite export --target")
    parser.add_argument("--quick", action="store_true", help="tiny4, 1 run, 8 steps")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], args.worker[1:])
        return 0
    sizes = args.sizes or (["tiny4"] if args.quick else ["180m-fp32", "2.5gb"])
    repeats = args.repeats or (1 if args.quick else 3)
    steps = args.steps or (8 if args.quick else STEPS)
    command = "python -m bench.genai " + " ".join(argv if argv is not None else sys.argv[1:])
    started, before = datetime.datetime.now(datetime.timezone.utc), load_average()
    benches = [bench(size, args.precisions, repeats, steps, OUT / "genai" / size,
                     not args.no_profile, not args.no_verify, args.target) for size in sizes]
    text = report(benches, command.strip(), started, (before, load_average()), steps)
    print(text)
    (OUT / "genai.md").write_text(text)
    bad = any(r.failed for b in benches for r in [*b.exports.values(), *b.decoded.values()])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
