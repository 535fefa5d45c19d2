"""--row_groups auto: the row groups, and with them the threads per op, that run
this machine's training step fastest; measured once per machine and config, then kept.

One process either splits every op of its step over all its cores (one
group), or runs its rows as G groups side by side with each op on cores / G
threads (runtime/context.py). Which is faster depends on the CPU, its cores
and the step's shapes, so it is measured: each candidate in a fresh process
(TensorFlow fixes its threads when it starts), in alternating rounds, on the
trainer's own step fed random ids. A candidate must beat one group by
MARGIN to be picked, so noise does not flip the choice.

The groups change the order in which the step adds its rows' gradients: one
process with G groups computes what G ranks compute (runtime/reduction.py).
So the choice is made once and kept in RECORD_NAME, in the user's cache
folder, keyed by what decides it: the CPU, the cores, TensorFlow, the fused
kernels' build, the step's shapes and precision. Every later run on the same
machine and config reads the same choice, and the training summary says
what it is and the times it rests on. Remove the record to measure again.

Under a launcher each rank decides before MPI starts, from the launcher's
world and local sizes: its step is its share of the rows on its share of the
host's cores, and that is what is timed (by the first of the host's ranks
to take the record's lock; the others then read it). Each host decides from
its own record, and every rank must run the same groups, so
runtime/job.py compares the choices once the ranks can talk
(mismatch()) and ends the run in one line where they differ.
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import filelock

from core.atomic_files import atomic_write
from core.errors import ERROR_EXIT, USAGE_EXIT, exit_code
from runtime.context import available_cores, elastic_job, launcher_sizes

AUTO = "auto"
RECORD_NAME = "row_groups.json"
# The least gain over one group that picks more groups.
MARGIN = 0.03
ROUNDS = 2
WARMUP_STEPS, WINDOWS, WINDOW_STEPS = 5, 3, 10
# A candidate's whole process, TensorFlow's start included; config_large's steps take seconds.
MEASURE_TIMEOUT_S = 900
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_dir():
    """$XDG_CACHE_HOME/lm_ptb, or ~/.cache/lm_ptb."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lm_ptb")


def candidates(core_count, rows):
    """1, 2, 4, ... groups while each keeps a row: up to the cores, and on two or more cores up to
    twice them. Groups beyond the cores are smaller chains of ops that the threads share out more
    evenly, a core that one group leaves idle taken by another's op, against more ops per step;
    only the measurement says which wins. On one core nothing waits, so one group is all."""
    most = min(rows, core_count if core_count < 2 else 2 * core_count)
    groups, found = 1, []
    while groups <= most:
        found.append(groups)
        groups *= 2
    return found


def _kernels_build():
    """A digest of the fused kernels' libraries: a rebuild may change which candidate wins."""
    digest = hashlib.sha256()
    folder = os.path.join(ROOT, "texar_lite", "kernels")
    for name in sorted(os.listdir(folder)):
        if name.endswith((".so", ".isa")):
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(name.encode() + f.read())
    return digest.hexdigest()[:16]


def record_key(config, core_count, rows):
    """What decides the choice, as a string: the same on every run of this machine and config
    (core_count and rows: a rank's share of the cores and of the batch)."""
    from texar_lite import kernels
    import tensorflow as tf
    cell = config["cell"]
    flags = hashlib.sha256(" ".join(sorted(kernels.cpu_flags())).encode()).hexdigest()[:16]
    return json.dumps({
        "cpu": kernels.cpuinfo_value("model name") or platform.processor(), "flags": flags, "cores": core_count,
        "tensorflow": tf.__version__, "kernels": _kernels_build(),
        "rows": rows, "num_steps": config["num_steps"], "emb": config["emb"]["dim"],
        "units": cell["kwargs"]["num_units"], "layers": cell["num_layers"], "vocab": config["vocab_size"],
        "precision": config["precision"]}, sort_keys=True)


def measure_step(config_name, overrides, row_groups, world_size=1, local_size=1):
    """Median ms of the trainer's step on random ids with `row_groups` groups, as one of
    world_size ranks (its rows) with local_size on its host (its cores); call in a fresh
    process (it sets TensorFlow's threads)."""
    import numpy as np
    import tensorflow as tf

    from runtime import config as config_lib
    from runtime import context, trainer
    from runtime.plan import BatchPlan
    from texar_lite import optimization
    from texar_lite.model import LanguageModel
    context.configure_cpu_threads(local_size=local_size, row_groups=row_groups)
    config = config_lib.load_config(config_name, overrides)
    ctx = context.LocalContext()
    plan = BatchPlan.from_config(config, world_size)
    model = LanguageModel(config, config["vocab_size"], seed=1)
    optimizer = optimization.get_optimizer(config["opt"])
    optimizer.build(model.trainable_variables)
    step = trainer.make_train_step(model, optimizer, config, ctx, plan, seed=1, row_groups=row_groups)
    rng = np.random.default_rng(1)
    state, epoch, no_stop = model.zero_state(plan.rows_per_rank), tf.constant(0, tf.int64), tf.constant(0.0)
    windows = []
    for window in range(WINDOWS + 1):
        start = time.perf_counter()
        count = WARMUP_STEPS if window == 0 else WINDOW_STEPS
        for i in range(count):
            ids = rng.integers(0, config["vocab_size"], size=(config["num_steps"] + 1, plan.rows_per_rank))
            loss, state, _ = step(ids[:-1].astype(np.int32), ids[1:].astype(np.int32), state, epoch,
                                  tf.constant(i, tf.int64), no_stop)
            float(loss)
        if window:
            windows.append((time.perf_counter() - start) * 1e3 / count)
    return statistics.median(windows)


def _measure_in_fresh_process(config_name, overrides, row_groups, sizes=(1, 1)):
    task = json.dumps({"config": config_name, "set": list(overrides), "row_groups": row_groups, "sizes": sizes})
    # In the caller's folder, where a config given as a path is found.
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, "-m", "runtime.tuning", "--measure", task], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2"},
                              timeout=MEASURE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"timing {row_groups} row groups took over {MEASURE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = [line for line in done.stderr.splitlines() if line.strip()][-1:] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"timing {row_groups} row groups failed ({last[0].strip()})")
    return float(done.stdout.strip().splitlines()[-1])


def measure(config_name, overrides, group_counts, sizes=(1, 1), measure_one=_measure_in_fresh_process):
    """{groups: the median of its rounds' ms per step}, the candidates alternating in ROUNDS rounds;
    sizes: (world, local) ranks, as launcher_sizes gives them."""
    times = {groups: [] for groups in group_counts}
    for _ in range(ROUNDS):
        for groups in group_counts:
            times[groups].append(measure_one(config_name, overrides, groups, sizes))
    return {groups: statistics.median(values) for groups, values in times.items()}


def pick(ms_by_groups):
    """The fastest candidate, unless it beats one group by less than MARGIN."""
    fastest = min(ms_by_groups, key=ms_by_groups.get)
    return fastest if ms_by_groups[fastest] <= ms_by_groups[1] * (1 - MARGIN) else 1


def describe(entry, path):
    """The training summary's "row groups" value for a choice read from the record at `path`."""
    if not entry["ms"]:
        return f"1 (--row_groups auto: one core or one row here, so nothing to choose; kept in {path})"
    times = ", ".join(f"{groups}: {ms:.1f} ms" for groups, ms in sorted(
        (int(groups), ms) for groups, ms in entry["ms"].items()))
    return (f"{entry['row_groups']} (--row_groups auto: a step by row groups on this machine, {times}; "
            f"measured {entry['measured']}, kept in {path})")


def resolve(args):
    """Turns --row_groups auto into a number (args.row_groups) and sets the summary's
    reason (args.row_groups_reason): from the record, or measured now and recorded.
    Exits with one line when the record's folder cannot be written or a measurement fails,
    or when a launcher does not say how many ranks share a host."""
    args.row_groups_reason = ""
    if args.row_groups != AUTO:
        return args.row_groups
    from runtime import config as config_lib
    from runtime.cli import error_status
    from runtime.plan import BatchPlan
    sizes = launcher_sizes() if args.distributed else (1, 1)
    why = ("this launcher does not say how many ranks share a host" if sizes is None else
           "an elastic job's hosts come and go" if args.distributed and elastic_job() else None)
    if why:
        sys.exit(error_status(f"--row_groups auto: {why}; give --row_groups a number", USAGE_EXIT))
    try:
        config = config_lib.load_config(args.config, args.set)
        rows = BatchPlan.from_config(config, sizes[0]).rows_per_rank
    except Exception as err:  # the run reports the config's error itself, in its one line
        if exit_code(err) is None:
            raise
        args.row_groups = 1
        return 1
    core_count = max(1, available_cores() // sizes[1])
    key = record_key(config, core_count, rows)
    path = os.path.join(cache_dir(), RECORD_NAME)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        with filelock.FileLock(path + ".lock"):
            entry = _recorded_or_measured(args, config, key, path, core_count, rows, sizes)
    except OSError as err:
        sys.exit(error_status(f"--row_groups auto keeps its measurement in {cache_dir()}, which is not writable "
                              f"({err.strerror}); set XDG_CACHE_HOME to a folder you can write to, or give "
                              "--row_groups a number", USAGE_EXIT))
    except RuntimeError as err:
        sys.exit(error_status(f"--row_groups auto: {err}; give --row_groups a number", ERROR_EXIT))
    args.row_groups, args.row_groups_reason = entry["row_groups"], describe(entry, path)
    return args.row_groups


def _recorded_or_measured(args, config, key, path, core_count, rows, sizes):
    records = _read(path)
    if key in records:
        return records[key]
    group_counts, ms = candidates(core_count, rows), {}
    if len(group_counts) > 1:
        print(f"--row_groups auto: timing {', '.join(map(str, group_counts))} row groups on this machine, once for "
              f"this config ({len(group_counts) * ROUNDS} short runs)", file=sys.stderr, flush=True)
        ms = measure(args.config, args.set, group_counts, sizes)
    entry = {"row_groups": pick(ms) if ms else 1, "ms": {str(groups): round(value, 2) for groups, value in ms.items()},
             "measured": datetime.date.today().isoformat()}
    records[key] = entry
    atomic_write(path, (json.dumps(records, indent=1, sort_keys=True) + "\n").encode())
    return entry


def mismatch(ctx, options):
    """Under a launcher, after --row_groups auto chose on every host: one line naming the ranks'
    choices where they differ, else None. Collective: every rank calls it."""
    if not (ctx.distributed and options.row_groups_reason):
        return None
    chosen = ctx.allgather_object(options.row_groups, name="row_groups_auto")
    if len(set(chosen)) == 1:
        return None
    ranks = ", ".join(f"rank {rank}: {groups}" for rank, groups in enumerate(chosen))
    return (f"--row_groups auto chose differently on the hosts ({ranks}), and every rank must run the same row "
            "groups: give --row_groups a number")


def _read(path):
    """The record's entries; an unreadable record counts as empty and is rewritten whole."""
    try:
        with open(path) as f:
            records = json.load(f)
        return records if isinstance(records, dict) else {}
    except (OSError, ValueError):
        return {}


def main(argv=None):
    parser = argparse.ArgumentParser(description="Times one candidate for --row_groups auto (runtime/tuning.py).")
    parser.add_argument("--measure", required=True, metavar="JSON")
    task = json.loads(parser.parse_args(argv).measure)
    print(f"{measure_step(task['config'], task['set'], task['row_groups'], *task['sizes']):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
