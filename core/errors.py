"""The errors a user can fix, and the exit status each ends a command with.

Each message is one line naming the problem and its fix. No TensorFlow here:
the command line maps these before it loads.
"""
USAGE_EXIT, ERROR_EXIT = 2, 1


class UsageError(ValueError):
    """A bad command-line value other than the config (paths, flags)."""


class ConfigError(ValueError):
    """A config that cannot be used."""


class PTBDataError(Exception):
    """A data problem: a missing or malformed split, a failed download."""


class CheckpointError(RuntimeError):
    """No usable checkpoint; the message says what to pass instead."""


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, say); the message names the step."""


class TrainingInterrupted(RuntimeError):
    """A SIGTERM or SIGINT reached some rank; a checkpoint was saved."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


class Rank0Failed(RuntimeError):
    """Rank 0 failed while working alone (run_on_rank0); its own error is in
    its log, and the other ranks only follow it out."""


EXIT_CODES = (
    ((ConfigError, UsageError), USAGE_EXIT),
    ((PTBDataError, CheckpointError, TrainingError, ValueError, OSError), ERROR_EXIT),
)


def exit_code(err):
    """The exit status for a user-fixable error, or None for anything else (a bug)."""
    for types, code in EXIT_CODES:
        if isinstance(err, types):
            return code
    return None
