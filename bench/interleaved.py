"""Decode speed of several models measured in one process, their steps interleaved.

    flock /work/bench.lock nice .venv/bin/python -m bench.interleaved REFERENCE.npz STEPS \\
        FOLDER [FOLDER ...]

On a shared machine the load drifts between the fresh processes of ``bench.genai``; here the
folders' steps alternate in one process. Two biases of position are cancelled by the design:

* a model run right after another one runs slower (the other session's thread pool still
  spinning, its caches in the way): each timed step is rehearsed first (the same feeds run
  once untimed), so every timed run follows a run of its own model;
* the order of the folders (the session made second, the model run second in a round) still
  shifted a paired ratio by up to 16% (session 17): the measure runs once per rotation of the
  folders' order, each with new sessions, and the ratios of the rotations combine by their
  geometric mean, so each folder holds each position equally often.

Per rotation: an ``InferenceSession`` per folder (2 threads, as ``bench.genai``), the prompt of
``REFERENCE.npz`` (``bench.genai``'s eager reference) prefilled twice (the first a warm-up),
then ``STEPS`` decode steps in turn, the order within a round rotating at each step, fed the
reference's continuation (repeated as needed). Per model: the median step over all rotations,
its quartile and minimum, and the ratio to the first folder: over each window of as many
consecutive rounds as folders (each model in each place of a round once), its summed time over
the first folder's, the median over the windows, the geometric mean over the rotations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bench.genai import Feeder, _head, _session


def rotation(ref: dict[str, np.ndarray], steps: int, folders: list[Path]) -> np.ndarray:
    """Seconds per timed decode step, ``[folder, step]``, the folders in this order."""
    sessions = [(_session(folder), _head(folder)) for folder in folders]
    for _ in range(2):
        feeders = [Feeder(session, head) for session, head in sessions]
        for feeder in feeders:
            feeder.step(ref["prompt"])
    count = len(folders)
    times = np.zeros((count, steps))
    for step, token in enumerate(np.resize(ref["continuation"], steps)):
        for i in [(step + k) % count for k in range(count)]:
            feeders[i].step(np.array([token]), rehearse=True)
            times[i, step] = feeders[i].seconds
    return times


def paired(times: np.ndarray) -> np.ndarray:
    """Each folder's time over the first's: the median over windows of as many steps as
    folders, each window's times summed."""
    count, steps = times.shape
    windows = np.stack([times[:, s:s + count].sum(1) for s in range(steps - count + 1)], 1)
    return np.median(windows / windows[0], 1)


def measure(ref: dict[str, np.ndarray], steps: int, folders: list[Path]) -> list[str]:
    """One line per folder (module docstring)."""
    count = len(folders)
    times, ratios = [], []
    for shift in range(count):
        order = [(shift + k) % count for k in range(count)]
        found = rotation(ref, steps, [folders[i] for i in order])
        back = np.argsort(order)
        times.append(found[back])
        ratio = paired(found[back])
        ratios.append(ratio / ratio[0])
    ms = np.concatenate(times, 1) * 1e3
    ratio = np.exp(np.log(np.array(ratios)).mean(0))
    return [f"{folder.name:20s} decode median {np.median(m):8.2f} ms, p25 "
            f"{np.percentile(m, 25):8.2f}, min {m.min():8.2f}; ratio to the first {r:.4f} "
            f"(rotations: {', '.join(f'{x[i]:.4f}' for x in ratios)})"
            for i, (folder, m, r) in enumerate(zip(folders, ms, ratio))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.interleaved",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", type=Path,
                        help="bench.genai's eager reference (.npz: prompt, continuation)")
    parser.add_argument("steps", type=int, help="timed decode steps per rotation")
    parser.add_argument("folders", type=Path, nargs="+",
                        help="model folders (the first is the ratios' base)")
    args = parser.parse_args(argv)
    missing = [p for p in (args.reference, *args.folders) if not p.exists()]
    if missing:
        parser.error(f"not found: {', '.join(map(str, missing))}")
    if args.steps < len(args.folders):
        parser.error(f"steps ({args.steps}) must be at least the number of folders "
                     f"({len(args.folders)}): a ratio is taken over windows of that many steps")
    for line in measure(dict(np.load(args.reference)), args.steps, args.folders):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
