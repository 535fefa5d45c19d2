"""Where distribution lives: the one object the training loop asks about ranks.

LocalContext is a world of one process. HorovodContext wraps an initialised
`horovod.tensorflow` module; its numbered `# Horovod:` lines continue the ones
in lm_ptb_distributed.py.
"""
import logging
import os
import threading

import numpy as np
import tensorflow as tf

from runtime.watchdog import Watchdog

log = logging.getLogger("lm_ptb")


class ChiefFailed(RuntimeError):
    """Rank 0 failed while working alone (runtime/context.py run_on_chief); its own
    error is in its log, and the other ranks only follow it out."""


def heartbeat_seconds(hang_timeout=0.0):
    """While rank 0 evaluates alone, the other ranks wait in a chain of tiny
    broadcasts, a few per HOROVOD_STALL_CHECK_TIME_SECONDS (default 60 s) and
    per --hang_timeout, instead of one collective that would sit unanswered
    long enough to warn, or to look like a hang to the watchdog.
    """
    stall = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", 60))
    return min(5.0, stall / 4, *([hang_timeout / 4] if hang_timeout else []))


class LocalContext:
    distributed = False
    elastic = False
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    is_chief = True

    def wrap_tape(self, tape):
        return tape

    def broadcast_variables(self, variables):
        """Gives every rank rank 0's values of `variables`."""
        del variables

    def allreduce(self, tensor, op="mean", name=None):
        del op, name
        return tensor

    def allgather_rows(self, tensor, name=None):
        del name
        return tensor

    def broadcast_object(self, obj, name=None):
        del name
        return obj

    def allgather_object(self, obj, name=None):
        del name
        return [obj]

    def first_failure(self, failure):
        """failure is None or (exit_code, message) on this rank.

        Returns (rank, failure) of the lowest failing rank, or None, and the
        same on every rank, so that all of them stop alike.
        """
        return (0, failure) if failure is not None else None

    def run_on_chief(self, compute):
        """Runs compute() on rank 0 alone and hands its (picklable) result to every rank."""
        return compute()

    def train(self, run, variables, start):
        """Returns run(start): the training loop from its start position.

        `variables` (the model's and the optimizer's) and `start` are rank
        0's; a distributed context shares them first.
        """
        del variables
        return run(start)

    def versions(self):
        return {"horovod": None, "mpi": None}

    # One process cannot hang on a peer: the watchdog calls do nothing.
    def start_watchdog(self, timeout_s):
        del timeout_s

    def stop_watchdog(self):
        pass

    def watch(self, phase, where="", slow=False):
        """Tells the watchdog what this rank does now; entering a phase is progress."""
        del phase, where, slow

    def beat(self):
        """Tells the watchdog that this rank made progress inside a long phase."""

    def hang_report(self):
        """What the watchdog saw went wrong, or None."""
        return None


class HorovodContext(LocalContext):
    distributed = True

    def __init__(self, hvd, fp16_allreduce=False, sparse_as_dense=False):
        self.hvd = hvd
        self._renumber()
        self.compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        self.sparse_as_dense = sparse_as_dense
        self.watchdog = None
        # Under horovodrun's elastic mode the world re-forms when hosts come
        # and go: the rank and size above change, and no collective may run
        # outside train(), where the ranks of each new world meet.
        self.elastic = os.environ.get("HOROVOD_ELASTIC") == "1"
        self._reset_reason = ""

    def _renumber(self):
        """Reads rank and size from Horovod: at the start, and after each elastic reset."""
        hvd = self.hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.is_chief = self.rank == 0

    def wrap_tape(self, tape):
        # Horovod: 3. Average the gradients over all ranks before they are
        # applied: the "distributed optimizer" for a GradientTape.
        return self.hvd.DistributedGradientTape(
            tape, compression=self.compression, sparse_as_dense=self.sparse_as_dense)

    def train(self, run, variables, start):
        if self.elastic:
            return self._train_elastic(run, variables, start)
        # Horovod: 4. Start every rank from rank 0's weights, optimizer slots
        # and position (those of the checkpoint that rank 0 restored, say).
        start = self.broadcast_object(start, name="start_position")
        self.broadcast_variables(variables)
        return run(start)

    def _train_elastic(self, run, variables, start):
        # Horovod: 4. The elastic state's sync() shares rank 0's variables and
        # position at the start and after every reset (runtime/elastic.py).
        from runtime import elastic  # imports Horovod
        state = elastic.TrainingState(self.hvd, variables, start)

        def attempt(state):
            if self.watchdog:
                self.watchdog.exchange(self.allgather_object(self.watchdog.card(), name="watchdog_cards"))
            return run(state.position, commit=state.commit_position)

        def leaving(why):
            self._reset_reason = why
            if self.watchdog:
                self.watchdog.reform()

        def joined():
            self._renumber()
            if self.watchdog:
                self.watchdog.rank = self.rank
            position = state.committed_position()
            # Logged once the world has re-formed: rank 0 may be another worker now.
            log.info("elastic: %s; the world re-formed and training goes back to the last commit, epoch %d step %d",
                     self._reset_reason, position["epoch"] + 1, position["step"])

        return elastic.run(self.hvd, attempt, state, leaving, joined)

    def broadcast_variables(self, variables):
        self.hvd.broadcast_variables(variables, root_rank=0)

    def allreduce(self, tensor, op="mean", name=None):
        ops = {"mean": self.hvd.Average, "sum": self.hvd.Sum, "max": self.hvd.Max}
        return self.hvd.allreduce(tensor, op=ops[op], name=name)

    def allgather_rows(self, tensor, name=None):
        return self.hvd.allgather(tensor, name=name)

    def broadcast_object(self, obj, name=None):
        return self.hvd.broadcast_object(obj, root_rank=0, name=name)

    def allgather_object(self, obj, name=None):
        return self.hvd.allgather_object(obj, name=name)

    def first_failure(self, failure):
        if self.elastic:  # each worker decides alone; one that fails is replaced or ends the job
            return (self.rank, failure) if failure is not None else None
        failures = self.allgather_object(failure, name="first_failure")
        return next(((rank, f) for rank, f in enumerate(failures) if f is not None), None)

    def run_on_chief(self, compute):
        # While rank 0 works alone, a thread on it sends a tiny "still working"
        # broadcast every heartbeat_seconds() and the other ranks wait in
        # those, so no collective sits unanswered long enough to stall-warn,
        # however long the work (tracing included) blocks the main thread.
        # Status: 0 = working, 1 = done (the result follows), 2 = failed.
        def send(status):
            message = tf.constant(status, dtype=tf.float64)
            return float(self.hvd.broadcast(message, root_rank=0, name="chief_rendezvous"))

        if not self.is_chief:
            while True:
                status = send(0.0)
                self.beat()
                if status == 1.0:
                    return self.broadcast_object(None, name="chief_result")
                if status == 2.0:
                    raise ChiefFailed("stopping because rank 0 failed while working alone; its error is above")
        done = threading.Event()

        def heartbeat():
            while not done.wait(heartbeat_seconds(self.watchdog.timeout if self.watchdog else 0)):
                send(0.0)

        thread = threading.Thread(target=heartbeat, daemon=True)
        thread.start()
        try:
            result = compute()
        except BaseException:
            done.set()
            thread.join()
            send(2.0)
            raise
        done.set()
        thread.join()
        send(1.0)
        return self.broadcast_object(result, name="chief_result")

    def start_watchdog(self, timeout_s):
        # A fixed world of one has no peer to wait for, and may well outlive
        # its parent shell on purpose (nohup). An elastic world of one may
        # grow, and its launcher is horovodrun, which it must not outlive.
        if not timeout_s or (self.size == 1 and not self.elastic):
            return
        self.watchdog = Watchdog(self.rank, timeout_s, elastic=self.elastic)
        # Started before the exchange, so that a rank that never joins it
        # (or a launcher that dies meanwhile) is caught too. An elastic run
        # exchanges in each attempt, with the ranks of that world.
        self.watchdog.start()
        if not self.elastic:
            self.watchdog.exchange(self.allgather_object(self.watchdog.card(), name="watchdog_cards"))

    def stop_watchdog(self):
        if self.watchdog:
            self.watchdog.stop()

    def watch(self, phase, where="", slow=False):
        if self.watchdog:
            self.watchdog.enter(phase, where, slow)

    def beat(self):
        if self.watchdog:
            self.watchdog.beat()

    def hang_report(self):
        return self.watchdog.report() if self.watchdog else None

    def versions(self):
        mpi = None
        if self.hvd.mpi_built() and self.hvd.mpi_enabled():
            mpi = _open_mpi_version()
        return {"horovod": self.hvd.__version__ if hasattr(self.hvd, "__version__") else _horovod_version(),
                "mpi": mpi}


def _horovod_version():
    import horovod
    return horovod.__version__


def _open_mpi_version():
    import subprocess
    try:
        out = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    first = out.strip().splitlines()[0] if out.strip() else "unknown"
    return first


# Tensor fusion copies gradients into one buffer to send fewer, larger messages;
# with this model's 7 dense gradients the copy and the wait for a fusion cycle
# cost more than they save. Horovod's background thread sleeps a cycle between
# negotiations, and a gradient that becomes ready waits for the next one, so a
# short cycle starts each allreduce sooner. BENCHMARKS.md's lever table has both.
HOROVOD_DEFAULTS = {"HOROVOD_FUSION_THRESHOLD": "0", "HOROVOD_CYCLE_TIME": "0.2"}


def apply_horovod_defaults():
    """Sets HOROVOD_DEFAULTS where the environment does not; must run before hvd.init().

    Not in an elastic run: with both set, Horovod 0.28.1's background thread
    segfaults in its parameter manager when the world re-forms (in 4 resets
    of 5 on the namespace hosts, and in none of 6 without them).
    """
    if os.environ.get("HOROVOD_ELASTIC") == "1":
        return
    for key, value in HOROVOD_DEFAULTS.items():
        os.environ.setdefault(key, value)


def configure_cpu_threads(local_size):
    """Splits the host's cores between the ranks on it; returns (intra, inter).

    TF_INTRA_OP_PARALLELISM_THREADS and TF_INTER_OP_PARALLELISM_THREADS
    override the split, as in DeePMD-kit. Must run before TensorFlow starts.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    intra = int(os.environ.get("TF_INTRA_OP_PARALLELISM_THREADS", max(1, cores // max(1, local_size))))
    inter = int(os.environ.get("TF_INTER_OP_PARALLELISM_THREADS", 1 if local_size > 1 else 2))
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    return intra, inter


def pin_gpu(local_rank):
    """Makes GPU number local_rank the only one this process sees; returns True if pinned."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return False
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
    return True


def weights_digest(variables):
    """A short hash of the variable values, to compare ranks without moving weights."""
    import hashlib
    digest = hashlib.sha256()
    for var in variables:
        digest.update(np.ascontiguousarray(var.numpy()).tobytes())
    return digest.hexdigest()[:16]
