"""What an elastic commit costs beside a training step: the table behind --commit_every's default.

    .venv/bin/python scripts/commit_cost.py [--configs config_small config_medium] [--steps 20]

A commit (runtime/elastic.py) copies every variable to host memory, deep-copies
the position (the global LSTM state included), and broadcasts the host-update
flags. Both are timed here in one process (Horovod's world of one), on the
real-PTB vocabulary size, as medians over repeats.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from runtime import config as config_lib  # noqa: E402
from runtime.checkpointing import Position, global_lstm_state  # noqa: E402
from runtime.context import LocalContext, configure_cpu_threads  # noqa: E402
from runtime.plan import BatchPlan  # noqa: E402
from runtime.trainer import make_train_step  # noqa: E402
from texar_lite import optimization  # noqa: E402
from texar_lite.model import LanguageModel  # noqa: E402

VOCAB = 10000


def median_ms(call, repeats, warmup=2):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(config_name, steps, hvd):
    from faults.elastic import TrainingState
    config = config_lib.load_config(config_name, [])
    ctx = LocalContext()
    plan = BatchPlan.from_config(config, 1)
    model = LanguageModel(config, VOCAB, seed=1)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    train_step = make_train_step(model, optimizer, config, ctx, plan, seed=1)
    rng = np.random.default_rng(1)
    shape = (config["num_steps"], plan.rows_per_rank)  # time-major
    x, y = rng.integers(0, VOCAB, shape), rng.integers(0, VOCAB, shape)
    state = model.zero_state(plan.rows_per_rank)
    zero = tf.constant(0, tf.int64)

    def step():
        train_step(x, y, state, zero, zero, tf.constant(0.0))[0].numpy()

    step_ms = median_ms(step, steps)
    variables = list(model.variables) + list(optimizer.variables)
    training_state = TrainingState(hvd, variables, Position(plan.global_batch))
    position = Position(plan.global_batch, step=1, state=global_lstm_state(ctx, state))
    commit_ms = median_ms(lambda: training_state.commit_position(position), max(5, steps // 2))
    megabytes = sum(int(np.prod(v.shape)) * v.dtype.size for v in variables) / 1e6
    return {"config": config_name, "step_ms": step_ms, "commit_ms": commit_ms, "state_mb": megabytes}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["config_small", "config_medium"])
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per config")
    args = parser.parse_args(argv)
    configure_cpu_threads(local_size=1)
    import horovod.tensorflow as hvd
    hvd.init()
    print("| config | state (MB) | step (ms) | commit (ms) | overhead, a commit every 1 / 10 / 20 / 50 steps |")
    print("|---|---:|---:|---:|---|")
    for name in args.configs:
        row = measure(name, args.steps, hvd)
        share = [row["commit_ms"] / (every * row["step_ms"] + row["commit_ms"]) for every in (1, 10, 20, 50)]
        print(f"| {name} | {row['state_mb']:.0f} | {row['step_ms']:.0f} | {row['commit_ms']:.1f} | "
              + " / ".join(f"{100 * s:.1f}%" for s in share) + " |", flush=True)


if __name__ == "__main__":
    main()
