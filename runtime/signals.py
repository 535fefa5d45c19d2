"""StopSignals: SIGTERM, SIGINT or SIGUSR1 become a flag the ranks agree on at the next step."""
import signal


class StopSignals:
    """Turns SIGTERM, SIGINT or SIGUSR1 into a flag that the training step shares.

    Open MPI's mpirun hands SIGUSR1 on to the ranks at once, but SIGTERM and
    SIGINT only odls_base_sigkill_timeout seconds late, and SIGKILLs as long after.
    """

    def __init__(self):
        self.received = 0
        self._previous = {}

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (e.g. inside some test runners)
                pass
        return self

    def _handle(self, signum, frame):
        del frame
        self.received = self.received or signum

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
