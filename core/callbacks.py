"""Step callbacks: your own code inside the training loop, on every rank.

    import lm_ptb
    from core.callbacks import StepCallback

    class PrintLoss(StepCallback):
        def after_step(self, epoch, step, loss):
            print(f"epoch {epoch} step {step}: loss {loss:.3f}")

    lm_ptb.main(["--config", "config_small"], callbacks=[PrintLoss()])

The main(argv, callbacks) of lm_ptb.py and of lm_ptb_distributed.py hands
them to the training loop, which calls them in the order given. Override the
methods you need; the others do nothing. Epochs and steps are 0-based, as in
a checkpoint's position.

An exception raised in a callback ends the run as an error in training does
(under a launcher, that rank fails and the job ends). To stop as a SIGTERM
does, with every rank leaving after the same step and a checkpoint to resume
from, raise the signal: signal.raise_signal(signal.SIGTERM).
"""


class StepCallback:
    def begin(self, rank, size, epoch, step):
        """Training starts on `rank` of a world of `size`, at `step` of `epoch`.

        An elastic run calls it again after every reset of the world, from
        its last commit: the steps from there on are taken again.
        """

    def before_step(self, epoch, step):
        """The step is about to start: its batch is read, its collectives are next."""

    def before_evaluation(self, split, epoch):
        """An evaluation of `split` ("valid" after each epoch, "test" at the end)
        starts; `epoch` is the one just trained, or the number of epochs for "test".
        Every rank calls it as it enters the evaluation, in either --eval_mode."""

    def after_step(self, epoch, step, loss):
        """The step is taken. `loss`, a finite float and the same on every rank, is
        its cross entropy summed over the num_steps time steps and averaged over
        the rows of the global batch: exp(loss / num_steps) is its perplexity."""

    # --- phase events: where the rank is, for code that watches the job ------

    def before_step_collectives(self, epoch, step):
        """Every callback's before_step has run: the step's collectives come next.
        A rank that hangs before this point (in a read, or in a callback) falls
        behind the others, which wait for it in those collectives."""

    def before_checkpoint(self, epoch, step):
        """A checkpoint of the position after `step` steps of `epoch` starts (step 0:
        the end of epoch `epoch`, counted from 1). Rank 0 writes; the others wait."""

    def progress(self):
        """This rank made progress inside a long phase: an evaluation batch is
        scored, or rank 0 said that it still works alone."""

    def end(self):
        """Training and the test evaluation are over; the ranks gather the results."""

    def snapshot_due(self, epoch, step):
        """Whether the loop should take a snapshot of its position after `step`
        steps of `epoch` (a collective: the answer must be the same on every rank)."""
        return False

    def after_snapshot(self, position):
        """`position` is the loop's snapshot of where training is, what a checkpoint
        records besides the weights: `epoch` and `step` (the end of an epoch is
        step 0 of the next), the global LSTM `state`, the epoch's summed loss
        `costs` and training seconds `elapsed` so far, the finished epochs'
        `metrics` and the `best_valid` perplexity. The loop never changes it
        afterwards, so a callback may keep it as it is. Taken at the steps some
        callback asked for, at every --checkpoint_every step, and at the end of
        each epoch after its checkpoint."""


class CallbackList:
    """Calls every callback's event in the order given."""

    def __init__(self, callbacks):
        self.callbacks = list(callbacks)

    def __getattr__(self, event):
        # Made once per event, on its first call: the loop calls several every step.
        methods = [getattr(callback, event) for callback in self.callbacks]

        def call(*args):
            for method in methods:
                method(*args)
        setattr(self, event, call)
        return call

    def snapshot_due(self, epoch, step):
        return any([callback.snapshot_due(epoch, step) for callback in self.callbacks])
