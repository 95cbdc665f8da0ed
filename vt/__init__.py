"""vt: JAX-native post-training of small reasoning models (the VibeThinker recipe on Qwen2.5)."""

__version__ = "0.1.0"

# `vt train` stopped by SIGTERM after checkpointing (a preemption): 128 + SIGTERM, what a shell reports for a
# process SIGTERM killed (vt eval, the launchers' own traps), so `vt train ... && next` does not carry on.
EXIT_PREEMPTED = 143


class VtError(Exception):
    """A user-facing error: the CLI prints its message as one line and exits non-zero.

    Messages name the file, line or field at fault, e.g. ``config.json: field 'hidden_size' ...``.
    """
