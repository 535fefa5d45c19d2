"""The one training loop: train_and_evaluate(config, data, ctx, options).

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
from texar_lite import optimization
from runtime.checkpointing import TrainCheckpoint
from runtime.config import ConfigError
from runtime.context import weights_digest
from texar_lite.dropout import RowDropout
from runtime.faults import FaultInjector
from texar_lite.losses import loss_name, sequence_sparse_softmax_cross_entropy, token_cross_entropy
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
    output_dir: str = "output"
    seed: int = 1234
    eval_mode: str = "chief"          # chief: rank 0 alone; distributed: each rank a slice
    resume: str = ""                  # "" = fresh start; "latest" or a checkpoint path
    max_steps_per_epoch: int = 0      # 0 = the whole epoch; >0 for smoke tests and benchmarks
    keep_checkpoints: int = 3
    record_step_losses: bool = False  # adds results["step_losses"] (one float per step)
    fault: str = ""                   # fault injection for tests, see runtime/faults.py
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


def make_train_step(model, optimizer, config, ctx, plan, seed):
    variables = model.trainable_variables
    opt_hparams = config["opt"]

    @tf.function
    def train_step(x, y, state, epoch, step, stop_flag):
        inputs, targets = tf.transpose(x), tf.transpose(y)
        dropout = RowDropout(seed, epoch, step, ctx.rank * plan.rows_per_rank, plan.global_batch)
        with tf.GradientTape() as tape:
            logits, new_state = model(inputs, state, dropout)
            summed_loss = sequence_sparse_softmax_cross_entropy(targets, logits, time_major=True,
                                                                average_across_batch=False, device=model.device)
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
    @tf.function
    def eval_step(x, y, state):
        logits, new_state = model(tf.transpose(x), state)
        nll = token_cross_entropy(tf.transpose(y), logits, device=model.device)
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


def evaluate(model, eval_step, data, config, ctx, eval_mode, where="", first=False, counts=None):
    """Perplexity of `data` with the config's batch_size and num_steps, the same on every rank.

    `where` and `first` tell the watchdog what is evaluated, and that the
    first evaluation traces its step. A `counts` dict gets "tokens": the
    tokens this rank scored (in chief mode all of them on rank 0, 0 elsewhere).
    """
    batch, steps = config["batch_size"], config["num_steps"]
    ctx.watch("evaluation", where, slow=first)
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


def train_and_evaluate(config, data, ctx, options=None):
    """Trains config on data (a ptb_reader.PTBData) and returns the results dict.

    Rank 0 also writes output_dir/metrics.jsonl, results.json and checkpoints.
    """
    opts = options or RunOptions()
    plan = check_plan(config, data, ctx.size, opts.eval_mode)
    num_steps, epochs = config["num_steps"], config["num_epochs"]
    epoch_size = ptb_reader.num_steps_per_epoch(len(data.train), plan.global_batch, num_steps)
    if opts.max_steps_per_epoch:
        epoch_size = min(epoch_size, opts.max_steps_per_epoch)
    log.info("global batch %d (%d rows x %d ranks, batch_mode=%s), num_steps %d, %d steps per epoch",
             plan.global_batch, plan.rows_per_rank, ctx.size, config["batch_mode"], num_steps, epoch_size)

    # Different seeds per rank on purpose: only the broadcast below makes the
    # ranks agree, and a test checks that it does.
    model = LanguageModel(config, data.vocab_size, seed=opts.seed + 7919 * ctx.rank, device=opts.device)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    init_digest = weights_digest(model.trainable_variables)

    checkpoint = TrainCheckpoint(model, optimizer, opts.output_dir, ctx, plan, config,
                                 keep=opts.keep_checkpoints, seed=opts.seed)
    progress = checkpoint.restore(opts.resume) if opts.resume else checkpoint.fresh_progress()
    ctx.broadcast_variables(list(model.variables) + list(optimizer.variables))
    digests = ctx.allgather_object(
        {"before_broadcast": init_digest, "after_broadcast": weights_digest(model.trainable_variables)},
        name="init_digests")

    train_step = make_train_step(model, optimizer, config, ctx, plan, opts.seed)
    eval_step = make_eval_step(model)
    faults = FaultInjector(opts.fault, ctx.rank)
    metrics = progress["metrics"]
    board = _TensorBoard(os.path.join(opts.output_dir, "tensorboard")) if ctx.is_chief else None
    bar = logs.StepProgress(enabled=ctx.is_chief)
    step_losses = []
    if ctx.is_chief:
        os.makedirs(opts.output_dir, exist_ok=True)
        ptb_reader.atomic_write(os.path.join(opts.output_dir, "metrics.jsonl"),
                                "".join(json.dumps(m) + "\n" for m in metrics).encode())

    evaluated = False  # the first evaluation traces its step
    valid_counts = {}  # this rank's scored tokens in the last validation, for results.json
    with _Signals() as signals:
        for epoch in range(progress["epoch"], epochs):
            lr = optimization.learning_rate_at_epoch(config["opt"], epoch) * plan.lr_scale
            optimizer.learning_rate.assign(lr)
            log.info("epoch %d/%d: learning rate %.6g", epoch + 1, epochs, lr)
            start_step = progress["step"] if epoch == progress["epoch"] else 0
            state = progress["state"] if start_step else model.zero_state(plan.rows_per_rank)
            costs = progress["costs"] if start_step else 0.0
            elapsed = progress["elapsed"] if start_step else 0.0
            tick = time.perf_counter()
            log_every = max(1, epoch_size // 10)
            epoch_t = tf.constant(epoch, tf.int64)
            batches = ptb_reader.ptb_iterator(data.train, plan.global_batch, num_steps, ctx.rank, ctx.size)
            for step, (x, y) in enumerate(batches):
                if step >= epoch_size:
                    break
                if step < start_step:
                    continue
                faults.maybe_fire(epoch, step)
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
                if opts.record_step_losses:
                    step_losses.append(loss)
                done = step + 1
                if bool(stop):
                    seconds = elapsed + time.perf_counter() - tick
                    path = checkpoint.save(epoch, done, state, costs, seconds, metrics)
                    raise TrainingInterrupted(
                        f"stopped by signal at epoch {epoch + 1} step {done}; checkpoint {path}. "
                        f"Resume with --resume --output_dir {opts.output_dir}",
                        signals.received or signal.SIGTERM)
                if done % log_every == 0 or done == epoch_size:
                    bar.clear()
                    seconds = elapsed + time.perf_counter() - tick
                    log.info("%.3f perplexity: %.3f speed: %.0f wps", done / epoch_size,
                             math.exp(costs / done / num_steps),
                             (done - start_step) * plan.global_batch * num_steps / (time.perf_counter() - tick))
            seconds = elapsed + time.perf_counter() - tick
            train_ppl = math.exp(costs / epoch_size / num_steps)
            valid_ppl = evaluate(model, eval_step, data.valid, config, ctx, opts.eval_mode,
                                 f"valid, epoch {epoch + 1}", first=not evaluated, counts=valid_counts)
            evaluated = True
            wps = epoch_size * plan.global_batch * num_steps / seconds
            record = {"epoch": epoch + 1, "lr": lr, "train_ppl": train_ppl, "valid_ppl": valid_ppl,
                      "epoch_time_s": seconds, "wps": wps, "world_size": ctx.size}
            metrics.append(record)
            if board:
                board.write(record)
            log.info("epoch %d/%d: train perplexity %.3f, valid perplexity %.3f, lr %.6g, %.1f s, %.0f wps",
                     epoch + 1, epochs, train_ppl, valid_ppl, lr, seconds, wps)
            if ctx.is_chief:
                with open(os.path.join(opts.output_dir, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps(record) + "\n")
            checkpoint.save(epoch + 1, 0, None, 0.0, 0.0, metrics, valid_ppl=valid_ppl)
            progress = checkpoint.fresh_progress()

    test_ppl = evaluate(model, eval_step, data.test, config, ctx, opts.eval_mode, "test", first=not evaluated)
    log.info("test perplexity %.3f", test_ppl)
    ctx.watch("finishing")
    final_digests = ctx.allgather_object(weights_digest(model.trainable_variables), name="final_digests")
    results = {
        "config": config.get("name", "config"),
        "epochs": len(metrics),
        "train_ppl": metrics[-1]["train_ppl"] if metrics else None,
        "valid_ppl": metrics[-1]["valid_ppl"] if metrics else None,
        "test_ppl": test_ppl,
        "avg_epoch_time_s": float(np.mean([m["epoch_time_s"] for m in metrics])) if metrics else None,
        "wps": float(np.mean([m["wps"] for m in metrics])) if metrics else None,
        "world_size": ctx.size,
        "global_batch_size": plan.global_batch,
        "seed": opts.seed,
        "lstm_cell": model.decoder.cell.name,
        "softmax_loss": loss_name(opts.device),
        # Lets generate.py and score.py notice a data_path with other words.
        "vocab_sha256": ptb_reader.vocab_sha256(data.vocab),
        "learning_rate_scale": plan.lr_scale,
        "versions": versions(ctx),
        "weights_digest_per_rank": final_digests,
        "init_digests_per_rank": digests,
        "eval_mode": opts.eval_mode,
        "sparse_as_dense": bool(getattr(ctx, "sparse_as_dense", False)),
        # Each rank's scored tokens in the last validation (None without one); every rank gathers.
        "eval_tokens_per_rank": ctx.allgather_object(valid_counts.get("tokens"), name="eval_tokens"),
        "hparams": {k: v for k, v in config.items() if k != "name"},
    }
    if opts.record_step_losses:
        results["step_losses"] = step_losses
    if ctx.is_chief:
        ptb_reader.atomic_write(os.path.join(opts.output_dir, "results.json"),
                                (json.dumps(results, indent=2) + "\n").encode())
    return results
