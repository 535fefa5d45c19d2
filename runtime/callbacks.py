"""Step callbacks: your own code inside the training loop, on every rank.

    import lm_ptb
    from runtime.callbacks import StepCallback

    class PrintLoss(StepCallback):
        def after_step(self, epoch, step, loss):
            print(f"epoch {epoch} step {step}: loss {loss:.3f}")

    lm_ptb.main(["--config", "config_small"], callbacks=[PrintLoss()])

The main(argv, callbacks) of lm_ptb.py and of lm_ptb_distributed.py hands
them to runtime.trainer.train_and_evaluate, which calls them in the order
given. Override the methods you need; the others do nothing. Epochs and steps
are 0-based, as in a checkpoint's position.

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
