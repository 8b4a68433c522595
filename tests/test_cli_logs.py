"""The ``rewrite`` command's stderr while it runs (rewrite/cli/logs.py): the libraries'
chatter off, restored after."""

from __future__ import annotations

from rewrite.cli.logs import quiet_libraries


def test_transformers_kernel_advice_is_kept_off_stderr_while_a_command_runs(capfd):
    """transformers advises installing ``causal_conv1d`` or ``fla`` when a hybrid's eager
    model falls back to torch code; rewrite exports its own scans, never those kernels, so
    the command keeps the advice off its output; the caller's logging is restored after."""
    from transformers.integrations import hub_kernels

    with quiet_libraries():
        hub_kernels.logger.warning("`chunk_kda` is falling back to its reference PyTorch "
                                   "implementation")
    assert capfd.readouterr().err == ""
    hub_kernels.logger.warning("after the command")
    assert "after the command" in capfd.readouterr().err
