"""FaultLayer: the watchdog and elastic mode, attached to the loop as a callback."""
import logging

from faults.watchdog import Watchdog
from core.callbacks import StepCallback
from core.errors import CheckpointError

log = logging.getLogger("lm_ptb")


class FaultLayer(StepCallback):
    """The watchdog of one rank of a Horovod run, told every phase the loop enters,
    and in an elastic run the commits and the attempts (faults/elastic.py).

    It goes first among the callbacks: the others' phase events (a test's
    fault point, say) then come after the watchdog has announced the phase.
    A training step it announces last, from before_step_collectives, after
    every callback's before_step.
    """

    def __init__(self, ctx, hang_timeout, commit_every):
        self.ctx = ctx
        self.timeout = hang_timeout
        self.commit_every = commit_every
        self.watchdog = None
        self.state = None        # elastic: the committed TrainingState
        self.first_step = True   # the next step may trace its function
        self.evaluated = False   # the first evaluation traces its step

    # --- around the run (runtime/job.py) ---------------------------------

    def start(self):
        """Starts the watchdog; before the run's first collective, so that a rank
        that never joins it (or a launcher that dies meanwhile) is caught too."""
        ctx = self.ctx
        # A fixed world of one has no peer to wait for, and may well outlive
        # its parent shell on purpose (nohup). An elastic world of one may
        # grow, and its launcher is horovodrun, which it must not outlive.
        if not self.timeout or (ctx.size == 1 and not ctx.elastic):
            return
        self.watchdog = Watchdog(ctx.rank, self.timeout, elastic=ctx.elastic)
        self.watchdog.start()
        if not ctx.elastic:  # an elastic run exchanges in each attempt, with the ranks of that world
            self._exchange()

    def stop(self):
        if self.watchdog:
            self.watchdog.stop()

    def report(self):
        """What the watchdog saw go wrong, or None."""
        return self.watchdog.report() if self.watchdog else None

    def _exchange(self):
        self.watchdog.exchange(self.ctx.allgather_object(self.watchdog.card(), name="watchdog_cards"))

    def _enter(self, phase, where="", slow=False):
        if self.watchdog:
            self.watchdog.enter(phase, where, slow)

    # --- the loop's phase events ------------------------------------------

    def begin(self, rank, size, epoch, step):
        self.first_step = True
        if self.state is not None:
            log.info("elastic: %d ranks from epoch %d step %d; a commit every %d steps",
                     size, epoch + 1, step, self.commit_every)

    def before_step_collectives(self, epoch, step):
        # Last before the step's collectives: a rank stuck in anything before
        # them (its other callbacks included) falls behind the others it keeps waiting.
        self._enter("training step", f"epoch {epoch + 1}, step {step + 1}", slow=self.first_step)
        self.first_step = False

    def before_evaluation(self, split, epoch):
        self._enter("evaluation", f"valid, epoch {epoch + 1}" if split == "valid" else split,
                    slow=not self.evaluated)
        self.evaluated = True
        self.first_step = True  # the next epoch's first step follows a pause

    def before_checkpoint(self, epoch, step):
        # `epoch` counts finished epochs: mid-epoch it is the current one, 0-based.
        self._enter("checkpoint", f"epoch {epoch + 1}, step {step}" if step else f"end of epoch {epoch}")

    def progress(self):
        if self.watchdog:
            self.watchdog.beat()

    def end(self):
        self._enter("finishing")

    def snapshot_due(self, epoch, step):
        return self.state is not None and step % self.commit_every == 0

    def after_snapshot(self, position):
        if self.state is not None:
            self.state.commit_position(position)

    # --- elastic mode -----------------------------------------------------

    def run_elastic(self, run, variables, load_start):
        """Returns run(position) of the attempt that ends the training, through
        every reset of the world. `variables` are this worker's, and
        load_start() its start: rank 0's is the one every worker takes."""
        # Here, not at the top: lm_ptb.py loads this module and runs without Horovod.
        from faults import elastic
        ctx = self.ctx
        try:
            start = load_start()
        except CheckpointError as err:
            start = err  # shared by the state's first sync, then raised on every worker
        self.state = elastic.TrainingState(ctx.hvd, variables, start)
        reason = []

        def attempt(state):
            if isinstance(state.position, CheckpointError):
                raise state.position
            if self.watchdog:
                self._exchange()
            return run(state.position)

        def leaving(why):
            reason[:] = [why]
            if self.watchdog:
                self.watchdog.reform()

        def joined():
            ctx.renumber()
            if self.watchdog:
                self.watchdog.rank = ctx.rank
            position = self.state.committed_position()
            # Logged once the world has re-formed: rank 0 may be another worker now.
            log.info("elastic: %s; the world re-formed and training goes back to the last commit, epoch %d step %d",
                     reason[0], position.epoch + 1, position.step)

        return elastic.run(ctx.hvd, attempt, self.state, leaving, joined)
