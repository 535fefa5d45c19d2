"""The one training loop: train_and_evaluate(config, data, ctx, options, callbacks).

lm_ptb.py and lm_ptb_distributed.py both call it; they differ only in `ctx`
(runtime/context.py), which is where every rank-dependent decision lives.
"""
import dataclasses
import functools
import json
import logging
import math
import os
import signal
import time

import tensorflow as tf

import ptb_reader
from runtime import logs, reduction, summary
from runtime.evaluation import evaluate, make_eval_step
from core.atomic_files import atomic_write
from core.callbacks import CallbackList
from runtime.checkpointing import TrainCheckpoint, global_lstm_state
from runtime.context import weights_digest
from core.errors import CheckpointError, TrainingError, TrainingInterrupted
from runtime.options import RunOptions
from runtime.plan import BatchPlan
from runtime.results import results_record, versions
from runtime.signals import StopSignals
from texar_lite import optimization
from texar_lite.dropout import RowDropout
from texar_lite.losses import sequence_sparse_softmax_cross_entropy
from texar_lite.model import LanguageModel

log = logging.getLogger("lm_ptb")


class _TensorBoard:
    """Rank 0's per-epoch scalars: perplexities, learning rate and speed."""

    def __init__(self, logdir):
        self.writer = tf.summary.create_file_writer(logdir)

    def write(self, record):
        with self.writer.as_default(step=record["epoch"]):
            for key in ("train_ppl", "valid_ppl", "lr", "wps"):
                tf.summary.scalar(key, record[key])
        self.writer.flush()


# The steps are traced with autograph off. Their Python has no branch or loop
# on a tensor, so the graph is the same, but autograph would rewrite every
# function they call, Horovod's collectives included, at a cost in CPU at
# each rank's first step (tests/test_op_selection.py checks that the graph is
# unchanged).
def make_train_step(model, optimizer, config, ctx, plan, seed, row_groups=1):
    """The step: forward, backward and update on this rank's rows. With row_groups > 1
    the rows run as that many independent groups (at most one per row), which the
    executor runs side by side; their sums meet in runtime/reduction.py's order."""
    variables = model.trainable_variables
    opt_hparams = config["opt"]
    rows = plan.rows_per_rank
    groups = reduction.row_slices(rows, row_groups)
    reduction.keep_order(ctx.size * len(groups))

    # inputs and targets are time-major token ids, [num_steps, rows]: the
    # reader's windows transposed as NumPy arrays, since an int32 transpose in
    # the graph makes TensorFlow's oneDNN layout pass log a false error.
    @tf.function(autograph=False)
    def train_step(inputs, targets, state, epoch, step, stop_flag):
        with tf.GradientTape(persistent=len(groups) > 1) as tape:
            losses, states = [], []
            for first, last in groups:
                # Masks keyed by the global row, so a group drops what the whole batch would.
                dropout = RowDropout(seed, epoch, step, ctx.rank * rows + first, plan.global_batch)
                logits, group_state = model(inputs[:, first:last], state[:, :, first:last], dropout)
                losses.append(sequence_sparse_softmax_cross_entropy(targets[:, first:last], logits, time_major=True,
                                                                    average_across_batch=False, ops=model.ops))
                states.append(group_state)
        # Each group's gradients on their own, added in the one order that N
        # ranks add them in, then over the ranks (Horovod: 3, in the context).
        grads = ctx.reduce_gradients(reduction.sum_over_groups([tape.gradient(loss, variables) for loss in losses]))
        # Texar's loss averages over the batch; the 1/batch joins the update.
        optimization.clip_and_apply(optimizer, grads, variables, opt_hparams, scale=1.0 / plan.global_batch)
        # The loss, and whether any rank wants to stop, summed over the ranks
        # alike on each, so all ranks log the same loss and decide alike.
        shared = ctx.sum_over_ranks(tf.stack([reduction.tree_sum(losses), stop_flag]), name="loss_and_stop")
        return shared[0] / plan.global_batch, tf.concat(states, 2), shared[1] > 0

    return train_step


def rows_of(global_state, rank, rows):
    """This rank's rows of the global [L, 2, B, H] LSTM state."""
    return tf.constant(global_state[:, :, rank * rows:(rank + 1) * rows])


def train_and_evaluate(config, data, ctx, options=None, callbacks=(), run_attempts=None):
    """Trains config on data (a ptb_reader.PTBData, checked by runtime.plan.check_plan)
    and returns the results dict.

    Rank 0 also writes output_dir/metrics.jsonl, results.json and checkpoints.
    `callbacks` (core/callbacks.py) run inside the loop, on every rank.
    `run_attempts(run, variables, load_start)`, when given, drives the loop
    instead of one plain run: faults/layer.py's elastic attempts do.
    """
    opts = options or RunOptions()
    # Different seeds per rank on purpose: only rank 0's start, shared below,
    # makes the ranks agree, and a test checks that it does.
    model = LanguageModel(config, data.vocab_size, seed=opts.seed + 7919 * ctx.rank, device=opts.device,
                          tf_ops=opts.tf_ops())
    summary.training_summary(ctx, *opts.cpu_threads, opts.device, versions(ctx), model.ops, opts.row_groups,
                             opts.row_groups_reason, opts.affine_reason)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    checkpoint = TrainCheckpoint(model, optimizer, opts.output_dir, ctx, config, keep=opts.keep_checkpoints,
                                 seed=opts.seed)
    loop = TrainingLoop(config, data, ctx, opts, model, optimizer, checkpoint, callbacks)
    variables = list(model.variables) + list(optimizer.variables)

    def load_start():
        return checkpoint.initial_position(opts.resume, loop.plan().global_batch)

    if run_attempts:
        results = run_attempts(loop.run, variables, load_start)
    else:
        # Horovod: 4. Start every rank from rank 0's weights, optimizer slots
        # and position (those of the checkpoint that rank 0 restored, say).
        start = ctx.run_on_rank0(load_start, waiting=loop.hooks.progress, shared_errors=(CheckpointError,))
        ctx.broadcast_variables(variables)
        results = loop.run(start)
    if ctx.is_rank0:
        atomic_write(os.path.join(opts.output_dir, "results.json"), (json.dumps(results, indent=2) + "\n").encode())
    return results


class TrainingLoop:
    """From a position (runtime.checkpointing.Position) to the results, in named steps.

    `run` is one attempt. An elastic run calls it again after every reset of
    the world, from the last commit, on whatever ranks there are then.
    """

    def __init__(self, config, data, ctx, opts, model, optimizer, checkpoint, callbacks=()):
        self.config, self.data, self.ctx, self.opts = config, data, ctx, opts
        self.model, self.optimizer, self.checkpoint = model, optimizer, checkpoint
        self.hooks = CallbackList(callbacks)
        self.init_digest = weights_digest(model.trainable_variables)
        self.eval_steps = functools.cache(functools.partial(make_eval_step, model))
        self.board = None
        self.valid_counts = {}  # this rank's scored tokens in the last validation, for results.json

    def plan(self):
        """The batch plan of the world as it is now: an elastic reset changes its size."""
        return BatchPlan.from_config(self.config, self.ctx.size)

    def epoch_size(self, global_batch):
        size = ptb_reader.num_steps_per_epoch(len(self.data.train), global_batch, self.config["num_steps"])
        return min(size, self.opts.max_steps_per_epoch) if self.opts.max_steps_per_epoch else size

    def run(self, position):
        """Trains from `position` to the end and returns the results, the same on every rank."""
        ctx, config = self.ctx, self.config
        plan = self.plan()
        position = plan.refit(position, self.epoch_size)
        digests = ctx.allgather_object(
            {"before_broadcast": self.init_digest, "after_broadcast": weights_digest(self.model.trainable_variables)},
            name="init_digests")
        log.info("global batch %d (%d rows x %d ranks, batch_mode=%s), learning rate scale %g, num_steps %d, "
                 "%d steps per epoch", plan.global_batch, plan.rows_per_rank, ctx.size, config["batch_mode"],
                 plan.lr_scale, config["num_steps"], self.epoch_size(plan.global_batch))
        if ctx.is_rank0:
            os.makedirs(self.opts.output_dir, exist_ok=True)
            self._write_metrics(position.metrics)
            if self.board is None:
                self.board = _TensorBoard(os.path.join(self.opts.output_dir, "tensorboard"))
        train_step = make_train_step(self.model, self.optimizer, config, ctx, plan, self.opts.seed,
                                     self.opts.row_groups)
        self.hooks.begin(ctx.rank, ctx.size, position.epoch, position.step)
        # Held through the test evaluation too: a signal after the last step
        # finds no step to stop at, and the run ends as it would have.
        with StopSignals() as signals:
            for epoch in range(position.epoch, config["num_epochs"]):
                position = self._train_epoch(epoch, position, plan, train_step, signals)
            return self._finish(position, plan, digests)

    def _write_metrics(self, metrics):
        # Rewritten whole: an epoch that an elastic reset repeats is not listed twice.
        path = os.path.join(self.opts.output_dir, "metrics.jsonl")
        try:
            atomic_write(path, "".join(json.dumps(m) + "\n" for m in metrics).encode())
        except OSError as err:
            raise OSError(err.errno, f"cannot write {path} ({err.strerror}); it and the last checkpoint are "
                                     "intact: free some space and resume with --resume") from None

    def _save(self, position, best=False):
        self.hooks.before_checkpoint(position.epoch, position.step)
        return self.checkpoint.save(position, best=best, waiting=self.hooks.progress)

    def _train_epoch(self, epoch, position, plan, train_step, signals):
        ctx, config, opts = self.ctx, self.config, self.opts
        num_steps, epochs = config["num_steps"], config["num_epochs"]
        epoch_size = self.epoch_size(plan.global_batch)
        lr = optimization.learning_rate_at_epoch(config["opt"], epoch) * plan.lr_scale
        self.optimizer.learning_rate.assign(lr)
        log.info("epoch %d/%d: learning rate %.6g", epoch + 1, epochs, lr)
        start_step = position.step
        resumed = start_step and position.state is not None
        state = rows_of(position.state, ctx.rank, plan.rows_per_rank) if resumed \
            else self.model.zero_state(plan.rows_per_rank)
        costs = position.costs if start_step else 0.0
        elapsed = position.elapsed if start_step else 0.0
        bar = logs.StepProgress(enabled=ctx.is_rank0)
        tick = time.perf_counter()
        log_every = max(1, epoch_size // 10)
        epoch_t = tf.constant(epoch, tf.int64)
        stop_flags = (tf.constant(0.0), tf.constant(1.0))  # made once, not a tensor per step

        def snapshot(done):  # a collective: it gathers the LSTM state
            return dataclasses.replace(position, epoch=epoch, step=done, state=global_lstm_state(ctx, state),
                                       costs=costs, elapsed=elapsed + time.perf_counter() - tick)

        batches = ptb_reader.ptb_iterator(self.data.train, plan.global_batch, num_steps, ctx.rank, ctx.size)
        for step, (x, y) in enumerate(batches):
            if step >= epoch_size:
                break
            if step < start_step:
                continue
            self.hooks.before_step(epoch, step)
            self.hooks.before_step_collectives(epoch, step)
            loss, state, stop = train_step(x.T, y.T, state, epoch_t, tf.constant(step, tf.int64),
                                           stop_flags[bool(signals.received)])
            loss = float(loss)
            # Past ~709 nats per token the perplexity overflows a float:
            # the model has diverged as surely as with a NaN.
            if not math.isfinite(loss) or loss / num_steps > 700:
                raise TrainingError(
                    f"loss is {loss} at epoch {epoch + 1} step {step + 1} (learning rate {lr:g}): "
                    "lower opt.optimizer.kwargs.learning_rate or check the data")
            costs += loss
            bar.update(epoch + 1, step + 1, epoch_size, math.exp(costs / (step + 1) / num_steps))
            self.hooks.after_step(epoch, step, loss)
            done = step + 1
            if bool(stop):
                path = self._save(snapshot(done))
                raise TrainingInterrupted(
                    f"stopped by signal at epoch {epoch + 1} step {done}; checkpoint {path}. "
                    f"Resume with --resume --output_dir {opts.output_dir}",
                    signals.received or signal.SIGTERM)
            if done % log_every == 0 or done == epoch_size:
                bar.clear()
                log.info("%.3f perplexity: %.3f speed: %.0f wps", done / epoch_size,
                         math.exp(costs / done / num_steps),
                         (done - start_step) * plan.global_batch * num_steps / (time.perf_counter() - tick))
            checkpoint_due = opts.checkpoint_every and done % opts.checkpoint_every == 0
            if done < epoch_size and (self.hooks.snapshot_due(epoch, done) or checkpoint_due):
                mid_epoch = snapshot(done)
                if checkpoint_due:
                    self._save(mid_epoch)
                self.hooks.after_snapshot(mid_epoch)
        seconds = elapsed + time.perf_counter() - tick
        return self._end_epoch(epoch, position, plan, epoch_size, costs / epoch_size, seconds, lr)

    def _end_epoch(self, epoch, position, plan, epoch_size, cost, seconds, lr):
        ctx, config = self.ctx, self.config
        train_ppl = math.exp(cost / config["num_steps"])
        valid_ppl = self._evaluate("valid", epoch, counts=self.valid_counts)
        wps = epoch_size * plan.global_batch * config["num_steps"] / seconds
        record = {"epoch": epoch + 1, "lr": lr, "train_ppl": train_ppl, "valid_ppl": valid_ppl,
                  "epoch_time_s": seconds, "wps": wps, "world_size": ctx.size}
        metrics = [*position.metrics, record]
        log.info("epoch %d/%d: train perplexity %.3f, valid perplexity %.3f, lr %.6g, %.1f s, %.0f wps",
                 epoch + 1, config["num_epochs"], train_ppl, valid_ppl, lr, seconds, wps)
        if ctx.is_rank0:
            self.board.write(record)
            self._write_metrics(metrics)
        best = valid_ppl < position.best_valid
        position = dataclasses.replace(position, epoch=epoch + 1, step=0, state=None, costs=0.0, elapsed=0.0,
                                       metrics=metrics, best_valid=min(valid_ppl, position.best_valid))
        self._save(position, best=best)
        self.hooks.after_snapshot(position)
        return position

    def _evaluate(self, split, epoch, counts=None):
        """The perplexity of `split` after `epoch`."""
        self.hooks.before_evaluation(split, epoch)
        return evaluate(self.model, self.eval_steps, getattr(self.data, split), self.config, self.ctx,
                        self.opts.eval_mode, self.opts.row_groups, counts=counts, progress=self.hooks.progress)

    def _finish(self, position, plan, digests):
        ctx = self.ctx
        test_ppl = self._evaluate("test", self.config["num_epochs"])
        log.info("test perplexity %.3f", test_ppl)
        self.hooks.end()
        final_digests = ctx.allgather_object(weights_digest(self.model.trainable_variables), name="final_digests")
        # Each rank's scored tokens in the last validation (None without one); every rank gathers.
        eval_tokens = ctx.allgather_object(self.valid_counts.get("tokens"), name="eval_tokens")
        return results_record(self.config, self.opts, ctx, self.model, self.data, plan, position.metrics, test_ppl,
                              {"weights_digest_per_rank": final_digests, "init_digests_per_rank": digests,
                               "eval_tokens_per_rank": eval_tokens})
