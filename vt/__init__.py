"""vt: JAX-native post-training of small reasoning models (the VibeThinker recipe on Qwen2.5)."""

__version__ = "0.1.0"

# `vt train` stopped by SIGTERM after checkpointing (a preemption): 128 + SIGTERM, what a shell reports for a
# process SIGTERM killed (vt eval, the launchers' own traps), so `vt train ... && next` does not carry on.
EXIT_PREEMPTED = 143


class VtError(Exception):
    """A user-facing error: the CLI prints its message as one line and exits non-zero.

    Messages name the file, line or field at fault, e.g. ``config.json: field 'hidden_size' ...``.
    """

    exit_code = 2  # what the CLI exits with


class Preempted(VtError):
    """A run that SIGTERM stopped but that could not save on the way out (a full disk): still the preemption's
    exit status, with the one line saying what went wrong; its sealed checkpoints are intact."""

    exit_code = EXIT_PREEMPTED


class Terminated(BaseException):
    """SIGTERM while a run was already stopping (waiting for a save in flight, after an error): stop now. A
    BaseException so that no `except Exception` on the way out catches it; the CLI prints its message as one line
    and exits with EXIT_PREEMPTED at once, without waiting for the writers' threads (what was sealed is
    intact: every write is safe against a kill)."""
