"""Decode speed of several models measured in one process, their steps interleaved.

    flock /work/bench.lock nice .venv/bin/python -m bench.interleaved REFERENCE.npz STEPS \\
        FOLDER [FOLDER ...]

On a shared machine the load drifts between the fresh processes of ``bench.genai``; here each
folder's model gets an ``InferenceSession`` (2 threads, as ``bench.genai``), the prompt of
``REFERENCE.npz`` (``bench.genai``'s eager reference) is prefilled twice (the first a warm-up),
then ``STEPS`` decode steps are taken in turn, the order rotating at each step, fed the
reference's continuation (repeated as needed). Per model: the median step, its quartile and
minimum, and the median over the steps of its time over the first folder's time in the same
round (a paired ratio: a drift of the load hits every model alike).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from bench.genai import Feeder, _head, _session


def measure(ref: dict[str, np.ndarray], steps: int, folders: list[Path]) -> list[str]:
    """One line per folder (module docstring)."""
    sessions = [(_session(folder), _head(folder)) for folder in folders]
    prefill = [[] for _ in folders]
    for _ in range(2):
        feeders = [Feeder(session, head) for session, head in sessions]
        for i, feeder in enumerate(feeders):
            start = time.perf_counter()
            feeder.step(ref["prompt"])
            prefill[i].append(time.perf_counter() - start)
    tokens = np.resize(ref["continuation"], steps)
    times = [[] for _ in folders]
    for step, token in enumerate(tokens):
        order = list(range(len(folders)))
        for i in order[step % len(order):] + order[:step % len(order)]:
            start = time.perf_counter()
            feeders[i].step(np.array([token]))
            times[i].append(time.perf_counter() - start)
    first = np.array(times[0])
    lines = []
    for folder, found, warm in zip(folders, times, prefill):
        ms, ratio = np.array(found) * 1e3, np.median(np.array(found) / first)
        lines.append(f"{folder.name:20s} decode median {np.median(ms):8.2f} ms, p25 "
                     f"{np.percentile(ms, 25):8.2f}, min {ms.min():8.2f}; median ratio to the "
                     f"first {ratio:.4f}; prefill {warm[1] * 1e3:.0f} ms")
    return lines


def main(argv: list[str]) -> int:
    ref = dict(np.load(argv[0]))
    for line in measure(ref, int(argv[1]), [Path(p) for p in argv[2:]]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
