"""The command's error paths in real processes, as a user runs them.

In-process captures (``run_cli``) cannot see what torch's logging writes: its handler holds
the real stderr. Here each case is a ``python -m rewrite`` process (one runs the installed
``rewrite`` script): a documented exit code, a short reason on stderr, no traceback from
anyone, no output file (nor a temporary one) left behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bad_input import GPT2_RULES, ROOT, make_bad_model, with_program

RULES_WITH_ERROR = "group class *Block as {Path\n"


def rewrite_cmd() -> list[str]:
    return [sys.executable, "-m", "rewrite"]


def run(*argv, cwd: Path = ROOT, script: bool = False) -> subprocess.CompletedProcess:
    cmd = ([str(Path(sys.executable).with_name("rewrite"))] if script else rewrite_cmd())
    return subprocess.run([*cmd, *map(str, argv)], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def assert_clean_refusal(proc: subprocess.CompletedProcess, code: int, start: str) -> None:
    """Exit ``code``; stderr: one line (or ``file:line`` diagnostics) starting with
    ``start``, no traceback; nothing on stdout."""
    assert proc.returncode == code, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "", proc.stdout
    assert proc.stderr.startswith(start), proc.stderr


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_bad_rules(tmp_path, gpt2_pt2):
    rules = tmp_path / "bad.rules"
    rules.write_text(RULES_WITH_ERROR)
    proc = run("apply", rules, gpt2_pt2, "-o", tmp_path / "out.onnx")
    assert_clean_refusal(proc, 1, f"{rules}:1:")
    assert files(tmp_path) == ["bad.rules"]


@pytest.mark.parametrize("name", [  # a process each: make test runs two of them
    *(pytest.param(n, marks=pytest.mark.slow)
      for n in ("truncated.pt2", "foreign.pt2", "saved.pt2")),
    "corrupt.pt2", "junk.onnx"])
def test_bad_model(tmp_path, gpt2_pt2, name):
    """torch.export.load logs tracebacks of what it could not read: none reaches stderr."""
    model = make_bad_model(name, tmp_path, gpt2_pt2)
    before = files(tmp_path)
    proc = run("apply", GPT2_RULES, model, "-o", tmp_path / "out.onnx", script=name == "saved.pt2")
    assert_clean_refusal(proc, 2, f"{model}: ")
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert files(tmp_path) == before


def _unknown_symbol(text: str) -> str:
    """A range constraint on a symbol no shape uses: torch warns (its logger) and loads."""
    new = text.replace('"range_constraints": {}',
                       '"range_constraints": {"s99": {"min_val": 2, "max_val": 9}}', 1)
    assert new != text
    return new


@pytest.mark.slow  # processes
def test_what_torch_logs_while_loading_never_reaches_stderr(tmp_path, gpt2_pt2):
    """torch logs a warning reading this program ("Symbol s99 did not appear in the graph
    that was deserialized"); the model loads, and stderr holds rewrite's lines only (a
    note that the rewritten archive's weights are not aligned for mapping)."""
    model = with_program(gpt2_pt2, tmp_path / "complained.pt2", _unknown_symbol)
    proc = run("explain", GPT2_RULES, model)
    assert proc.returncode == 0, proc.stderr
    assert "GPT2Block" in proc.stdout
    lines = proc.stderr.splitlines()
    assert all(line.startswith(f"warning: {model}: ") for line in lines), proc.stderr


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in (root ignores permission bits: /sys)."""
    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir()
        folder.chmod(0o500)
        return folder
    folder = Path("/sys")
    try:
        (folder / "rewrite-probe").touch()
    except OSError:
        return folder
    pytest.fail("no unwritable folder on this machine: /sys accepts files")


@pytest.mark.slow
def test_unwritable_folder(tmp_path, gpt2_pt2):
    folder = unwritable_folder(tmp_path)
    out = folder / "out.onnx"
    try:
        proc = run("apply", GPT2_RULES, gpt2_pt2, "-o", out)
    finally:
        if folder.parent == tmp_path:
            folder.chmod(0o700)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    # the system's reason: "Permission denied" (a folder without write permission) or
    # "Operation not permitted" (/sys, as root)
    assert proc.stderr.splitlines()[-1] in (f"{out}: cannot write (Permission denied)",
                                            f"{out}: cannot write (Operation not permitted)")
    assert not out.exists()


@pytest.mark.slow
def test_ctrl_c_during_apply_exits_130_and_writes_nothing(tmp_path, gpt2_pt2):
    """SIGINT after the model is read and grouped (``-v`` prints that step's time), while
    lowering."""
    out = tmp_path / "out" / "gpt2.onnx"
    out.parent.mkdir()
    # as a shell runs it in the foreground: SIGINT not ignored (a background job's children,
    # e.g. a test suite started with &, inherit an ignored SIGINT and Python keeps it so)
    proc = subprocess.Popen([*rewrite_cmd(), "-v", "apply", str(GPT2_RULES), str(gpt2_pt2),
                             "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = proc.stderr.readline()  # "reading gpt2.pt2 and grouping it: 0.4s"
    proc.send_signal(signal.SIGINT)
    stdout, rest = proc.communicate(timeout=120)
    stderr = first + rest
    assert first.startswith(f"reading {gpt2_pt2} and grouping it: "), stderr
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.splitlines()[-1] == "interrupted", stderr
    assert files(out.parent) == []


@pytest.mark.slow
def test_broken_pipe_closed_before_the_first_line(gpt2_pt2):
    """The reader is gone before anything is written: exit 141 (as killed by SIGPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([*rewrite_cmd(), "explain", str(GPT2_RULES), str(gpt2_pt2)],
                              stdout=write, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("head") is None, reason="needs head(1)")
def test_broken_pipe_in_a_shell_pipeline(gpt2_pt2):
    """``rewrite explain ... | head -1``: the first line, and nothing on stderr."""
    command = " ".join([*map(_quote, rewrite_cmd()), "explain", _quote(GPT2_RULES),
                        _quote(gpt2_pt2), "| head -1"])
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0
    assert len(proc.stdout.splitlines()) == 1 and proc.stdout.strip(), proc.stdout
    assert proc.stderr == ""


def _quote(part) -> str:
    import shlex

    return shlex.quote(str(part))


@pytest.mark.parametrize(("body", "reason"), [
    ("raise RuntimeError('boom')", "importing it failed: RuntimeError: boom"),
    pytest.param("raise SystemExit('bye')", "importing it failed: SystemExit: bye",
                 marks=pytest.mark.slow),  # a process each
])
def test_import_of_a_module_that_raises(tmp_path, gpt2_pt2, body, reason):
    (tmp_path / "custom_ops.py").write_text(body + "\n")
    proc = run("explain", "--import", "custom_ops", GPT2_RULES, gpt2_pt2, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines() == [f"--import custom_ops: {reason}"]


INTERRUPTED_IMPORT = """
import sys

class CtrlC:  # Ctrl-C arriving while torch imports (a second or more on a cold start)
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["rewrite", "explain", sys.argv[1], sys.argv[2]]
from rewrite.cli.process import run
run()
"""


def test_ctrl_c_while_torch_imports_exits_130_without_a_traceback(gpt2_pt2):
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, str(GPT2_RULES),
                           str(gpt2_pt2)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "interrupted\n"
    assert proc.stdout == ""
