"""Run models in onnxruntime in a child process, so that a crash of onnxruntime on a broken
model (it aborts on some) ends that run, not the fuzzer."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

CRASHED = "crashed"


def _serve(connection) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    while True:
        request = connection.recv()
        if request is None:
            return
        path, feeds = request
        try:
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            names = {i.name for i in session.get_inputs()}
            connection.send(session.run(None, {k: v for k, v in feeds.items() if k in names}))
        except Exception:  # noqa: BLE001 - the model does not load or run
            connection.send(None)


class OrtWorker:
    """``run(path, feeds)``: the outputs, None if the model does not run, or ``CRASHED``."""

    def __init__(self) -> None:
        self._process = None
        self._connection = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()

    def run(self, path: Path, feeds: dict):
        if self._process is None or not self._process.is_alive():
            self._start()
        try:
            self._connection.send((str(path), feeds))
            return self._connection.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._process.join(5)
            self._process = None
            return CRASHED

    def close(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._connection.send(None)
            self._process.join(5)
        self._process = None
