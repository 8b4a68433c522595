"""Run a command; its wall time and the peak memory of its process tree, sampled from /proc.

``RssAnon`` (heap, anonymous mappings: memory the process itself fills) and ``RssFile``
(file-backed pages mapped in: page cache, shared with everything else and given back under
pressure) are read from ``/proc/PID/status`` of the process and its descendants every
``interval`` seconds by a thread, summed over the tree per sample; the peaks are the largest
sums. A sample can miss a spike shorter than the interval; the kernel's own high-water mark
(``ru_maxrss`` from ``wait4``: anonymous + file + shared, of the largest single process) is
reported next to them. The wall time is from just before the process starts to its exit (the
main thread blocks in ``wait4``, so sampling does not delay it).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import attrs
import psutil

KB_PER_MB = 1024


@attrs.frozen
class Measure:
    """One run of one command."""

    seconds: float
    """Wall time of the whole process."""
    anon_mb: float
    """Peak RssAnon of the process tree, MB (2**20 bytes)."""
    file_mb: float
    """Peak RssFile of the process tree, MB."""
    maxrss_mb: float
    """The kernel's ru_maxrss of the process, MB (anonymous + file-backed + shared)."""
    returncode: int


def _status_kb(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile) of one process in kB; (0, 0) once it is gone or a zombie."""
    anon = file = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith(b"RssFile:"):
                    file = int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return anon, file


class _Sampler(threading.Thread):
    """Samples the tree under ``pid`` until ``stop`` is set; keeps the peaks in kB."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.stop = threading.Event()
        self.peak_anon = self.peak_file = 0

    def _tree(self) -> list[int]:
        try:
            return [self.pid] + [child.pid for child in
                                 psutil.Process(self.pid).children(recursive=True)]
        except psutil.Error:
            return [self.pid]

    def run(self) -> None:
        pids, tick = [self.pid], 0
        while not self.stop.is_set():
            if tick % 10 == 0:  # finding children scans /proc: not on every sample
                pids = self._tree()
            sums = [sum(values) for values in zip(*(_status_kb(pid) for pid in pids))]
            self.peak_anon = max(self.peak_anon, sums[0])
            self.peak_file = max(self.peak_file, sums[1])
            tick += 1
            self.stop.wait(self.interval)


def measure(cmd: list[str], *, stdout: Path | None = None, stderr: Path | None = None,
            cwd: Path | None = None, env: dict[str, str] | None = None,
            interval: float = 0.02) -> Measure:
    """Run ``cmd`` to its end (output to the given files, else /dev/null) and measure it."""
    with open(stdout or os.devnull, "wb") as out, open(stderr or os.devnull, "wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd,
                                env=env)
        sampler = _Sampler(proc.pid, interval)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop.set()
        sampler.join()
    return Measure(seconds=seconds, anon_mb=sampler.peak_anon / KB_PER_MB,
                   file_mb=sampler.peak_file / KB_PER_MB,
                   maxrss_mb=usage.ru_maxrss / KB_PER_MB, returncode=proc.returncode)
