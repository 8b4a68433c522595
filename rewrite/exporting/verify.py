"""Before a model is published: onnxruntime runs the written file on a few tokens and its
outputs are compared with the eager model's. A mismatch is a :class:`VerificationError`
(exit 1, the largest difference and the output it is in); the model is never published.

A :class:`Check` is made before exporting, from the eager model (cheap: a few tokens), and
run on the staged file by the writer (:func:`rewrite.backends.onnx.save.write_model`), after
the weights are written and before the output's name is given to it. Each :class:`Step`
feeds the graph inputs by name (a step may take inputs from the previous step's outputs:
a decode step feeds back the ``present`` cache) and compares named outputs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
from attrs import frozen

from rewrite.errors import LibraryError, VerificationError

if TYPE_CHECKING:
    import torch


@frozen
class Step:
    """One run of the model: its feeds, the eager outputs it must give."""

    feeds: Mapping[str, np.ndarray]
    expected: Mapping[str, np.ndarray]
    carried: Mapping[str, str] = {}
    """Input name -> the previous step's output fed to it (the cache fed back)."""
    name: str = "run"


@frozen
class Check:
    """What onnxruntime must reproduce before a model is published."""

    steps: tuple[Step, ...]
    atol: float
    rtol: float
    """Allowed: ``|onnx - eager| <= atol + rtol * max|eager|`` per output."""
    what: str
    """For the note: ``prefill of 4 tokens and one decode step``."""

    def __call__(self, model_path: Path) -> str:
        """Run the staged file; a note, or :class:`VerificationError` on a mismatch."""
        session = open_session(model_path)
        if isinstance(session, str):
            return session
        worst, _ = self.run(session)
        return f"verified against eager in onnxruntime ({self.what}): max |difference| " \
               f"{worst:.2g}"

    def run(self, session: Any, strict: bool = True, memo: dict | None = None
            ) -> tuple[float, float]:
        """The steps in ``session``: (largest |difference|, largest relative to its
        output's largest value); ``strict``: a mismatch is a :class:`VerificationError`;
        ``memo``: the outputs of steps run before (by their feeds and the steps before
        them), not run again."""
        names = [o.name for o in session.get_outputs()]
        worst = relative = 0.0
        previous: dict[str, np.ndarray] = {}
        key: tuple = ()
        for step in self.steps:
            feeds = {**step.feeds, **{i: previous[o] for i, o in step.carried.items()}}
            key = (key, tuple((n, a.shape, a.tobytes()) for n, a in sorted(step.feeds.items())))
            if memo is None or key not in memo:
                outputs = dict(zip(names, _run(session, feeds, step.name)))
                if memo is not None:
                    memo[key] = outputs
            previous = outputs if memo is None else memo[key]
            difference, largest = self._compare(step, previous, strict)
            worst, relative = max(worst, difference), max(relative, largest)
        return worst, relative

    def _compare(self, step: Step, got: Mapping[str, np.ndarray], strict: bool
                 ) -> tuple[float, float]:
        worst = relative = 0.0
        for name, expected in step.expected.items():
            value = got[name]
            if value.shape != expected.shape:
                raise VerificationError(
                    f"the exported model disagrees with eager PyTorch: {name} ({step.name}) "
                    f"has shape {list(value.shape)}, eager {list(expected.shape)}")
            if not value.size:
                continue
            a, b = value.astype(np.float64), expected.astype(np.float64)
            difference = float(np.max(np.abs(a - b)))
            largest = float(np.max(np.abs(b)))
            allowed = self.atol + self.rtol * largest
            relative = max(relative, difference / largest if largest else difference)
            if strict and not difference <= allowed:  # NaN is a mismatch too
                raise VerificationError(
                    f"the exported model disagrees with eager PyTorch: {name} ({step.name}) "
                    f"differs by up to {difference:.3g} (allowed {allowed:.2g}); nothing "
                    "was written")
            worst = max(worst, difference)
        return worst, relative


def _run(session: Any, feeds: dict[str, np.ndarray], step: str) -> list:
    """``session.run`` of every output; onnxruntime failing on the file it loaded (a kernel
    raising) is a :class:`LibraryError` naming onnxruntime and its version."""
    try:
        return session.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own classes
        raise LibraryError("onnxruntime", f"running the exported model ({step})", e) from e


def open_session(model_path: Path, int4: bool = False, nbits: bool = False) -> Any:
    """An onnxruntime session of the file, unoptimized (what the file says; its weights
    mapped, not copied: no prepacking, no arena keeping a run's buffers), or a note saying
    why there is none: onnxruntime is not installed, or lacks a kernel the model needs (bf16
    on CPU). A file onnxruntime refuses to load otherwise (its graph invalid: a shape
    inference error, a malformed node) is a :class:`VerificationError`: never published
    unchecked. ``int4``: optimized instead, each ``DequantizeLinear`` +
    ``MatMul`` fused into one ``MatMulNBits`` computing in float32 (accuracy level 0: the
    file's numbers to float32's rounding), which dequantizes each weight once, not at
    every run (a 1.24B model's two runs: 9.5 s instead of 20 s). ``nbits``: the file holds
    ``MatMulNBits`` (a tied head reading its table, ``--target onnxruntime``), which computes
    in float32 too (:func:`_nbits_in_float32`)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return ("not verified against eager: onnxruntime is not installed "
                "(pip install onnxruntime)")
    options = ort.SessionOptions()
    model: str | bytes = str(model_path)
    if int4:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
        if nbits:  # the graph given as bytes finds its data file in the file's folder
            model = _nbits_in_float32(model_path)
            options.add_session_config_entry(
                "session.model_external_initializers_file_folder_path", str(model_path.parent))
    else:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.enable_cpu_mem_arena = False  # a 1.24B model's second run: 1.0 GB, not 2.1
        # each weight's Transpose (a layer function's input: nothing folds it) next to its
        # MatMul, not all first (topological order: every transposed copy alive at once):
        # a 187M fp32 model's run 0.22 s and +180 MB, not 0.36 s and +460 MB
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own classes
        if type(e).__name__ == "NotImplemented":  # a kernel onnxruntime lacks (bf16 on CPU)
            return f"not verified against eager: onnxruntime cannot run it ({_short(e)})"
        older = _opsets_beyond(str(e), model_path)
        if older is not None:
            return f"not verified against eager: {older}"
        raise VerificationError(f"onnxruntime refuses the exported model as invalid "
                                f"({_short(e)}): a bug in rewrite, please report it; nothing "
                                "was written") from None


MIN_ONNXRUNTIME = "1.31"
"""The oldest onnxruntime release the suite passes with (1.31.0, session 22; also what
onnxruntime-genai 0.18 needs) on the opset-23 models ``rewrite export`` writes
(``RotaryEmbedding``, ``Attention``, 4-bit ``DequantizeLinear``). Older ones: 1.20 to 1.22
refuse opset 23; 1.23's ``Attention`` gives NaN for a query row whose keys are all masked (a
left-padded row's padding), which spreads to the row's other positions; 1.24's fails on
Doge's mask, differs from eager on RecurrentGemma (0.15), and leaves GPT-2's int4
``DequantizeLinear`` + ``MatMul`` unfused."""


def _opsets_beyond(message: str, model_path: Path) -> str | None:
    """Where onnxruntime refused the file for an opset newer than it reads (``Current
    official support for domain ai.onnx is till opset 21``: onnxruntime before 1.23 on an
    opset-23 model), a sentence naming the release to install; else None."""
    import onnxruntime as ort

    found = re.search(r"support for domain (\S+) is till opset (\d+)", message)
    if found is None:
        return None
    domain, newest = found.group(1), found.group(2)
    wanted = _model_opset(model_path, "" if domain == "ai.onnx" else domain)
    return (f"onnxruntime {ort.__version__} reads {domain} opsets up to {newest}, this model "
            f"is opset {wanted} (pip install 'onnxruntime>={MIN_ONNXRUNTIME}' to check and "
            "run it)")


def _model_opset(model_path: Path, domain: str) -> str:
    """The file's opset of ``domain`` (``""``: ai.onnx), read without its weights."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    versions = [o.version for o in model.opset_import if o.domain == domain]
    return str(versions[0]) if versions else "unknown"


def _nbits_in_float32(model_path: Path) -> bytes:
    """The file's graph (its weights left in its data file) with each ``com.microsoft``
    ``MatMulNBits`` computing in float32 (accuracy level 0) where it asks for int8
    activations (:data:`rewrite.backends.onnx.quantize.ACCURACY_LEVEL`, as the builder's
    and as onnxruntime fuses the standard ops in a user's session): what the check
    compares with eager at float32's tolerance, as it fuses the standard ops at 0."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    for nodes in (proto.graph.node, *(f.node for f in proto.functions)):
        for node in nodes:
            if node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
                continue
            for attribute in node.attribute:
                if attribute.name == "accuracy_level":
                    attribute.i = 0
    return proto.SerializeToString()


def tolerances(dtype: "torch.dtype") -> tuple[float, float]:
    """(atol, rtol) for a model computing in ``dtype``: float32 tight, half types loose."""
    import torch

    if dtype in (torch.float16, torch.bfloat16):
        return 5e-2, 5e-2
    return 1e-4, 1e-3


def as_numpy(tensor: "torch.Tensor") -> np.ndarray:
    """A detached CPU copy (bfloat16, which numpy lacks, as float32: compared as numbers)."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.to(torch.float32).numpy()
    return tensor.numpy().copy()


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    line = text[0] if text else type(error).__name__
    return line if len(line) <= 200 else line[:197] + "..."
