"""Where distribution lives: the one object the training loop asks about ranks.

LocalContext is a world of one process. HorovodContext wraps an initialised
`horovod.tensorflow` module; its numbered `# Horovod:` lines continue the ones
in lm_ptb_distributed.py. The fault layer (faults/) is not here: it attaches
to the loop as a callback.
"""
import os
import threading

import numpy as np
import tensorflow as tf

from core.errors import Rank0Failed
from runtime.horovod_env import BETWEEN_HOSTS_TCP, HOROVOD_TUNING, TWO_HOSTS_ALLREDUCE, USERS_ALLREDUCE
from runtime.reduction import sum_gathered


class LocalContext:
    """A world of one process: every collective is the identity."""
    distributed = False
    elastic = False
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    is_rank0 = True
    sparse_as_dense = False
    compressed = False
    allreduce_mode = "ring"

    def reduce_gradients(self, grads):
        """Each of `grads` summed over the ranks (runtime/reduction.py's order)."""
        return grads

    def sum_over_ranks(self, values, name=None):
        """A small float tensor summed over the ranks in rank order, the same bits on every rank."""
        del name
        return values

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

    def run_on_rank0(self, compute, waiting=None, shared_errors=()):
        """Runs compute() on rank 0 alone and returns its (picklable) result on every
        rank; the others call `waiting()` now and then meanwhile. An exception of
        `shared_errors` that compute() raises is raised on every rank."""
        del waiting, shared_errors
        return compute()

    def peer_failed(self, err):
        """Whether `err` is a collective that ended because another rank failed."""
        del err
        return False

    def versions(self):
        return {"horovod": None, "mpi": None}


class HorovodContext(LocalContext):
    distributed = True

    def __init__(self, hvd, fp16_allreduce=False, sparse_as_dense=False, allreduce="ring", hang_timeout=0.0):
        self.hvd = hvd
        self.renumber()
        self.compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
        self.compressed = fp16_allreduce
        self.sparse_as_dense = sparse_as_dense
        self.allreduce_mode = allreduce
        # Under horovodrun's elastic mode the world re-forms when hosts come
        # and go (faults/elastic.py): rank and size change with it.
        self.elastic = elastic_job()
        # How often rank 0 tells the others it still works alone (run_on_rank0).
        self.rendezvous_s = rendezvous_seconds(hang_timeout)
        # The last step's seconds from its last local gradient to its last summed
        # one: the wait that runtime/communication.py reports. Made with the first
        # step, once TensorFlow's threads are set.
        self.gradient_wait = None

    def renumber(self):
        """Reads rank and size from Horovod: at the start, and after each elastic reset."""
        hvd = self.hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.is_rank0 = self.rank == 0

    def reduce_gradients(self, grads):
        # Horovod: 3. Sum each gradient over all ranks before it is applied
        # (the trainer scales by 1/batch once, after every sum). Each is its
        # own collective, which starts as soon as the backward pass has made it.
        # The embedding's rows are gathered in rank order; dense gradients go
        # by Horovod's ring allreduce, or, with --allreduce ordered, are
        # gathered and added in rank order (runtime/reduction.py).
        if self.gradient_wait is None:
            with tf.init_scope():
                self.gradient_wait = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="gradient_wait")
        with tf.control_dependencies(tf.nest.flatten(grads, expand_composites=True)):
            ready = tf.timestamp()
        reduced = []
        for i, grad in enumerate(grads):
            if isinstance(grad, tf.IndexedSlices) and self.sparse_as_dense:
                grad = tf.convert_to_tensor(grad)
            if isinstance(grad, tf.IndexedSlices):
                gather = self.hvd.allgather
                reduced.append(tf.IndexedSlices(gather(grad.values, name=f"allgather_gradient_{i}_values"),
                                                gather(grad.indices, name=f"allgather_gradient_{i}_indices"),
                                                grad.dense_shape))
            elif self.allreduce_mode == "ordered":
                reduced.append(sum_gathered(self.hvd.allgather(grad, name=f"allgather_gradient_{i}"), self.size))
            else:
                reduced.append(self.hvd.allreduce(grad, op=self.hvd.Sum, compression=self.compression,
                                                  name=f"allreduce_gradient_{i}"))
        with tf.control_dependencies(tf.nest.flatten(reduced, expand_composites=True)):
            self.gradient_wait.assign(tf.timestamp() - ready)
        return reduced

    def sum_over_ranks(self, values, name=None):
        # An allgather, then the sum in rank order: the same at any world size.
        return sum_gathered(self.hvd.allgather(values[None], name=name), self.size)[0]

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

    def run_on_rank0(self, compute, waiting=None, shared_errors=()):
        # While rank 0 works alone, a thread on it sends a tiny "still working"
        # broadcast every rendezvous_s and the other ranks wait in those, so no
        # collective sits unanswered long enough to stall-warn, however long
        # the work (tracing included) blocks the main thread.
        # Status: 0 = working, 1 = done (the result follows), 2 = failed
        # (the error follows).
        def send(status):
            message = tf.constant(status, dtype=tf.float64)
            return float(self.hvd.broadcast(message, root_rank=0, name="rank0_rendezvous"))

        if not self.is_rank0:
            while True:
                status = send(0.0)
                if waiting:
                    waiting()
                if status == 1.0:
                    return self.broadcast_object(None, name="rank0_result")
                if status == 2.0:
                    shared = self.broadcast_object(None, name="rank0_error")
                    if shared is not None:
                        raise shared
                    raise Rank0Failed("stopping because rank 0 failed while working alone; its error is above")
        done = threading.Event()

        def heartbeat():
            while not done.wait(self.rendezvous_s):
                send(0.0)

        thread = threading.Thread(target=heartbeat, daemon=True)
        thread.start()
        try:
            result = compute()
        except BaseException as err:
            done.set()
            thread.join()
            send(2.0)
            self.broadcast_object(err if isinstance(err, shared_errors) else None, name="rank0_error")
            raise
        done.set()
        thread.join()
        send(1.0)
        return self.broadcast_object(result, name="rank0_result")

    def peer_failed(self, err):
        # Horovod's words when one rank's failure (or Gloo's timeout) shut it down under this one.
        return "Horovod has been shut down" in str(err)

    def versions(self):
        mpi = None
        if self.hvd.mpi_built() and self.hvd.mpi_enabled():
            mpi = _open_mpi_version()
        return {"horovod": self.hvd.__version__ if hasattr(self.hvd, "__version__") else _horovod_version(),
                "mpi": mpi}


def rendezvous_seconds(hang_timeout=0.0):
    """While rank 0 works alone, the other ranks wait in a chain of tiny
    broadcasts, a few per HOROVOD_STALL_CHECK_TIME_SECONDS (default 60 s) and
    per --hang_timeout, instead of one collective that would sit unanswered
    long enough to warn, or to look like a hang to the watchdog.
    """
    stall = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", 60))
    return min(5.0, stall / 4, *([hang_timeout / 4] if hang_timeout else []))


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


def elastic_job():
    """Whether horovodrun started this process in elastic mode (it sets HOROVOD_ELASTIC=1)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"


def set_horovod_tuning():
    """Sets HOROVOD_TUNING's values where the environment leaves them unset; for ranks that
    mpirun put on more than one host, BETWEEN_HOSTS_TCP's where the environment leaves them
    unset, and for one rank on each of two hosts TWO_HOSTS_ALLREDUCE where the user chose no
    allreduce; must run before hvd.init().

    Not in an elastic run: with both set, Horovod 0.28.1's background thread
    may segfault in its parameter manager when the world re-forms.
    """
    if elastic_job():
        return
    for key, value in HOROVOD_TUNING.items():
        os.environ.setdefault(key, value)
    world, local = (int(os.environ.get(name, 1)) for name in LAUNCHER_SIZES[0])
    if world > local:
        for key, value in BETWEEN_HOSTS_TCP.items():
            os.environ.setdefault(key, value)
    if (world, local) == (2, 1) and not any(name in os.environ for name in USERS_ALLREDUCE):
        os.environ.update(TWO_HOSTS_ALLREDUCE)


# What launchers tell each rank, before MPI starts, of the world and of the
# ranks on its host: Open MPI's mpirun (horovodrun and the Slurm script run
# it), horovodrun's Gloo, MPICH's and Intel MPI's Hydra.
LAUNCHER_SIZES = (("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"), ("HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
                  ("PMI_SIZE", "MPI_LOCALNRANKS"))


def launcher_sizes():
    """(ranks in the world, ranks on this host) as the launcher's environment says them before
    hvd.init(); (1, 1) with no launcher; None when a launcher gives its world size only."""
    for world, local in LAUNCHER_SIZES:
        if world in os.environ:
            if local not in os.environ:
                return None
            return int(os.environ[world]), int(os.environ[local])
    return 1, 1


def available_cores():
    """The cores this process may run on (its affinity, where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def configure_cpu_threads(local_size, row_groups=1):
    """Splits the host's cores between the ranks on it; returns (intra, inter).

    With row_groups > 1 (--row_groups) a rank's cores go to its row groups,
    which run side by side as independent ops: each op gets its group's share
    of the cores, and there are as many inter-op threads as groups.
    TF_INTRA_OP_PARALLELISM_THREADS and TF_INTER_OP_PARALLELISM_THREADS
    override the split, as in DeePMD-kit. Must run before TensorFlow starts.
    """
    per_rank = max(1, available_cores() // max(1, local_size))
    groups = max(1, row_groups)  # runtime/job.py refuses fewer than 1, once the run's log is set up
    default_inter = max(2, groups) if local_size == 1 else groups
    intra = int(os.environ.get("TF_INTRA_OP_PARALLELISM_THREADS", max(1, per_rank // groups)))
    inter = int(os.environ.get("TF_INTER_OP_PARALLELISM_THREADS", default_inter))
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
