"""The communication report of a multi-rank run: after its first epoch, one log line on each
rank (--mpi-log master, the default, shows rank 0's) with the share of its step spent waiting
for the gradients' collectives, and what the scaling model (scaling/advice.py) advises for the
link that the ranks' least wait implies.

The wait is timed inside the step (HorovodContext.reduce_gradients: from the last local
gradient to the last summed one), so it holds the communication the backward pass did not
hide and the time spent waiting for the slowest rank. The step is the time from one step's
end to the next; both are medians over the epoch's steps, the first (tracing) left out.
"""
import logging
import os
import statistics
import time

from core.callbacks import StepCallback
from scaling import advice
from scaling.model import Horovod, Machine, Shape

log = logging.getLogger("lm_ptb")
MIN_STEPS = 5  # fewer steps than this in the first epoch give no report


class CommunicationReport(StepCallback):
    def __init__(self, ctx, config, threads):
        self.ctx, self.threads = ctx, threads
        self.shape = Shape.from_config(config)
        self.reported = False
        self.steps, self.last = [], None

    def begin(self, rank, size, epoch, step):
        self.steps, self.last = [], None

    def after_step(self, epoch, step, loss):
        if self.reported:  # the line is written once: no reading of the wait after it
            return
        now = time.perf_counter()
        if self.last is not None and self.last[:2] == (epoch, step - 1):
            self.steps.append((now - self.last[2], float(self.ctx.gradient_wait.numpy())))
        self.last = (epoch, step, now)

    def before_evaluation(self, split, epoch):
        self.last = None
        if split != "valid" or self.reported:
            return
        self.reported = True
        mine = self.measured()
        # The rank that waited least waited for the collectives alone, the others for it as well:
        # its wait is the one the link is read from. An elastic world may hold a rank that joined
        # after the others reported, so there each rank reads its own.
        least = mine if self.ctx.elastic else min(
            (m for m in self.ctx.allgather_object(mine, name="communication_report") if m),
            key=lambda m: m[1], default=None)
        if mine:
            log.info("%s", self.line(mine, least))

    def measured(self):
        """(step, wait, compute sd) in seconds, medians over the steps; None with too few."""
        if len(self.steps) < MIN_STEPS:
            return None
        step_s, wait_s = statistics.median(s for s, _ in self.steps), statistics.median(w for _, w in self.steps)
        computes = [s - w for s, w in self.steps]
        middle = statistics.median(computes)
        # A robust spread: single slow steps (a checkpoint, a snapshot) would swell the sd.
        return step_s, wait_s, 1.4826 * statistics.median(abs(c - middle) for c in computes)

    def line(self, mine, least):
        step_s, wait_s, _ = mine
        share = advice.share(step_s, wait_s, least[1])
        ctx = self.ctx
        if ctx.allreduce_mode == "ordered":
            return share + "; the model does not cover --allreduce ordered"
        # Horovod's own defaults where the environment has none (an elastic run).
        horovod = Horovod(cycle_s=float(os.environ.get("HOROVOD_CYCLE_TIME", "1")) / 1e3,
                          fusion_bytes=int(os.environ.get("HOROVOD_FUSION_THRESHOLD", str(128 << 20))),
                          fp16_allreduce=ctx.compressed, sparse_as_dense=ctx.sparse_as_dense,
                          algorithm="ompi" if ctx.hvd.mpi_enabled() else "ring")
        machine = Machine(len(os.sched_getaffinity(0)), ctx.local_size, self.threads)
        # The slowest rank's compute: the step less its wait.
        found = advice.advise(self.shape, ctx.size, least[0] - least[1], least[2], least[1], machine, horovod)
        return f"{share}; {advice.line(found, ctx.size)}"
