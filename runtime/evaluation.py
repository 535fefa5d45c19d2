"""Perplexity of a split as the training evaluates it: the same bits in any world."""
import math

import tensorflow as tf

import ptb_reader
from runtime import reduction
from texar_lite.losses import token_cross_entropy


def make_eval_step(model, row_groups=1):
    """Summed NLL of a batch (float64) and the new state; time-major ids and row_groups as
    in make_train_step, the groups' sums added as there."""
    reduction.keep_order(row_groups)

    @tf.function(autograph=False)
    def eval_step(inputs, targets, state):
        sums, states = [], []
        for first, last in reduction.row_slices(inputs.shape[1], row_groups):
            logits, group_state = model(inputs[:, first:last], state[:, :, first:last])
            nll = token_cross_entropy(targets[:, first:last], logits, ops=model.ops)
            sums.append(tf.reduce_sum(tf.cast(nll, tf.float64)))
            states.append(group_state)
        return reduction.tree_sum(sums), tf.concat(states, 2)

    return eval_step


def _score(eval_step, model, data, batch_size, num_steps, rank, size, progress):
    """Returns (each batch's summed NLL, token count) of this rank's rows of `data`."""
    state = model.zero_state(batch_size // size)
    sums, tokens = [], 0
    for x, y in ptb_reader.ptb_iterator(data, batch_size, num_steps, rank, size):
        nll, state = eval_step(x.T, y.T, state)
        sums.append(float(nll))
        tokens += y.size
        progress()
    return sums, tokens


def evaluate(model, eval_steps, data, config, ctx, eval_mode, row_groups=1, counts=None, progress=lambda: None):
    """Perplexity of `data` with the config's batch_size and num_steps, the same on every rank.

    eval_steps(groups) is a make_eval_step for that many row groups. Each batch
    is scored in the groups that training splits it into (row_groups on each
    rank), its sums added in runtime/reduction.py's order and the batches'
    in turn, so any world, and one process with as many row groups, logs the
    same bits. A `counts` dict gets "tokens": the tokens this rank scored (in
    rank0 mode all of them on rank 0, 0 elsewhere). `progress()` runs after
    every batch, and on the ranks that wait for rank 0.
    """
    batch, steps = config["batch_size"], config["num_steps"]
    counts = {} if counts is None else counts
    counts["tokens"] = 0
    if eval_mode == "distributed":
        sums, tokens = _score(eval_steps(row_groups), model, data, batch, steps, ctx.rank, ctx.size, progress)
        counts["tokens"] = tokens
        gathered = ctx.allgather_rows(tf.constant([[*sums, float(tokens)]], tf.float64), name="eval_sums")
        summed = reduction.sum_gathered(gathered, ctx.size).numpy()[0]
        return math.exp(math.fsum(summed[:-1].tolist()) / summed[-1])

    def on_rank0():
        sums, tokens = _score(eval_steps(ctx.size * row_groups), model, data, batch, steps, 0, 1, progress)
        counts["tokens"] = tokens
        return math.exp(math.fsum(sums) / tokens)

    return ctx.run_on_rank0(on_rank0, waiting=progress)
