"""The one training loop: train_and_evaluate(config, data, ctx, options, callbacks).

lm_ptb.py and lm_ptb_distributed.py both call it; they differ only in `ctx`
(runtime/context.py), which is where every rank-dependent decision lives.
"""
import dataclasses
import json
import logging
import math
import os
import platform
import signal
import time

import numpy as np
import tensorflow as tf

import ptb_reader
from runtime import logs
from runtime.atomic_files import atomic_write
from texar_lite import optimization
from runtime.checkpointing import CheckpointError, TrainCheckpoint, global_lstm_state
from runtime.config import ConfigError
from runtime.context import weights_digest
from texar_lite.dropout import RowDropout
from texar_lite.losses import sequence_sparse_softmax_cross_entropy, token_cross_entropy
from texar_lite.model import LanguageModel

log = logging.getLogger("lm_ptb")


class TrainingError(RuntimeError):
    """Training cannot go on (a NaN loss, say); the message names the step."""


class TrainingInterrupted(RuntimeError):
    """A SIGTERM or SIGINT reached some rank; a checkpoint was saved."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


@dataclasses.dataclass
class RunOptions:
    """How to run, beside the config. These defaults are the command line's too (runtime/cli.py)."""
    output_dir: str = "./output"
    seed: int = 1234
    eval_mode: str = "chief"          # chief: rank 0 alone; distributed: each rank a slice
    resume: str = ""                  # "" = fresh start; "latest" or a checkpoint path
    max_steps_per_epoch: int = 0      # 0 = the whole epoch; >0 for smoke tests and benchmarks
    keep_checkpoints: int = 3
    checkpoint_every: int = 0         # also save a checkpoint every N steps inside an epoch (0 = at epoch ends only)
    commit_every: int = 20            # elastic runs: commit the state every N steps (runtime/elastic.py)
    device: str = "CPU"               # "CPU" or "GPU:0": picks the cell and loss (texar_lite/op_selection.py)


@dataclasses.dataclass
class BatchPlan:
    """How the configured batch maps onto ranks, and the learning-rate scale."""
    rows_per_rank: int
    global_batch: int
    lr_scale: float

    @classmethod
    def from_config(cls, config, size):
        batch, mode = config["batch_size"], config["batch_mode"]
        scale_mode = config["learning_rate"]["scale_by_worker"]
        if scale_mode == "auto":
            scale_mode = "linear" if mode == "per_worker" else "none"
        if mode == "per_worker":
            return cls(batch, batch * size, optimization.worker_lr_scale(scale_mode, size))
        if batch % size:
            raise ConfigError(
                f"batch_size {batch} is not divisible by {size} ranks: use a batch_size that is a "
                f"multiple of the world size, or --set batch_mode=per_worker")
        return cls(batch // size, batch, optimization.worker_lr_scale(scale_mode, size))


def check_plan(config, data, size, eval_mode):
    """Returns the BatchPlan, or raises the error a user can fix, before any training."""
    plan = BatchPlan.from_config(config, size)
    if eval_mode == "distributed" and config["batch_size"] % size:
        raise ConfigError(
            f"--eval_mode distributed splits batch_size {config['batch_size']} over {size} ranks: "
            "it must divide evenly; use --eval_mode chief")
    for split, batch in (("train", plan.global_batch), ("valid", config["batch_size"]),
                         ("test", config["batch_size"])):
        try:  # fail now, not at the first evaluation
            next(ptb_reader.ptb_iterator(getattr(data, split), batch, config["num_steps"]))
        except ptb_reader.PTBDataError as err:
            raise ptb_reader.PTBDataError(f"ptb.{split}.txt: {err}") from None
    return plan


class _Signals:
    """Turns SIGTERM, SIGINT or SIGUSR1 into a flag that the ranks agree on at the next step.

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
# function they call, Horovod's tape and collectives included: that costs each
# rank of a 2-rank run about 4 s of CPU at its first step (tests/test_op_selection.py checks
# that the graph is unchanged).
def make_train_step(model, optimizer, config, ctx, plan, seed):
    variables = model.trainable_variables
    opt_hparams = config["opt"]

    @tf.function(autograph=False)
    def train_step(x, y, state, epoch, step, stop_flag):
        inputs, targets = tf.transpose(x), tf.transpose(y)
        dropout = RowDropout(seed, epoch, step, ctx.rank * plan.rows_per_rank, plan.global_batch)
        with tf.GradientTape() as tape:
            logits, new_state = model(inputs, state, dropout)
            summed_loss = sequence_sparse_softmax_cross_entropy(targets, logits, time_major=True,
                                                                average_across_batch=False, ops=model.ops)
        tape = ctx.wrap_tape(tape)
        grads = tape.gradient(summed_loss, variables)
        # Texar's loss averages over the batch; the 1/rows joins the update.
        optimization.clip_and_apply(optimizer, grads, variables, opt_hparams, scale=1.0 / plan.rows_per_rank)
        loss = summed_loss / plan.rows_per_rank
        # One small allreduce gives every rank the global loss and tells it
        # whether any rank wants to stop, so all ranks decide alike.
        shared = ctx.allreduce(tf.stack([loss, stop_flag]), op="mean", name="loss_and_stop")
        return shared[0], new_state, shared[1] > 0

    return train_step


def make_eval_step(model):
    @tf.function(autograph=False)
    def eval_step(x, y, state):
        logits, new_state = model(tf.transpose(x), state)
        nll = token_cross_entropy(tf.transpose(y), logits, ops=model.ops)
        return tf.reduce_sum(tf.cast(nll, tf.float64)), new_state

    return eval_step


def _score(eval_step, model, data, batch_size, num_steps, rank, size, beat):
    """Returns (summed NLL, token count) of this rank's rows of `data`."""
    state = model.zero_state(batch_size // size)
    total, tokens = 0.0, 0
    for x, y in ptb_reader.ptb_iterator(data, batch_size, num_steps, rank, size):
        nll, state = eval_step(x, y, state)
        total += float(nll)
        tokens += y.size
        beat()
    return total, tokens


def evaluate(model, eval_step, data, config, ctx, eval_mode, counts=None):
    """Perplexity of `data` with the config's batch_size and num_steps, the same on every rank.

    A `counts` dict gets "tokens": the tokens this rank scored (in chief mode
    all of them on rank 0, 0 elsewhere).
    """
    batch, steps = config["batch_size"], config["num_steps"]
    counts = {} if counts is None else counts
    counts["tokens"] = 0
    if eval_mode == "distributed":
        nll, tokens = _score(eval_step, model, data, batch, steps, ctx.rank, ctx.size, ctx.beat)
        counts["tokens"] = tokens
        summed = ctx.allreduce(tf.constant([nll, float(tokens)], tf.float64), op="sum", name="eval_sums")
        return math.exp(float(summed[0]) / float(summed[1]))

    def on_chief():
        nll, tokens = _score(eval_step, model, data, batch, steps, 0, 1, ctx.beat)
        counts["tokens"] = tokens
        return math.exp(nll / tokens)

    return ctx.run_on_chief(on_chief)


def versions(ctx):
    return {"tensorflow": tf.__version__, "python": platform.python_version(), **ctx.versions()}


def rows_of(global_state, rank, rows):
    """This rank's rows of the global [L, 2, B, H] LSTM state."""
    return tf.constant(global_state[:, :, rank * rows:(rank + 1) * rows])


def train_and_evaluate(config, data, ctx, options=None, callbacks=()):
    """Trains config on data (a ptb_reader.PTBData) and returns the results dict.

    Rank 0 also writes output_dir/metrics.jsonl, results.json and checkpoints.
    `callbacks` (runtime/callbacks.py) run inside the loop, on every rank.
    """
    opts = options or RunOptions()
    plan = check_plan(config, data, ctx.size, opts.eval_mode)
    # Different seeds per rank on purpose: only rank 0's start, shared by the
    # context, makes the ranks agree, and a test checks that it does.
    model = LanguageModel(config, data.vocab_size, seed=opts.seed + 7919 * ctx.rank, device=opts.device)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    checkpoint = TrainCheckpoint(model, optimizer, opts.output_dir, ctx, config, keep=opts.keep_checkpoints,
                                 seed=opts.seed)
    loop = TrainingLoop(config, data, ctx, opts, model, optimizer, checkpoint, callbacks)
    start = checkpoint.initial_position(opts.resume, plan.global_batch)
    results = ctx.train(loop.run, list(model.variables) + list(optimizer.variables), start)
    if ctx.is_chief:
        atomic_write(os.path.join(opts.output_dir, "results.json"), (json.dumps(results, indent=2) + "\n").encode())
    return results


class TrainingLoop:
    """From a position (a checkpoint's content) to the results, in named steps.

    `run` is one attempt. An elastic run calls it again after every reset of
    the world, from the last commit, on whatever ranks there are then.
    """

    def __init__(self, config, data, ctx, opts, model, optimizer, checkpoint, callbacks=()):
        self.config, self.data, self.ctx, self.opts = config, data, ctx, opts
        self.model, self.optimizer, self.checkpoint = model, optimizer, checkpoint
        self.callbacks = list(callbacks)
        self.init_digest = weights_digest(model.trainable_variables)
        self.eval_step = make_eval_step(model)
        self.board = None
        self.evaluated = False  # the first evaluation traces its step
        self.valid_counts = {}  # this rank's scored tokens in the last validation, for results.json

    def epoch_size(self, global_batch):
        size = ptb_reader.num_steps_per_epoch(len(self.data.train), global_batch, self.config["num_steps"])
        return min(size, self.opts.max_steps_per_epoch) if self.opts.max_steps_per_epoch else size

    def run(self, position, commit=None):
        """Trains from `position` to the end and returns the results, the same
        on every rank. `commit(position)` is called at every commit point
        (elastic runs only)."""
        if "error" in position:
            raise CheckpointError(position["error"])
        ctx, config = self.ctx, self.config
        plan = BatchPlan.from_config(config, ctx.size)
        position = self._fit(position, plan)
        digests = ctx.allgather_object(
            {"before_broadcast": self.init_digest, "after_broadcast": weights_digest(self.model.trainable_variables)},
            name="init_digests")
        log.info("global batch %d (%d rows x %d ranks, batch_mode=%s), num_steps %d, %d steps per epoch",
                 plan.global_batch, plan.rows_per_rank, ctx.size, config["batch_mode"], config["num_steps"],
                 self.epoch_size(plan.global_batch))
        if commit is not None:
            log.info("elastic: %d ranks from epoch %d step %d, learning rate scale %g; a commit every %d steps",
                     ctx.size, position["epoch"] + 1, position["step"], plan.lr_scale, self.opts.commit_every)
        if ctx.is_chief:
            os.makedirs(self.opts.output_dir, exist_ok=True)
            self._write_metrics(position["metrics"])
            if self.board is None:
                self.board = _TensorBoard(os.path.join(self.opts.output_dir, "tensorboard"))
        train_step = make_train_step(self.model, self.optimizer, config, ctx, plan, self.opts.seed)
        for callback in self.callbacks:
            callback.begin(ctx.rank, ctx.size, position["epoch"], position["step"])
        # Held through the test evaluation too: a signal after the last step
        # finds no step to stop at, and the run ends as it would have.
        with _Signals() as signals:
            for epoch in range(position["epoch"], config["num_epochs"]):
                position = self._train_epoch(epoch, position, plan, train_step, signals, commit)
            return self._finish(position, plan, digests)

    def _fit(self, position, plan):
        """The position for this world's global batch. Only batch_mode=per_worker
        changes it with the world size (an elastic reset): the epoch goes on at
        the same fraction of the data, from a zero LSTM state."""
        if position["global_batch"] == plan.global_batch:
            return position
        old, new = self.epoch_size(position["global_batch"]), self.epoch_size(plan.global_batch)
        step = position["step"] * new // old
        log.info("batch_mode=per_worker: the global batch is now %d (%d ranks); epoch %d goes on at step %d of %d "
                 "from a zero LSTM state", plan.global_batch, self.ctx.size, position["epoch"] + 1, step, new)
        costs = position["costs"] * step / position["step"] if position["step"] else 0.0
        return dict(position, step=step, state=None, costs=costs, global_batch=plan.global_batch)

    def _write_metrics(self, metrics):
        # Rewritten whole: an epoch that an elastic reset repeats is not listed twice.
        path = os.path.join(self.opts.output_dir, "metrics.jsonl")
        try:
            atomic_write(path, "".join(json.dumps(m) + "\n" for m in metrics).encode())
        except OSError as err:
            raise OSError(err.errno, f"cannot write {path} ({err.strerror}); it and the last checkpoint are "
                                     "intact: free some space and resume with --resume") from None

    def _snapshot(self, position, epoch, step, state, costs, seconds):
        """The position after `step` steps of `epoch` (a collective: it gathers the LSTM state)."""
        return dict(position, epoch=epoch, step=step, state=global_lstm_state(self.ctx, state),
                    costs=costs, elapsed=seconds)

    def _train_epoch(self, epoch, position, plan, train_step, signals, commit):
        ctx, config, opts = self.ctx, self.config, self.opts
        num_steps, epochs = config["num_steps"], config["num_epochs"]
        epoch_size = self.epoch_size(plan.global_batch)
        lr = optimization.learning_rate_at_epoch(config["opt"], epoch) * plan.lr_scale
        self.optimizer.learning_rate.assign(lr)
        log.info("epoch %d/%d: learning rate %.6g", epoch + 1, epochs, lr)
        start_step = position["step"]
        resumed = start_step and position["state"] is not None
        state = rows_of(position["state"], ctx.rank, plan.rows_per_rank) if resumed \
            else self.model.zero_state(plan.rows_per_rank)
        costs = position["costs"] if start_step else 0.0
        elapsed = position["elapsed"] if start_step else 0.0
        bar = logs.StepProgress(enabled=ctx.is_chief)
        tick = time.perf_counter()
        log_every = max(1, epoch_size // 10)
        every = [n for n in (opts.checkpoint_every, opts.commit_every if commit else 0) if n]
        epoch_t = tf.constant(epoch, tf.int64)
        batches = ptb_reader.ptb_iterator(self.data.train, plan.global_batch, num_steps, ctx.rank, ctx.size)
        for step, (x, y) in enumerate(batches):
            if step >= epoch_size:
                break
            if step < start_step:
                continue
            for callback in self.callbacks:
                callback.before_step(epoch, step)
            # Just before the step's collectives: a rank stuck in anything
            # before them falls behind the others it keeps waiting.
            ctx.watch("training step", f"epoch {epoch + 1}, step {step + 1}", slow=step == start_step)
            loss, state, stop = train_step(x, y, state, epoch_t, tf.constant(step, tf.int64),
                                           tf.constant(1.0 if signals.received else 0.0))
            loss = float(loss)
            # Past ~709 nats per token the perplexity overflows a float:
            # the model has diverged as surely as with a NaN.
            if not math.isfinite(loss) or loss / num_steps > 700:
                raise TrainingError(
                    f"loss is {loss} at epoch {epoch + 1} step {step + 1} (learning rate {lr:g}): "
                    "lower opt.optimizer.kwargs.learning_rate or check the data")
            costs += loss
            bar.update(epoch + 1, step + 1, epoch_size, math.exp(costs / (step + 1) / num_steps))
            for callback in self.callbacks:
                callback.after_step(epoch, step, loss)
            done = step + 1
            if bool(stop):
                seconds = elapsed + time.perf_counter() - tick
                path = self.checkpoint.save(self._snapshot(position, epoch, done, state, costs, seconds))
                raise TrainingInterrupted(
                    f"stopped by signal at epoch {epoch + 1} step {done}; checkpoint {path}. "
                    f"Resume with --resume --output_dir {opts.output_dir}",
                    signals.received or signal.SIGTERM)
            if done % log_every == 0 or done == epoch_size:
                bar.clear()
                log.info("%.3f perplexity: %.3f speed: %.0f wps", done / epoch_size,
                         math.exp(costs / done / num_steps),
                         (done - start_step) * plan.global_batch * num_steps / (time.perf_counter() - tick))
            if done < epoch_size and any(done % n == 0 for n in every):
                snapshot = self._snapshot(position, epoch, done, state, costs, elapsed + time.perf_counter() - tick)
                if opts.checkpoint_every and done % opts.checkpoint_every == 0:
                    self.checkpoint.save(snapshot)
                if commit and done % opts.commit_every == 0:
                    commit(snapshot)
        seconds = elapsed + time.perf_counter() - tick
        return self._end_epoch(epoch, position, plan, costs / epoch_size, seconds, lr, commit)

    def _end_epoch(self, epoch, position, plan, cost, seconds, lr, commit):
        ctx, config = self.ctx, self.config
        epoch_size = self.epoch_size(plan.global_batch)
        train_ppl = math.exp(cost / config["num_steps"])
        valid_ppl = self._evaluate("valid", epoch, counts=self.valid_counts)
        wps = epoch_size * plan.global_batch * config["num_steps"] / seconds
        record = {"epoch": epoch + 1, "lr": lr, "train_ppl": train_ppl, "valid_ppl": valid_ppl,
                  "epoch_time_s": seconds, "wps": wps, "world_size": ctx.size}
        metrics = [*position["metrics"], record]
        log.info("epoch %d/%d: train perplexity %.3f, valid perplexity %.3f, lr %.6g, %.1f s, %.0f wps",
                 epoch + 1, config["num_epochs"], train_ppl, valid_ppl, lr, seconds, wps)
        if ctx.is_chief:
            self.board.write(record)
            self._write_metrics(metrics)
        best = valid_ppl < position["best_valid"]
        position = dict(position, epoch=epoch + 1, step=0, state=None, costs=0.0, elapsed=0.0, metrics=metrics,
                        best_valid=min(valid_ppl, position["best_valid"]))
        self.checkpoint.save(position, best=best)
        if commit:
            commit(position)
        return position

    def _evaluate(self, split, epoch, counts=None):
        """The perplexity of `split` after `epoch`; the first evaluation traces its step."""
        self.ctx.watch("evaluation", f"valid, epoch {epoch + 1}" if split == "valid" else split,
                       slow=not self.evaluated)
        for callback in self.callbacks:
            callback.before_evaluation(split, epoch)
        ppl = evaluate(self.model, self.eval_step, getattr(self.data, split), self.config, self.ctx,
                       self.opts.eval_mode, counts=counts)
        self.evaluated = True
        return ppl

    def _finish(self, position, plan, digests):
        ctx, config, opts = self.ctx, self.config, self.opts
        metrics = position["metrics"]
        test_ppl = self._evaluate("test", config["num_epochs"])
        log.info("test perplexity %.3f", test_ppl)
        ctx.watch("finishing")
        final_digests = ctx.allgather_object(weights_digest(self.model.trainable_variables), name="final_digests")
        results = {
            "config": config.name,
            "epochs": len(metrics),
            "train_ppl": metrics[-1]["train_ppl"] if metrics else None,
            "valid_ppl": metrics[-1]["valid_ppl"] if metrics else None,
            "test_ppl": test_ppl,
            "avg_epoch_time_s": float(np.mean([m["epoch_time_s"] for m in metrics])) if metrics else None,
            "wps": float(np.mean([m["wps"] for m in metrics])) if metrics else None,
            "world_size": ctx.size,
            "global_batch_size": plan.global_batch,
            "seed": opts.seed,
            "lstm_cell": self.model.ops.cell,
            "softmax_loss": self.model.ops.loss,
            # Lets generate.py and score.py notice a data_path with other words.
            "vocab_sha256": ptb_reader.vocab_sha256(self.data.vocab),
            "learning_rate_scale": plan.lr_scale,
            "versions": versions(ctx),
            "weights_digest_per_rank": final_digests,
            "init_digests_per_rank": digests,
            "eval_mode": opts.eval_mode,
            "sparse_as_dense": bool(getattr(ctx, "sparse_as_dense", False)),
            # Each rank's scored tokens in the last validation (None without one); every rank gathers.
            "eval_tokens_per_rank": ctx.allgather_object(self.valid_counts.get("tokens"), name="eval_tokens"),
            "hparams": {k: v for k, v in config.todict().items() if k != "name"},
        }
        return results
